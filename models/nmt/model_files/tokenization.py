"""fairseq hub's text pipeline for one model direction: the pieces a model's dictionary sees for
a text, and the text fairseq makes of a hypothesis's pieces.

String for string what fairseq/hub_utils.py's GeneratorHubInterface does with fairseq's own
encoders (fairseq/data/encoders/)::

    encode: tokenize (Moses, the side's language) -> apply BPE -> split on whitespace (binarize)
    decode: join with spaces (Dictionary.string) -> remove BPE -> detokenize (the side's language)

so that models come as fairseq users have them: hub archives (transformer.wmt19.de-en: Moses and
fastBPE codes; transformer.wmt16.en-de: Moses and subword-nmt codes), fairseq-train output with
a ``sentencepiece.bpe.model`` (fairseq's ``sentencepiece`` bpe), and our own paragen-train-nmt
directories (``spm``: ``spm.model`` applied with ``sp.encode(text, out_type=str)`` and undone with
``sp.decode_pieces``, as models/nmt/engines/fairseq_engine.py does).

Codes files are hostile input: they are checked before a library reads them (subword-nmt calls
``sys.exit`` on a bad line, fastBPE indexes past the end of a short one) and never read unbounded.
The libraries' objects are built on first use, once per :class:`Tokenization`, and are not
pickled (fastBPE's cannot be), so a Tokenization travels to Beam workers as its arguments.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from typing import Container, Iterable

TOKENIZERS = ("moses", "none")
BPES = ("subword_nmt", "fastbpe", "sentencepiece", "spm", "none")
SIDES = ("src", "tgt")

SEPARATOR = "@@"                 # subword-nmt's and fastBPE's mark on a word's non-final pieces
SPACE = "\u2581"                 # sentencepiece's word boundary, "▁"
MAX_SEGMENTATIONS = 64           # piece sequences per surface form in banned_phrases
MAX_ENUMERATED_CHARS = 40        # longer forms get their canonical segmentation only

_HEAD_BYTES = 1 << 16            # detect_bpe decides from the first 64 KiB
_MAX_LINE_BYTES = 1 << 12        # a merge is two subwords and a count: a longer line is not codes
_MAX_CODES_BYTES = 1 << 28       # real codes and sentencepiece models are a few MiB
_MAX_CACHED_WORDS = 200_000      # subword-nmt caches every word it segments, without a bound
_LANG = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8})*")
_SPACES = re.compile(r"\s+")     # fairseq.tokenizer.tokenize_line's SPACE_NORMALIZER
_SURROGATE = re.compile("[\ud800-\udfff]")
_DROPPED = ("<s>", "</s>")       # what fairseq's Dictionary.string leaves out of a hypothesis
_SPECIAL = ("<s>", "<pad>", "</s>", "<unk>")   # fairseq's (and sentencepiece's) symbols: never a word
_COUNT = re.compile(r"[0-9]+\r?")
_LABELS = {"subword_nmt": "subword-nmt", "fastbpe": "fastBPE", "sentencepiece": "sentencepiece",
           "spm": "sentencepiece"}


# ---------------------------------------------------------------- codes files

class _NotCodes(ValueError):
    """Why a file is not codes of a kind (the caller names the file)."""


def _shown(path) -> str:
    """PATH on one line, whatever it holds."""
    return os.fspath(path).encode("unicode_escape").decode("ascii")[:300]


def _lines(path: str, limit: int) -> Iterable[tuple[int, str]]:
    """(number, text) of PATH's lines without their line ending, up to LIMIT bytes (a line cut by
    the limit is left out). _NotCodes for a line over _MAX_LINE_BYTES or not UTF-8, so a binary
    or one-line giant file costs one short read."""
    read = 0
    with open(path, "rb") as f:
        for number in itertools.count(1):
            raw = f.readline(_MAX_LINE_BYTES + 1)
            if not raw:
                return
            if len(raw) > _MAX_LINE_BYTES:
                raise _NotCodes(f"line {number} is over {_MAX_LINE_BYTES} bytes")
            read += len(raw)
            if read > limit:
                return
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _NotCodes(f"line {number} is not UTF-8 text") from None
            yield number, text[:-1] if text.endswith("\n") else text


def _check_subword_nmt(lines: Iterable[tuple[int, str]]) -> None:
    """The lines as subword-nmt's BPE reads them: an optional '#version: X.Y' header, then one
    'a b' merge a line; empty lines only at the end (it sys.exits on anything else)."""
    merges, blank = 0, None
    for number, line in lines:
        line = line.rstrip("\r")                      # subword-nmt reads with universal newlines
        if number == 1 and line.startswith("#version:"):
            try:
                version = tuple(int(x) for x in re.sub(r"(\.0+)*$", "", line.split()[-1]).split("."))
            except ValueError:
                raise _NotCodes(f"line 1: unreadable version {line[:40]!r}") from None
            if version not in ((0, 1), (0, 2)):
                raise _NotCodes(f"line 1: subword-nmt applies versions 0.1 and 0.2, not {line[9:].strip()[:20]!r}")
            continue
        if not line:
            blank = blank or number
            continue
        fields = line.strip("\r\n ").split(" ")
        if blank is not None or len(fields) != 2:
            if blank is not None:
                why = f"line {blank} is empty"
            elif len(fields) == 3 and _COUNT.fullmatch(fields[2]):
                why = f"line {number} is 'a b count' (fastBPE codes?)"
            else:
                why = f"line {number} is not 'a b': {line[:40]!r}"
            raise _NotCodes(why)
        merges += 1
    if not merges:
        raise _NotCodes("no merges")


def _check_fastbpe(lines: Iterable[tuple[int, str]]) -> None:
    """The lines as fastBPE reads them: 'a b count' on every line (it splits on single spaces,
    skipping empty fields, and reads fields 0 and 1 of every line, an empty one included)."""
    merges = 0
    for number, line in lines:
        fields = [f for f in line.split(" ") if f]
        if len(fields) != 3 or not _COUNT.fullmatch(fields[2]):
            if number == 1 and line.startswith("#version"):
                why = "line 1 is a subword-nmt header (subword-nmt codes?)"
            else:
                why = f"line {number} is not 'a b count': {line[:40]!r}"
            raise _NotCodes(why)
        merges += 1
    if not merges:
        raise _NotCodes("no merges")


def _load_sentencepiece(path: str):
    import sentencepiece as spm

    if os.path.getsize(path) > _MAX_CODES_BYTES:
        raise _NotCodes(f"over {_MAX_CODES_BYTES >> 20} MiB")
    try:
        sp = spm.SentencePieceProcessor(model_file=path)
    except (RuntimeError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise _NotCodes(f"not a sentencepiece model: {first[:160]}") from None
    if len(sp) == 0:
        raise _NotCodes("a sentencepiece model without pieces")
    return sp


def _regular_file(path: str) -> None:
    if not os.path.isfile(path):
        raise _NotCodes("not a regular file" if os.path.exists(path) else "no such file")


def _check(path: str, bpe: str, limit: int) -> None:
    _regular_file(path)
    if bpe in ("sentencepiece", "spm"):
        _load_sentencepiece(path)
        return
    if os.path.getsize(path) > _MAX_CODES_BYTES:
        raise _NotCodes(f"over {_MAX_CODES_BYTES >> 20} MiB")
    (_check_subword_nmt if bpe == "subword_nmt" else _check_fastbpe)(_lines(path, limit))


def check_codes(codes_path: str, bpe: str) -> None:
    """ValueError (one line) unless CODES_PATH is codes of kind BPE that its library reads: the
    whole file is checked (a bad line anywhere stops subword-nmt and crashes fastBPE), up to
    256 MiB. subword-nmt codes without the '#version' header (0.1) are accepted, as subword-nmt
    does; detect_bpe does not guess them."""
    if bpe not in BPES or bpe == "none":
        raise ValueError(f"bpe must be one of {BPES[:-1]} to have codes, not {bpe!r}")
    try:
        _check(os.fspath(codes_path), bpe, _MAX_CODES_BYTES)
    except _NotCodes as exc:
        raise ValueError(f"not {_LABELS[bpe]} codes: {_shown(codes_path)} ({exc})") from None
    except OSError as exc:
        raise ValueError(f"not {_LABELS[bpe]} codes: {_shown(codes_path)} ({exc.strerror})") from None


def detect_bpe(codes_path: str) -> str:
    """The kind of a codes file, from its first 64 KiB: "subword_nmt" (first line '#version...'),
    "fastbpe" ('a b count' lines) or "sentencepiece" (a sentencepiece model: the file tells
    fairseq's "sentencepiece" and our "spm" apart no more than the model does). ValueError (one
    line) for anything else."""
    path = os.fspath(codes_path)
    try:
        kind = _guess(path)
        if kind != "sentencepiece":
            _check(path, kind, _HEAD_BYTES)
        return kind
    except _NotCodes as exc:
        raise ValueError(f"not BPE codes: {_shown(path)} ({exc})") from None
    except OSError as exc:
        raise ValueError(f"not BPE codes: {_shown(path)} ({exc.strerror})") from None


def _guess(path: str) -> str:
    _regular_file(path)
    with open(path, "rb") as f:
        head = f.read(_MAX_LINE_BYTES)
    if not head.strip():
        raise _NotCodes("empty file")
    first = head.split(b"\n", 1)[0]
    if first.startswith(b"#version"):
        return "subword_nmt"
    fields = first.split()
    if len(fields) == 3 and fields[2].isdigit():
        return "fastbpe"
    try:
        # a serialized ModelProto starts with its first field, the pieces (tag 0x0a): anything
        # else is not loaded at all
        if head[:1] != b"\n":
            raise _NotCodes("not a sentencepiece model")
        _load_sentencepiece(path)
    except _NotCodes:
        hint = "; subword-nmt 0.1 codes without a header? name the bpe" if len(fields) == 2 else ""
        raise _NotCodes(f"neither BPE merges nor a sentencepiece model; starts {head[:24]!r}{hint}") from None
    return "sentencepiece"


def codes_sha256(codes_path: str) -> str:
    digest = hashlib.sha256()
    with open(codes_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- the pipeline

def surface_forms(word: str) -> list[str]:
    """Forms of a banned word to block: as written, lower-cased, capitalised and upper-cased."""
    forms = [word, word.lower(), word[:1].upper() + word[1:].lower(), word.upper()]
    return list(dict.fromkeys(f for f in forms if f.strip()))


def _unicode(text: str) -> str:
    """TEXT with lone surrogates (not Unicode text: fastBPE and sentencepiece raise on them,
    and no output could be written) replaced by U+FFFD."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    return _SURROGATE.sub("\ufffd", text)


def _build_subword_nmt(path: str):
    from subword_nmt.apply_bpe import BPE

    # fairseq passes the file argparse opened (the locale's encoding, UTF-8 on our machines)
    with open(path, encoding="utf-8") as f:
        return BPE(f, -1, SEPARATOR, None, None)


def _build_fastbpe(path: str):
    import fastBPE

    return fastBPE.fastBPE(path)


_BUILDERS = {"subword_nmt": _build_subword_nmt, "fastbpe": _build_fastbpe,
             "sentencepiece": _load_sentencepiece, "spm": _load_sentencepiece}


class Tokenization:
    """One model direction's text pipeline: TOKENIZER ("moses" or "none") then BPE (one of
    BPES, CODES_PATH its codes or model; None for "none"), Moses rules of SRC_LANG for the source
    side and of TGT_LANG for the target side."""

    def __init__(self, tokenizer: str, bpe: str, codes_path: str | None, src_lang: str, tgt_lang: str,
                 source_codes_path: str | None = None):
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, not {tokenizer!r}")
        if bpe not in BPES:
            raise ValueError(f"bpe must be one of {BPES}, not {bpe!r}")
        for name, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
            if not isinstance(lang, str) or not _LANG.fullmatch(lang):
                raise ValueError(f"{name} must be a language code such as 'en' or 'cs', not {lang!r}"[:200])
        if bpe == "none":
            if codes_path is not None:
                raise ValueError("bpe 'none' takes no codes file")
            digest = None
        else:
            if codes_path is None:
                raise ValueError(f"bpe {bpe!r} needs its codes file")
            codes_path = os.fspath(codes_path)
            check_codes(codes_path, bpe)
            digest = codes_sha256(codes_path)
        if source_codes_path is not None:          # Marian: one sentencepiece model per side
            if bpe not in ("spm", "sentencepiece"):
                raise ValueError(f"a separate source model is for sentencepiece, not bpe {bpe!r}")
            source_codes_path = os.fspath(source_codes_path)
            check_codes(source_codes_path, bpe)
        self.tokenizer, self.bpe, self.codes_path = tokenizer, bpe, codes_path
        self.source_codes_path = source_codes_path
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.codes_sha256 = digest
        self.source_codes_sha256 = codes_sha256(source_codes_path) if source_codes_path else None
        self._lib: dict = {}                       # library objects, built on first use

    def __repr__(self) -> str:
        return (f"Tokenization({self.tokenizer!r}, {self.bpe!r}, {self.codes_path!r}, "
                f"{self.src_lang!r}, {self.tgt_lang!r})")

    # pickled without the library objects (fastBPE's cannot be): the copy builds its own
    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_lib"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lib = {}

    def describe(self) -> dict:
        """What decides the pieces, for a run's manifest."""
        out = {"tokenizer": self.tokenizer, "bpe": self.bpe, "codes_sha256": self.codes_sha256,
               "src_lang": self.src_lang, "tgt_lang": self.tgt_lang}
        if self.source_codes_path:
            out["source_codes_sha256"] = self.source_codes_sha256
        return out

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode()).hexdigest()[:16]

    # ---------------------------------------------------------------- library objects
    def _lang(self, side: str) -> str:
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}"[:200])
        return self.src_lang if side == "src" else self.tgt_lang

    def _moses(self, kind: str, lang: str):
        obj = self._lib.get((kind, lang))
        if obj is None:
            from sacremoses import MosesDetokenizer, MosesTokenizer

            obj = self._lib[(kind, lang)] = (MosesTokenizer if kind == "tok" else MosesDetokenizer)(lang)
        return obj

    def _model(self, side: str = "tgt"):
        key = "bpe:src" if side == "src" and self.source_codes_path else "bpe"
        obj = self._lib.get(key)
        if obj is None:
            path = self.source_codes_path if key == "bpe:src" else self.codes_path
            obj = self._lib[key] = _BUILDERS[self.bpe](path)
        return obj

    # ---------------------------------------------------------------- encode / decode
    def encode(self, text: str, side: str = "src") -> list[str]:
        """The pieces fairseq's dictionary sees for TEXT on SIDE ("src" or "tgt")."""
        lang = self._lang(side)
        text = _unicode(text)
        if self.tokenizer == "moses":
            text = self._moses("tok", lang).tokenize(text, aggressive_dash_splits=True, return_str=True,
                                                     escape=True)
        return self._pieces(text, side)

    def _pieces(self, tokenized: str, side: str) -> list[str]:
        """The pieces of already tokenized text."""
        if self.bpe == "spm":
            return self._model(side).encode(tokenized, out_type=str)
        return _SPACES.sub(" ", self._apply_bpe(tokenized, side)).strip().split()

    def _apply_bpe(self, text: str, side: str = "src") -> str:
        if self.bpe == "subword_nmt":
            bpe = self._model()
            if len(bpe.cache) > _MAX_CACHED_WORDS:   # the cache only saves time: dropping it changes nothing
                bpe.cache.clear()
            return bpe.process_line(text)
        if self.bpe == "fastbpe":
            return self._model().apply([text])[0]
        if self.bpe == "sentencepiece":
            return " ".join(self._model(side).Encode(text, out_type=str))
        return text

    def decode(self, pieces: Iterable[str], side: str = "tgt") -> str:
        """The text fairseq makes of PIECES on SIDE: BPE removed, then detokenized."""
        lang = self._lang(side)
        text = self._undo_bpe(pieces, side)
        if self.tokenizer == "moses":
            text = self._moses("detok", lang).detokenize(text.split())
        return text

    def _undo_bpe(self, pieces: Iterable[str], side: str = "tgt") -> str:
        if isinstance(pieces, str):
            raise TypeError("pieces must be a sequence of strings, not one string")
        pieces = [_unicode(p) for p in pieces]
        if self.bpe == "spm":
            return self._model(side).decode_pieces(pieces)
        # Dictionary.string: symbols joined with spaces, without <s> and </s> (a "</s>" word in a
        # text is binarized as the eos symbol, and printed as nothing)
        text = " ".join(p for p in pieces if p not in _DROPPED)
        if self.bpe in ("subword_nmt", "fastbpe"):
            return (text + " ").replace(SEPARATOR + " ", "").rstrip()
        if self.bpe == "sentencepiece":
            return text.replace(" ", "").replace(SPACE, " ").strip()
        return text

    # ---------------------------------------------------------------- banned words
    def banned_phrases(self, word: str, vocabulary: Container[str]) -> list[tuple[str, ...]]:
        """Every piece sequence of VOCABULARY that spells WORD (each of its surface_forms) as a
        whole target-side word: the canonical segmentation (encode's, word-initial) and every
        other one.

        A model is trained on canonical segmentations but gives some probability to others
        ("hou@@ se" for "house", "▁" "house" for "▁house"), and a sampler that bans only the
        canonical one lets a sample spell the word another way. The canonical sequences come
        first, then the others in a fixed order; at most MAX_SEGMENTATIONS per form, and forms
        over MAX_ENUMERATED_CHARS characters get the canonical one only. A sequence with a piece
        not in VOCABULARY is left out (it can never be generated), and so is one with a special
        symbol (banning "</s>" would keep every hypothesis from ending).

        A sequence matches wherever its pieces occur: with @@-BPE ("house") also after a piece
        that ends in "@@" (the end of "green@@ house"), with sentencepiece ("▁house") also before
        a non-initial piece (the start of "▁house s")."""
        word = _unicode(word)
        canonical, others = [], []
        for form, pieces in self._spellings(word):
            if not pieces:
                continue
            canonical.append(pieces)
            if len(form) <= MAX_ENUMERATED_CHARS and self.bpe != "none":
                spelled = self._undo_bpe(pieces)
                # same text before detokenizing: the same detokenized text, the same word
                others += [seq for seq in self._segmentations(pieces, vocabulary)
                           if seq != pieces and self._undo_bpe(seq) == spelled][:MAX_SEGMENTATIONS - 1]
        return [seq for seq in dict.fromkeys(canonical + others)
                if all(p in vocabulary and p not in _SPECIAL for p in seq)]

    def _spellings(self, word: str) -> list[tuple[str, tuple[str, ...]]]:
        """(form, its canonical pieces) of each surface form of WORD; with Moses then each form
        with a period, which Moses keeps as one token before a lower-case word or after a
        nonbreaking prefix ("park. the", "A. Smith") and which detokenizes to the word and a
        period: a sample must not write the word that way either."""
        out = [(form, tuple(self.encode(form, side="tgt"))) for form in surface_forms(word)]
        if self.tokenizer == "moses":
            moses = self._moses("tok", self._lang("tgt"))
            for form in surface_forms(word):
                dotted = form + "."
                if moses.tokenize(dotted + " x", aggressive_dash_splits=True, escape=True)[:1] == [dotted]:
                    out.append((dotted, tuple(self._pieces(dotted, "tgt"))))
        return out

    def _segmentations(self, pieces: tuple[str, ...], vocabulary) -> list[tuple[str, ...]]:
        """Segmentations into VOCABULARY pieces of the strings PIECES spell: each Moses token
        on its own with @@-BPE (its non-final pieces end in "@@"), the whole string with
        sentencepiece; at most MAX_SEGMENTATIONS."""
        if self.bpe in ("subword_nmt", "fastbpe"):
            per_token = [_splits(token, vocabulary, SEPARATOR) or [group] for token, group in _tokens(pieces)]
        else:
            per_token = [_splits("".join(pieces), vocabulary, "") or [pieces]]
        combos = itertools.islice(itertools.product(*per_token), MAX_SEGMENTATIONS)
        return [tuple(p for part in combo for p in part) for combo in combos]


def _tokens(pieces: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """(token, its pieces) of @@-BPE pieces: a token ends with a piece not ending in "@@"."""
    out, group = [], []
    for p in pieces:
        group.append(p)
        if not p.endswith(SEPARATOR):
            out.append(("".join(g[:-len(SEPARATOR)] for g in group[:-1]) + p, tuple(group)))
            group = []
    if group:                                      # a dangling "x@@": kept as it is
        out.append(("", tuple(group)))
    return out


def _splits(token: str, vocabulary, mark: str) -> list[tuple[str, ...]]:
    """Segmentations of TOKEN into VOCABULARY pieces, non-final pieces with MARK appended, fewest
    (longest first) pieces first; at most MAX_SEGMENTATIONS."""
    n = len(token)
    if not n or n > 8 * MAX_ENUMERATED_CHARS:       # Moses escapes make a token longer than its word
        return []

    def piece(i: int, j: int) -> str:
        return token[i:j] if j == n else token[i:j] + mark

    # ends[i]: the piece ends j from position i after which the rest can be segmented too, so
    # the walk below never enters a dead end and its work is bounded by what it returns
    ends: list[list[int]] = [[] for _ in range(n + 1)]
    reachable = [False] * n + [True]
    for i in range(n - 1, -1, -1):
        ends[i] = [j for j in range(n, i, -1) if reachable[j] and piece(i, j) in vocabulary]
        reachable[i] = bool(ends[i])
    out: list[tuple[str, ...]] = []

    def walk(i: int, prefix: tuple[str, ...]) -> None:
        if i == n:
            out.append(prefix)
            return
        for j in ends[i]:
            if len(out) >= MAX_SEGMENTATIONS:
                return
            walk(j, prefix + (piece(i, j),))

    walk(0, ())
    return out
