"""models/nmt/bans.py: the banned tokens its tensors find for each row are exactly those a direct
check of the row's last tokens against each phrase finds."""
import random

import torch

from models.nmt.bans import BanTable, compact


def _direct(phrases, history):
    """Tokens a row with HISTORY may not write next."""
    out = []
    for p in phrases:
        if len(p) == 1 or (len(history) >= len(p) - 1 and tuple(history[len(history) - len(p) + 1:]) == p[:-1]):
            out.append(p[-1])
    return sorted(out)


def test_banned_tokens_match_a_direct_check_of_every_phrase():
    rnd = random.Random(0)
    vocab = 12                                                 # small, so prefixes often match
    requests = [[tuple(rnd.randrange(4, vocab) for _ in range(rnd.randint(1, 4))) for _ in range(rnd.randint(0, 7))]
                for _ in range(9)]
    table = BanTable.build(requests, "cpu")
    lmax = table.prefix_len
    rows = [rnd.randrange(len(requests)) for _ in range(200)]
    histories = [[rnd.randrange(4, vocab) for _ in range(rnd.randint(0, 6))] for _ in rows]
    window = torch.full((len(rows), lmax), -2, dtype=torch.long)      # -2: before the first token
    for i, h in enumerate(histories):
        tail = h[-lmax:] if lmax else []
        if tail:
            window[i, lmax - len(tail):] = torch.tensor(tail)
    got = table.banned(torch.tensor(rows), window)
    hits = 0
    for i, (r, h) in enumerate(zip(rows, histories)):
        want = _direct(requests[r], h)
        assert sorted(t for t in got[i].tolist() if t >= 0) == want, (requests[r], h)
        hits += len(want)
    assert hits > 50
    # Before the first token only one-piece phrases apply.
    first = table.banned(torch.tensor(rows), None)
    for i, r in enumerate(rows):
        assert sorted(t for t in first[i].tolist() if t >= 0) == sorted(p[0] for p in requests[r] if len(p) == 1)


def test_compact_keeps_every_ban_in_fewer_columns():
    banned = torch.tensor([[-1, 5, -1, 7, -1], [-1, -1, -1, -1, 3], [-1] * 5])
    small = compact(banned, 2)
    assert small.shape == (3, 2)
    for row, full in zip(small.tolist(), banned.tolist()):
        assert sorted(t for t in row if t >= 0) == sorted(t for t in full if t >= 0)


def test_requests_without_phrases_and_one_piece_only_tables():
    table = BanTable.build([[], [(5,)], [(6,), (7,)]], "cpu")
    assert table.prefix_len == 0 and table.width == 2
    got = table.banned(torch.tensor([0, 1, 2]), None)
    assert [sorted(t for t in r if t >= 0) for r in got.tolist()] == [[], [5], [6, 7]]
