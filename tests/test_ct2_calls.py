"""How the CTranslate2 engine splits sampling requests into calls (models/nmt/engines/ct2_engine.py): a request
with banned words alone, since suppress_sequences applies to a whole call; requests without
batched only when their sample count and length limit agree, so that no sample depends on what it
was batched with."""
from models.nmt.engines.ct2_engine import _call_groups, _never_generated
from models.nmt.engine import SampleRequest


def _r(key, banned=(), n=5):
    return SampleRequest(f"source {key}", key, banned, n)


def test_banned_requests_are_alone_and_the_rest_batched_when_they_agree():
    requests = [_r("a"), _r("b"), _r("c", ("x",)), _r("d"), _r("e", n=3), _r("f", n=0), _r("g", n=3), _r("h", n=3)]
    limits = [10, 10, 10, 10, 10, 10, 12, 12]
    assert _call_groups(requests, limits) == [[0, 1], [2], [3], [4], [6, 7]]
    assert _call_groups([_r(str(i)) for i in range(5)], [7] * 5, size=2) == [[0, 1], [2, 3], [4]]
    assert [i for g in _call_groups(requests, limits) for i in g] == [0, 1, 2, 3, 4, 6, 7]     # order kept


def test_special_and_language_tokens_are_never_generated():
    assert all(_never_generated(t, "marian") for t in ("<s>", "<pad>", "<unk>", "<blank>"))
    assert not _never_generated("</s>", "marian") and not _never_generated("▁house", "marian")
    assert _never_generated("__en__", "m2m100") and _never_generated("madeupword3", "m2m100")
    assert _never_generated("eng_Latn", "nllb") and not _never_generated("eng_Latn", "m2m100")
    assert not _never_generated("__en__", "fairseq")
