"""Plain score functions on sentence pairs (no models): lengths, n-gram overlap, sentence BLEU,
bag-of-pieces. Tokens are common.text.tokenize's lower-cased words and punctuation marks.

The per-pair functions (ngram_overlap, sentence_bleu, ...) are the reference; the filters use the
batch versions below them (tokenize_columns, ngram_match_counts, ngram_overlap_batch,
sentence_bleu_batch, length_ratio_batch), which compute the same values for whole columns with numpy.
"""
from __future__ import annotations

import math
import unicodedata
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.text import MAX_CHARS, MAX_TOKENS, tokenize

__all__ = ["tokenize", "ngrams", "ngram_overlap", "sentence_bleu", "bag_of_pieces_similarity", "is_punct",
           "TokenColumn", "tokenize_columns", "ngram_match_counts", "ngram_overlap_batch", "sentence_bleu_batch",
           "length_ratio_batch"]


def ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def ngram_overlap(a: list[str], b: list[str], n: int) -> float:
    """Shared n-grams (clipped counts) / n-grams of the side with fewer n-grams (Wieting et al.
    2017). 0.0 when that side has no n-gram (fewer than n tokens): nothing can be shared."""
    ga, gb = ngrams(a, n), ngrams(b, n)
    shorter = min(sum(ga.values()), sum(gb.values()))
    if shorter == 0:
        return 0.0
    return sum((ga & gb).values()) / shorter


def sentence_bleu(hyp: list[str], ref: list[str], max_n: int = 4) -> float:
    """Smoothed sentence BLEU in [0, 1], BLEU+1 as Nakov et al. (2012) define it: add one to the
    matches and totals of every n-gram order, unigrams included, and one to the reference length
    of the brevity penalty. sacrebleu's add-k smooths orders n > 1 only, so the unigram and length
    terms are added here and sacrebleu computes the rest."""
    from sacrebleu.metrics.bleu import BLEU

    if not hyp or not ref:      # smoothing alone would give an empty side a positive score
        return 0.0
    correct, total = [], []
    for n in range(1, max_n + 1):
        h, r = ngrams(hyp, n), ngrams(ref, n)
        correct.append(sum((h & r).values()))
        total.append(max(len(hyp) - n + 1, 0))
    correct[0] += 1
    total[0] += 1
    score = BLEU.compute_bleu(correct, total, len(hyp), len(ref) + 1, smooth_method="add-k", smooth_value=1,
                              max_ngram_order=max_n)
    return score.score / 100


def is_punct(piece: str) -> bool:
    return all(unicodedata.category(c).startswith("P") or unicodedata.category(c).startswith("S") for c in piece)


def bag_of_pieces_similarity(a_pieces: list[str], b_pieces: list[str]) -> float:
    """|A ∩ B| / |A ∪ B| of the two sets of lower-cased sentencepiece pieces, without the word
    boundary mark and without punctuation pieces (ParaBank 2 §4). Two empty sets give 0.0."""
    def clean(pieces):
        out = set()
        for p in pieces:
            p = p.replace("\u2581", "").lower()
            if p and not is_punct(p):
                out.add(p)
        return out

    a, b = clean(a_pieces), clean(b_pieces)
    union = a | b
    return len(a & b) / len(union) if union else 0.0


# ------------------------------------------------------------------ batch-vectorised path
#
# The filters score thousands of pairs at once, so the token-level scores are also computed on
# whole columns: each column is tokenised into flat int32 token ids plus row offsets (one
# vocabulary for all the columns tokenised together) and lengths, n-gram overlap and BLEU+1 come
# from numpy operations on those arrays. The per-pair functions above are the reference;
# tests/test_filtering.py checks that both paths give the same tokens and scores.
#
# Tokenisation. Rows that are pure ASCII (nearly all English text) are tokenised with numpy at the
# byte level. On ASCII, NFKC is the identity, lower-casing maps A-Z to a-z, control characters
# become spaces, Python's Unicode \w is [A-Za-z0-9_] and the only \s left is the space, so
# `\w+(?:['’]\w+)*|[^\w\s]` reduces to: a token is a maximal run of word characters in which an
# apostrophe between two word characters counts as one, or a single other non-space character.
# The byte classes are read off common.text.tokenize itself when this module loads. Rows with
# any non-ASCII character (Unicode letters and digits, curly apostrophes, NFKC and case-mapping
# subtleties) go to common.text.tokenize, so the tokens are identical for every row.
#
# N-gram matches. Each token position j of either side becomes one int64 key
#     row | t_0 | t_1 | ... | t_{N-1} | side        (t_k: id + 1 of token j + k; past the row's end
#                                                    0 on side a, all ones on side b)
# and one sort of all keys puts every row's equal k-grams, for every order k <= N, next to each
# other: a k-gram's group is a run of keys that agree on their first k fields (row included). The
# clipped intersection is min(#a, #b) per group, summed per row with np.bincount; a k-gram that
# runs past its row's end is in a group of one side and adds nothing. When the fields do not fit
# 63 bits, token ids are first renumbered within each row (at most 2 x MAX_TOKENS of them); if they
# still do not fit, one sort per order refines the (n-1)-gram groups by the next token.

_SPACE, _WORD, _PUNCT, _APOS = 0, 1, 2, 3


def _ascii_tables() -> tuple[bytes, bytes, bytes, bytes]:
    """bytes.translate tables read off tokenize: class of each ASCII byte, its lower case, and the
    bytes that are spaces and apostrophes (join word characters; alone a punctuation token)."""
    cls = bytearray([255] * 256)          # 255: not ASCII (such rows never reach the byte path)
    low = bytearray(range(256))
    for b in range(128):
        c = chr(b)
        low[b] = ord(c.lower())
        word_run = tokenize(c + c) == [(c + c).lower()]
        if tokenize(c) == []:
            cls[b] = _SPACE
        elif not word_run and tokenize(f"a{c}a") == [f"a{c}a"]:
            cls[b] = _APOS
        elif word_run:
            cls[b] = _WORD
        elif tokenize(c + c) == [c.lower(), c.lower()]:
            cls[b] = _PUNCT
        else:   # pragma: no cover - tokenize changed in a way the byte rules do not model
            raise RuntimeError(f"tokenize treats {c!r} in a way the vectorised tokeniser does not model")
    spaces = bytes(b for b in range(128) if cls[b] == _SPACE)
    apostrophes = bytes(b for b in range(128) if cls[b] == _APOS)
    return bytes(cls), bytes(low), spaces, apostrophes


_CLASS_TABLE, _LOWER_TABLE, _SPACE_BYTES, _APOS_BYTES = _ascii_tables()
_WORD_TABLE, _SOLID_TABLE, _APOS_TABLE = (bytes(int(c in cs) for c in _CLASS_TABLE)      # 0/1 bytes: bool arrays
                                          for cs in ((_WORD,), (_WORD, _PUNCT, _APOS), (_APOS,)))


class TokenColumn:
    """One column of tokenised sentences: the token ids (int32 indices into ``vocab``) of row i are
    ``ids[offsets[i]:offsets[i + 1]]``."""

    __slots__ = ("ids", "offsets", "vocab")

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, vocab: pa.Array):
        self.ids, self.offsets, self.vocab = ids, offsets, vocab

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def token_lists(self) -> list[list[str]]:
        words = np.array(self.vocab.to_pylist(), dtype=object)[self.ids].tolist()
        off = self.offsets.tolist()
        return [words[a:b] for a, b in zip(off[:-1], off[1:])]


def _utf8_buffers(column) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """(array, bytes, offsets) of a string column as one array; nulls read as empty strings."""
    if not isinstance(column, (pa.Array, pa.ChunkedArray)):
        column = pa.array(list(column), type=pa.large_string())
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if column.type not in (pa.string(), pa.large_string()):
        column = column.cast(pa.large_string())
    if column.null_count:
        column = pc.fill_null(column, "")
    _, offsets, data = column.buffers()
    off_type = np.int32 if column.type == pa.string() else np.int64
    offsets = np.frombuffer(offsets, dtype=off_type)[column.offset:column.offset + len(column) + 1].astype(np.int64)
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    return column, data, offsets


def _ascii_tokens(pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Tokens of ASCII rows. PIECES: per column (bytes, rows' start offsets, rows' lengths capped at
    MAX_CHARS). Returns the tokens' lower-cased bytes end to end, the tokens' offsets into them, and
    the number of tokens of each row (rows of all pieces in order)."""
    chunks, lengths = [], []
    for data, start, length in pieces:
        if not len(start):
            continue
        if np.array_equal(start[1:], start[:-1] + length[:-1]):
            chunks.append(memoryview(data[start[0]:start[-1] + length[-1]]))      # contiguous rows
        else:
            cum = np.cumsum(length) - length
            chunks.append(memoryview(data[np.arange(int(length.sum())) + np.repeat(start - cum, length)]))
        lengths.append(length)
    text = b"".join(chunks)
    row_off = np.zeros(sum(len(x) for x in lengths) + 1, dtype=np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=row_off[1:])
    m = len(text)
    # (numpy temporaries are few on purpose: on large arrays each fresh one costs page faults)
    word = np.frombuffer(text.translate(_WORD_TABLE), dtype=bool)
    if any(a in text for a in _APOS_BYTES):
        apos = np.frombuffer(text.translate(_APOS_TABLE), dtype=bool)
        word = word.copy()                                  # word characters and joining apostrophes
        join = apos[1:-1] & word[:-2] & word[2:]
        edge = np.concatenate([row_off[:-1] - 1, row_off[1:] - 2])   # join[j] is byte j + 1: none at row edges
        join[edge[(edge >= 0) & (edge < m - 2)]] = False
        word[1:-1] |= join
    cut = np.ones(m + 1, dtype=bool)                        # cut[i]: bytes i - 1 and i not in one token
    np.logical_and(word[1:], word[:-1], out=cut[1:m])
    np.logical_not(cut[1:m], out=cut[1:m])
    cut[row_off] = True
    solid = np.frombuffer(text.translate(_SOLID_TABLE), dtype=bool)
    flags = np.empty((m, 2), dtype=bool)                    # token starts and token ends, interleaved
    np.logical_and(solid, cut[:m], out=flags[:, 0])
    np.logical_and(solid, cut[1:], out=flags[:, 1])
    bounds = np.flatnonzero(flags.reshape(-1))              # 2 * first byte, 2 * last byte + 1, ...
    tok_off = np.zeros(len(bounds) // 2 + 1, dtype=np.int64)
    length = bounds[1::2] - bounds[0::2]
    length += 1
    length >>= 1
    np.cumsum(length, out=tok_off[1:])
    tok_bytes = text.translate(_LOWER_TABLE, _SPACE_BYTES)
    assert len(tok_bytes) == tok_off[-1]
    counts = np.diff(np.searchsorted(bounds[0::2], 2 * row_off))
    return tok_bytes, tok_off, counts


def tokenize_columns(*columns, max_tokens: int = MAX_TOKENS) -> list[TokenColumn]:
    """Tokenise string columns of equal length (pyarrow arrays or chunked arrays, or lists of str;
    None reads as "") with one shared vocabulary. Every row's tokens equal
    common.text.tokenize's, in order, capped at MAX_TOKENS."""
    cols = [_utf8_buffers(c) for c in columns]
    n = len(cols[0][2]) - 1 if cols else 0
    if any(len(off) - 1 != n for _, _, off in cols):
        raise ValueError("columns differ in length")
    pieces, fast_rows, slow_rows, slow_tokens, slow_counts = [], [], [], [], []
    for c, (col, data, off) in enumerate(cols):
        length = np.minimum(np.diff(off), MAX_CHARS)
        is_ascii = pc.string_is_ascii(col).to_numpy(zero_copy_only=False).astype(bool, copy=False)
        if is_ascii.all():
            pieces.append((data, off[:-1], length))
            fast_rows.append(c * n + np.arange(n))
            continue
        idx = np.flatnonzero(is_ascii)
        pieces.append((data, off[idx], length[idx]))
        fast_rows.append(c * n + idx)
        for i in np.flatnonzero(~is_ascii).tolist():       # the Python tokenizer for the others
            toks = tokenize(bytes(data[off[i]:off[i + 1]]).decode("utf-8"), max_tokens)
            slow_tokens += toks
            slow_rows.append(c * n + i)
            slow_counts.append(len(toks))
    tok_bytes, tok_off, fast_counts = _ascii_tokens(pieces)
    tokens = pa.LargeStringArray.from_buffers(len(tok_off) - 1, pa.py_buffer(tok_off), pa.py_buffer(tok_bytes))
    fast_rows = np.concatenate(fast_rows) if fast_rows else np.zeros(0, dtype=np.int64)
    if slow_rows:
        tokens = pa.concat_arrays([tokens, pa.array(slow_tokens, type=pa.large_string())])
    enc = pc.dictionary_encode(tokens)
    ids = enc.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    counts = np.zeros(len(cols) * n, dtype=np.int64)
    counts[fast_rows] = fast_counts
    if slow_rows:                                          # tokens back into row order
        counts[slow_rows] = slow_counts
        rows = np.concatenate([np.repeat(fast_rows, fast_counts), np.repeat(slow_rows, slow_counts)])
        ids = ids[np.argsort(rows, kind="stable")]
    if len(counts) and counts.max() > max_tokens:         # the token cap
        first = np.cumsum(counts) - counts
        rows = np.repeat(np.arange(len(counts)), counts)
        ids = ids[np.arange(len(ids)) - first[rows] < max_tokens]
        counts = np.minimum(counts, max_tokens)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    out = []
    for c in range(len(cols)):
        o = offsets[c * n:(c + 1) * n + 1]
        out.append(TokenColumn(ids[o[0]:o[-1]], o - o[0], enc.dictionary))
    return out


def _rows_of(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))


def _ngram_keys(ids_a: np.ndarray, off_a: np.ndarray, ids_b: np.ndarray, off_b: np.ndarray, max_n: int,
                bits: int) -> np.ndarray:
    """row | t_0 | ... | t_{max_n - 1} | side for every token position of both sides (see the notes
    above). Fields past the row's end hold 0 on side a and 2 ** bits - 1 on side b, so a k-gram that
    does not fit in its row is in a group of one side only and never counts as shared."""
    n_rows = len(off_a) - 1
    offsets = np.concatenate([off_a, off_b[1:] + off_a[-1]])        # b's rows after a's
    lengths = np.diff(offsets)
    n = int(offsets[-1])
    rem = np.repeat(offsets[1:], lengths)
    rem -= np.arange(n)                                             # tokens left in the row, itself included
    t = np.concatenate([ids_a, ids_b]).astype(np.int64)
    t += 1
    head = np.arange(n_rows, dtype=np.int64) << (max_n * bits + 1)
    key = np.repeat(np.concatenate([head, head | 1]), lengths)
    key |= t << ((max_n - 1) * bits + 1)
    past = np.zeros(n, dtype=np.int64)                              # the field value past the row's end
    past[len(ids_a):] = (1 << bits) - 1
    for k in range(1, max_n):
        field = np.where(rem[:n - k] > k, t[k:], past[:n - k])
        field <<= (max_n - 1 - k) * bits + 1
        key[:n - k] |= field
        key[n - k:] |= past[n - k:] << ((max_n - 1 - k) * bits + 1)
    return key


def _row_local_ids(a: "TokenColumn", b: "TokenColumn") -> tuple[np.ndarray, np.ndarray, int]:
    """Token ids renumbered 0.. within each row (both sides together); and the largest id + 1."""
    vb = max(len(a.vocab), 1).bit_length()
    key = np.concatenate([(_rows_of(a.offsets) << vb) | a.ids, (_rows_of(b.offsets) << vb) | b.ids])
    order = np.argsort(key, kind="stable")
    key = key[order]
    new = np.ones(len(key), dtype=bool)
    np.not_equal(key[1:], key[:-1], out=new[1:])
    group = np.cumsum(new, dtype=np.int64) - 1
    row = key >> vb
    new_row = np.ones(len(key), dtype=bool)
    np.not_equal(row[1:], row[:-1], out=new_row[1:])
    local = group - np.maximum.accumulate(np.where(new_row, group, 0))
    out = np.empty(len(key), dtype=np.int64)
    out[order] = local
    return out[:len(a.ids)], out[len(a.ids):], int(local.max()) + 1 if len(local) else 0


def ngram_match_counts(a: TokenColumn, b: TokenColumn, max_n: int) -> list[np.ndarray]:
    """Per row, the clipped multiset intersection |ngrams(a, n) & ngrams(b, n)| (what ngram_overlap
    and sentence_bleu count as shared) for n = 1..MAX_N, as int64 arrays. A and B come from one
    tokenize_columns call (shared ids)."""
    n_rows = len(a)
    total = len(a.ids) + len(b.ids)
    if total == 0 or max_n < 1:
        return [np.zeros(n_rows, dtype=np.int64) for _ in range(max_n)]
    row_bits = (n_rows - 1).bit_length()
    ids_a, ids_b, bits = a.ids, b.ids, (len(a.vocab) + 1).bit_length()     # ids + 1, and the end mark
    if row_bits + max_n * bits + 1 > 63:
        ids_a, ids_b, top = _row_local_ids(a, b)
        bits = (top + 1).bit_length()
        if row_bits + max_n * bits + 1 > 63:
            return _ngram_match_counts_by_order(a, b, max_n)
    keys = _ngram_keys(ids_a, a.offsets, ids_b, b.offsets, max_n, bits)
    keys.sort(kind="stable")                    # two runs, each ordered by row: cheap for timsort
    in_b = np.zeros(total + 1, dtype=np.int64)  # side-b keys before each position
    np.cumsum(keys & 1, out=in_b[1:])
    change = keys[1:] ^ keys[:-1]               # the highest differing bit tells the shortest differing prefix
    rows = keys >> (max_n * bits + 1)
    new = np.ones(total + 1, dtype=bool)
    out = []
    for k in range(1, max_n + 1):
        np.greater_equal(change, 1 << ((max_n - k) * bits + 1), out=new[1:total])   # a new k-gram starts
        starts = np.flatnonzero(new)                                                # and the end, total
        nb = np.diff(in_b[starts])
        shared = np.diff(starts)
        shared -= nb
        np.minimum(shared, nb, out=shared)
        out.append(np.bincount(rows[starts[:-1]], weights=shared, minlength=n_rows).astype(np.int64))
    return out


def _ngram_match_counts_by_order(a: TokenColumn, b: TokenColumn, max_n: int) -> list[np.ndarray]:
    """ngram_match_counts for any sizes: one sort per order, (n-1)-gram groups refined by the next token."""
    n_rows = len(a)
    row = np.concatenate([_rows_of(a.offsets), _rows_of(b.offsets)])
    side = np.concatenate([np.zeros(len(a.ids), dtype=bool), np.ones(len(b.ids), dtype=bool)])
    tok = np.concatenate([a.ids, b.ids]).astype(np.int64)
    rem = np.concatenate([np.repeat(a.offsets[1:], a.lengths) - np.arange(len(a.ids)),
                          np.repeat(b.offsets[1:], b.lengths) - np.arange(len(b.ids))])
    vocab = max(len(a.vocab), 1)
    perm = np.arange(len(tok), dtype=np.int64)
    gid = row                                               # the (n-1)-gram's group; the row for n = 1
    out = []
    for n in range(1, max_n + 1):
        valid = rem[perm] >= n
        perm, gid = perm[valid], gid[valid]
        key = gid * vocab + tok[perm + (n - 1)]
        order = np.argsort(key, kind="stable")
        key, perm = key[order], perm[order]
        new = np.ones(len(key), dtype=bool)
        np.not_equal(key[1:], key[:-1], out=new[1:])
        gid = np.cumsum(new, dtype=np.int64) - 1
        groups = int(gid[-1]) + 1 if len(gid) else 0
        nb = np.bincount(gid[side[perm]], minlength=groups)
        size = np.diff(np.append(np.flatnonzero(new), len(key)))
        shared = np.minimum(size - nb, nb)
        out.append(np.bincount(row[perm[new]], weights=shared, minlength=n_rows).astype(np.int64))
    return out


def ngram_overlap_batch(len_a: np.ndarray, len_b: np.ndarray, matches: np.ndarray, n: int) -> np.ndarray:
    """ngram_overlap per row from the token counts and ngram_match_counts' order-N counts."""
    shorter = np.minimum(np.maximum(len_a - n + 1, 0), np.maximum(len_b - n + 1, 0))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(shorter > 0, matches / shorter, 0.0)


def sentence_bleu_batch(len_hyp: np.ndarray, len_ref: np.ndarray, matches: list[np.ndarray],
                        max_n: int = 4) -> np.ndarray:
    """sentence_bleu (BLEU+1) per row from the token counts and ngram_match_counts' counts of orders
    1..MAX_N: sacrebleu's BLEU.compute_bleu arithmetic with add-k 1, plus one to the unigram matches
    and total and to the reference length; 0.0 when a side is empty."""
    len_hyp = np.asarray(len_hyp, dtype=np.int64)
    len_ref = np.asarray(len_ref, dtype=np.int64)
    log_sum = np.zeros(len(len_hyp), dtype=np.float64)
    for n in range(1, max_n + 1):               # every order has a match and a total once smoothed
        correct = matches[n - 1] + 1
        total = np.maximum(len_hyp - n + 1, 0) + 1
        log_sum = log_sum + np.log(100.0 * correct / total)
    ref_len = len_ref + 1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bp = np.where(len_hyp < ref_len, np.exp(1 - ref_len / len_hyp), 1.0)
        score = bp * np.exp(log_sum / max_n) / 100
    return np.where((len_hyp > 0) & (len_ref > 0), score, 0.0)


def length_ratio_batch(len_a: np.ndarray, len_b: np.ndarray) -> np.ndarray:
    """Longer side's tokens / shorter side's per row: inf with one empty side, 1.0 with two."""
    lo, hi = np.minimum(len_a, len_b), np.maximum(len_a, len_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(lo > 0, hi / np.maximum(lo, 1), np.where(hi > 0, math.inf, 1.0))
