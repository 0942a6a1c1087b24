"""models/nmt/decoding/bans.py: the banned tokens its tensors find for each row are exactly those a direct
check of the row's last tokens against each phrase finds."""
import random

import torch

from models.nmt.decoding.bans import BanTable, PhrasePack, compact


def _direct(phrases, history):
    """Tokens a row with HISTORY may not write next."""
    out = []
    for p in phrases:
        if len(p) == 1 or (len(history) >= len(p) - 1 and tuple(history[len(history) - len(p) + 1:]) == p[:-1]):
            out.append(p[-1])
    return sorted(set(out))


def _random_requests(rnd, vocab):
    return [[tuple(rnd.randrange(4, vocab) for _ in range(rnd.randint(1, 4))) for _ in range(rnd.randint(0, 7))]
            for _ in range(9)]


def _assert_direct_bans(table, requests, rnd, vocab):
    """TABLE's bans for random rows of REQUESTS, step by step, are those of a direct check."""
    rows = [rnd.randrange(len(requests)) for _ in range(200)]
    histories = [[rnd.randrange(4, vocab) for _ in range(rnd.randint(0, 6))] for _ in rows]
    requests_t = torch.tensor(rows)
    state = table.start(len(rows), "cpu")
    # Rows advance together: a row whose history is shorter stops being checked after it.
    got = {}
    for step in range(max(map(len, histories)) + 1):
        banned = table.banned(requests_t, state if step else None)
        for i, h in enumerate(histories):
            if len(h) == step:
                got[i] = banned[i]
        token = torch.tensor([h[step] if step < len(h) else 4 for h in histories])
        state = table.advance(state, requests_t, token)
    hits = 0
    for i, (r, h) in enumerate(zip(rows, histories)):
        want = _direct(requests[r], h)
        assert sorted({t for t in got[i].tolist() if t >= 0}) == want, (requests[r], h)
        assert table.width >= len(want)
        hits += len(want)
    assert hits > 50
    # Before the first token only one-piece phrases apply.
    first = table.banned(torch.tensor(rows), None)
    for i, r in enumerate(rows):
        assert sorted(t for t in first[i].tolist() if t >= 0) == sorted({p[0] for p in requests[r] if len(p) == 1})


def test_banned_tokens_match_a_direct_check_of_every_phrase():
    rnd = random.Random(0)
    vocab = 12                                                 # small, so prefixes often match
    requests = _random_requests(rnd, vocab)
    _assert_direct_bans(BanTable.build(requests, vocab, "cpu"), requests, rnd, vocab)


def test_tables_from_word_packs_merge_the_words_of_a_request():
    """A request's phrases arrive as one pack a word (the sampler's path): words that share
    prefixes, or the same phrase, must still make one trie whose bans are the direct check's."""
    rnd = random.Random(1)
    vocab = 12
    requests = _random_requests(rnd, vocab)
    packs = []
    for phrases in requests:
        words = [[] for _ in range(rnd.randint(1, 3))]
        for p in phrases:
            for w in rnd.sample(range(len(words)), rnd.randint(1, len(words))):   # a phrase in 1+ words
                words[w].append(p)
        packs.append([PhrasePack.of(w) for w in words])
    table = BanTable.from_packs(packs, vocab, "cpu")
    _assert_direct_bans(table, requests, rnd, vocab)
    one = BanTable.build(requests, vocab, "cpu")
    for name in ("edge_key", "edge_child", "emits", "single"):
        assert torch.equal(getattr(table, name), getattr(one, name)), name
    assert not PhrasePack.of([]) and PhrasePack.of([(5,)]) and PhrasePack.of([(5, 6)])


def test_compact_keeps_every_ban_in_fewer_columns():
    banned = torch.tensor([[-1, 5, -1, 7, -1], [-1, -1, -1, -1, 3], [-1] * 5])
    small = compact(banned, 2)
    assert small.shape == (3, 2)
    for row, full in zip(small.tolist(), banned.tolist()):
        assert sorted(t for t in row if t >= 0) == sorted(t for t in full if t >= 0)


def test_requests_without_phrases_and_one_piece_only_tables():
    table = BanTable.build([[], [(5,)], [(6,), (7,)]], 12, "cpu")
    assert table.depth == 0 and table.width == 2 and table.start(3, "cpu") is None
    got = table.banned(torch.tensor([0, 1, 2]), None)
    assert [sorted(t for t in r if t >= 0) for r in got.tolist()] == [[], [5], [6, 7]]


def test_overlapping_and_late_matches_are_found():
    """A match that starts inside an earlier partial match ("5 5 5" ends with the prefix "5 5"),
    and one after a long history that no phrase covers, as a one-pointer matcher would miss."""
    phrases = [(5, 5, 6), (5, 7, 8, 9), (7, 8, 10)]
    table = BanTable.build([phrases], 12, "cpu")
    for history, want in (([5, 5, 5], [6]), ([4, 4, 4, 4, 4, 4, 5, 7, 8], [9, 10]), ([5, 7], []),
                          ([5, 5, 7, 8], [9, 10]), ([6, 5, 5, 5, 5], [6])):
        state, req = table.start(1, "cpu"), torch.tensor([0])
        for token in history:
            state = table.advance(state, req, torch.tensor([token]))
        assert sorted(t for t in table.banned(req, state).tolist()[0] if t >= 0) == want, history
        assert want == _direct(phrases, history)


def test_tokens_outside_the_vocabulary_are_refused():
    """A token id >= vocab would make two edges' keys collide (and ban the wrong tokens)."""
    import pytest

    with pytest.raises(ValueError, match="must lie in"):
        BanTable.build([[(3, 12)]], 12, "cpu")
    with pytest.raises(ValueError, match="must lie in"):
        BanTable.build([[(-1, 4)]], 12, "cpu")
