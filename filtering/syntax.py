"""Syntactic diversity: tree edit distance between the top levels of two constituency parses.

Parser: link-grammar (Debian packages ``link-grammar`` and ``python3-link-grammar``; see
scripts/install_parser.sh), which prints constituent trees. Distance: APTED (Pawlik & Augsten)
with unit costs, from the ``apted`` package.
"""
from __future__ import annotations

import glob
import importlib
import os
import sys
from functools import lru_cache

Tree = tuple  # (label, (child, child, ...))

_DEBIAN_DIRS = ["/usr/lib/python3/dist-packages"]


def _import_linkgrammar():
    """linkgrammar from the environment, else from Debian's python3-link-grammar (built for the
    same Python minor version). Only that one package is imported from the Debian directory."""
    try:
        return importlib.import_module("linkgrammar")
    except ImportError:
        pass
    for d in _DEBIAN_DIRS:
        tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
        if glob.glob(os.path.join(d, "linkgrammar", f"_clinkgrammar.{tag}*.so")):
            sys.path.insert(0, d)
            try:
                return importlib.import_module("linkgrammar")
            finally:
                sys.path.remove(d)
    raise ImportError("the tree_edit filter needs link-grammar: run scripts/install_parser.sh "
                      "(apt-get install link-grammar python3-link-grammar)")


def parse_bracketed(text: str) -> Tree:
    """'(S (NP a man.n) (VP runs.v) .)' -> ('S', (('NP', (('a', ()), ...)), ...)); words are leaves."""
    tokens = text.replace("(", " ( ").replace(")", " ) ").split()
    pos = 0

    def node():
        nonlocal pos
        if tokens[pos] != "(":
            tok = tokens[pos]
            pos += 1
            return (tok, ())
        pos += 1
        label = tokens[pos]
        pos += 1
        children = []
        while tokens[pos] != ")":
            children.append(node())
        pos += 1
        return (label, tuple(children))

    tree = node()
    if pos != len(tokens):
        raise ValueError("trailing text after the tree")
    return tree


def top_levels(tree: Tree, levels: int) -> Tree:
    """The tree cut to its first LEVELS levels of constituents; words (leaves) are dropped, as the
    diversity measure compares structure, not wording."""
    label, children = tree
    if levels <= 1:
        return (label, ())
    return (label, tuple(top_levels(c, levels - 1) for c in children if c[1]))


def tree_edit_distance(a: Tree, b: Tree) -> int:
    from apted import APTED, Config

    class _Cfg(Config):
        def rename(self, n1, n2):
            return int(n1[0] != n2[0])

        def children(self, node):
            return list(node[1])

    return int(APTED(a, b, _Cfg()).compute_edit_distance())


class Parser:
    def __init__(self, max_words: int = 60):
        lg = _import_linkgrammar()
        self._lg = lg
        self._dict = lg.Dictionary("en")
        # Null links let the parser skip words it cannot attach: back-translations are often a
        # little ungrammatical, and without them about half get no parse at all.
        self._opts = lg.ParseOptions(verbosity=0, max_parse_time=2, min_null_count=0,
                                     max_null_count=max_words)
        self.max_words = max_words
        self.parse = lru_cache(maxsize=100_000)(self._parse)    # references repeat across ranks

    def _parse(self, sentence: str) -> Tree | None:
        """Constituency tree of SENTENCE, or None when it is empty, too long or has no linkage."""
        words = sentence.split()
        if not words or len(words) > self.max_words:
            return None
        try:
            linkages = self._lg.Sentence(" ".join(words), self._dict, self._opts).parse()
            linkage = next(iter(linkages), None)
            if linkage is None:
                return None
            return parse_bracketed(linkage.constituent_tree())
        except Exception:   # link-grammar raises its own error types on odd input; no tree then
            return None
