"""Bitext cleaning as in ParaBank 2 §3.1: normalise punctuation, check encodability, limit lengths.

Pure functions; the Beam DoFn in transforms/ only wraps :func:`clean_pair`.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field

# ParaBank 2 keeps an English side encodable in latin-1 and a Czech side in latin-2: this drops
# pairs with stray scripts (mis-aligned or noisy web text) cheaply.
DEFAULT_ENCODINGS = {"en": "latin-1", "cs": "iso8859-2", "de": "latin-1", "fr": "latin-1",
                     "es": "latin-1", "pl": "iso8859-2", "sk": "iso8859-2", "hu": "iso8859-2"}

# Unicode punctuation that has an ASCII counterpart (the spirit of Moses normalize-punctuation).
_PUNCT_MAP = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "\u00b4": "'",
    "`": "'", "\u201c": "\"", "\u201d": "\"", "\u201e": "\"", "\u201f": "\"", "\u2033": "\"",
    "\u00ab": "\"", "\u00bb": "\"", "\u2039": "'", "\u203a": "'",
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-",
    "\u2212": "-", "\u2026": "...", "\u00a0": " ", "\u2007": " ", "\u202f": " ", "\u2009": " ",
    "\u200a": " ", "\u3000": " ", "\uff0c": ",", "\uff0e": ".", "\uff1a": ":", "\uff1b": ";",
    "\uff01": "!", "\uff1f": "?", "\uff08": "(", "\uff09": ")", "\u2022": "*", "\u00b7": "*",
}
_PUNCT_TABLE = str.maketrans(_PUNCT_MAP)
# Invisible marks dropped: zero-width (non-)joiners and spaces, BOM, soft hyphen, and the
# left-to-right / right-to-left / Arabic letter marks (frequent, harmless noise in web text).
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad\u200e\u200f\u061c"), None)
# Format characters that reorder or hide text (bidi embeddings, overrides and isolates, Unicode
# tags: "Trojan Source" style): a pair holding one is rejected, not silently rewritten.
_HIDING_FORMAT = frozenset([*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xE0001,
                            *range(0xE0020, 0xE0080)])
_SPACE_RE = re.compile(r"\s+")


@dataclass(frozen=True)
class CleaningConfig:
    src_lang: str = "cs"
    tgt_lang: str = "en"
    encodings: dict = field(default_factory=dict)     # overrides of DEFAULT_ENCODINGS; "" = no rule
    max_tokens: int = 100
    max_length_ratio: float = 3.0
    min_tokens_for_ratio: int = 4   # ratio is meaningless for "Ano ." vs "Yes , indeed ."

    def __post_init__(self):
        # bounds that would reject every pair are mistakes, refused before anything runs
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, not {self.max_tokens}")
        if not self.max_length_ratio >= 1.0:         # also refuses nan
            raise ValueError(f"max_length_ratio must be >= 1 (longer side / shorter side), not {self.max_length_ratio}")

    def encoding_for(self, lang: str) -> str | None:
        enc = self.encodings.get(lang, DEFAULT_ENCODINGS.get(lang))
        return enc or None


@dataclass(frozen=True)
class CleanPair:
    """A pair after cleaning and deduplication, as the decoding steps see it."""
    pair_id: str
    input_shard: str
    input_index: int
    source: str          # foreign side
    reference: str       # English side


@dataclass(frozen=True)
class Rejection:
    reason: str
    detail: str


def normalize_text(text: str) -> str:
    """NFC, Unicode punctuation to ASCII, zero-width characters removed, whitespace collapsed."""
    text = unicodedata.normalize("NFC", text)
    text = text.translate(_ZERO_WIDTH).translate(_PUNCT_TABLE)
    return _SPACE_RE.sub(" ", text).strip()


def _control_char(text: str) -> str | None:
    for ch in text:
        if (unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn") and not ch.isspace()) \
                or ord(ch) in _HIDING_FORMAT:
            return f"U+{ord(ch):04X}"
    return None


def _encodable(text: str, encoding: str | None) -> bool:
    if encoding is None:
        return True
    try:
        text.encode(encoding)
        return True
    except UnicodeEncodeError:
        return False


def clean_pair(src: str, tgt: str, cfg: CleaningConfig) -> tuple[str, str] | Rejection:
    """Return the cleaned pair, or the first rule it breaks."""
    for side, text in (("src", src), ("tgt", tgt)):
        bad = _control_char(text)
        if bad:
            return Rejection("control_chars", f"{side} contains {bad}")
    src, tgt = normalize_text(src), normalize_text(tgt)
    if not src:
        return Rejection("empty_src", "foreign side empty")
    if not tgt:
        return Rejection("empty_tgt", "English side empty")
    for side, text, lang in (("src", src, cfg.src_lang), ("tgt", tgt, cfg.tgt_lang)):
        enc = cfg.encoding_for(lang)
        if not _encodable(text, enc):
            bad = next(ch for ch in text if not _encodable(ch, enc))
            return Rejection(f"not_encodable_{side}", f"{bad!r} (U+{ord(bad):04X}) not in {enc}")
    ns, nt = len(src.split()), len(tgt.split())
    if ns > cfg.max_tokens:
        return Rejection("too_long_src", f"{ns} tokens > {cfg.max_tokens}")
    if nt > cfg.max_tokens:
        return Rejection("too_long_tgt", f"{nt} tokens > {cfg.max_tokens}")
    if max(ns, nt) >= cfg.min_tokens_for_ratio and max(ns, nt) / min(ns, nt) > cfg.max_length_ratio:
        return Rejection("length_ratio", f"{ns} vs {nt} tokens > ratio {cfg.max_length_ratio}")
    return src, tgt


def pair_id(shard: str, index: int, src: str | None, tgt: str | None) -> str:
    """Stable id: the same shard name, record index and raw text give the same id on every run."""
    h = hashlib.blake2b(digest_size=8)
    for part in (shard, str(index), src or "", tgt or ""):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def dedup_key(src: str, tgt: str) -> str:
    """Key of a cleaned pair for deduplication (case- and whitespace-insensitive)."""
    h = hashlib.blake2b(f"{src.casefold()}\x00{tgt.casefold()}".encode("utf-8"), digest_size=12)
    return h.hexdigest()
