"""Tokenisation and vocabularies shared by every encoder.

Text is hostile input: it is capped in characters and tokens before it reaches a tensor, and
control characters are treated as whitespace.
"""
from __future__ import annotations

import json
import os
import re
import unicodedata
from collections import Counter
from functools import lru_cache
from typing import Iterable

MAX_CHARS = 5000        # longer sentences are cut before tokenising (a 100k-char line costs nothing)
MAX_TOKENS = 100        # and then to this many tokens

PAD, UNK = "<pad>", "<unk>"
_TOKEN = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def tokenize(sentence: str, max_tokens: int = MAX_TOKENS) -> list[str]:
    """Lower-cased words and punctuation marks (the papers train on lower-cased tokenised text)."""
    text = unicodedata.normalize("NFKC", sentence[:MAX_CHARS]).lower()
    return _TOKEN.findall(_CONTROL.sub(" ", text))[:max_tokens]


@lru_cache(maxsize=500_000)   # words repeat (Zipf): most lookups hit the cache
def char_trigrams(word: str) -> tuple[str, ...]:
    """Character trigrams of '#word#' (boundary marks make prefixes and suffixes distinct)."""
    w = f"#{word}#"
    return tuple(w[i:i + 3] for i in range(len(w) - 2))


def sentence_trigrams(tokens: list[str]) -> list[str]:
    return [g for t in tokens for g in char_trigrams(t)]


class Vocabulary:
    """Index 0 is padding, 1 the unknown symbol; the rest by descending count, then alphabetically."""

    def __init__(self, items: list[str]):
        if items[:2] != [PAD, UNK]:
            raise ValueError("a vocabulary starts with <pad>, <unk>")
        if len(set(items)) != len(items):
            raise ValueError("vocabulary items are not unique")
        self.items = list(items)
        self.index = {w: i for i, w in enumerate(self.items)}

    @classmethod
    def build(cls, counts: Counter, min_count: int = 1, max_size: int | None = None) -> "Vocabulary":
        kept = sorted((w for w, c in counts.items() if c >= min_count and w not in (PAD, UNK)),
                      key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[:max(0, max_size - 2)]
        return cls([PAD, UNK, *kept])

    def __len__(self) -> int:
        return len(self.items)

    def ids(self, tokens: Iterable[str]) -> list[int]:
        """Token ids; words below the minimum count map to <unk> (one learned vector)."""
        get = self.index.get
        return [get(t, 1) for t in tokens]

    def to_json(self) -> str:
        return json.dumps(self.items, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "Vocabulary":
        items = json.loads(text)
        if not isinstance(items, list) or not all(isinstance(w, str) for w in items):
            raise ValueError("vocabulary file must be a JSON list of strings")
        return cls(items)


def surface_variants(word: str) -> list[str]:
    """Forms of a banned word to block: as written, lower-cased and capitalised."""
    forms = [word, word.lower(), word[:1].upper() + word[1:].lower()]
    return list(dict.fromkeys(forms))


def load_sentencepiece(path: str, what: str = "sentencepiece model"):
    """A sentencepiece processor for the model file PATH; ValueError naming PATH (one line) when
    the file is not one (sentencepiece's own error is a multi-line C++ message)."""
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=path)
    except (RuntimeError, OSError) as exc:
        raise ValueError(f"{path}: not a {what} ({str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''})") \
            from None


def train_spm(texts: list[str], prefix: str, vocab_size: int) -> str:
    """Joint unigram sentencepiece model at PREFIX.model / PREFIX.vocab.

    A vocabulary larger than a tiny corpus supports shrinks (hard_vocab_limit=False); one smaller
    than the corpus's character set grows to the smallest size sentencepiece accepts."""
    import sentencepiece as spm

    path = prefix + ".train.txt"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in texts)
    try:
        for _attempt in range(2):
            try:
                spm.SentencePieceTrainer.train(input=path, model_prefix=prefix, vocab_size=vocab_size,
                                               model_type="unigram", character_coverage=1.0,
                                               hard_vocab_limit=False, minloglevel=2,
                                               num_threads=1)  # one thread: deterministic
                break
            except RuntimeError as e:
                need = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(e))
                if not need or _attempt:
                    raise
                print(f"      vocab_size {vocab_size} is below the {need.group(1)} characters and meta "
                      f"pieces of the corpus; using {int(need.group(1)) + 8}", flush=True)
                vocab_size = int(need.group(1)) + 8
    finally:
        os.remove(path)
    return prefix + ".model"
