"""Sentence-embedding job: encoders, negative mining, training, STS evaluation, saving, data, lexicon.

Everything trains on the synthetic English paraphrases of tests/toydata.py; nothing reads ../shared.
"""
import math
import os
import random
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import pearsonr, spearmanr

from embeddings.data import PairSource, parse_where, scramble, shuffled
from embeddings.lexicon import adjusted_pmi
from embeddings.mining import hardest_negatives, margin_loss
from embeddings.sts import evaluate, markdown, read_sts_dir, sentence_bleu_similarity
from common.text import Vocabulary, char_trigrams, tokenize
from embeddings.train import TrainConfig, megabatch_step, train
from models.sentence.encoders import KINDS, parse_spec
from models.sentence.sentence_encoder import SentenceEncoder, load_encoder
from tests.toydata import toy_paraphrases, toy_sts
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = dict(progress=False)


def _encoder(spec, dim=16, seed=0, corpus=None):
    torch.manual_seed(seed)
    corpus = corpus or [s for p in toy_paraphrases(200, seed=1) for s in p]
    return SentenceEncoder.from_corpus(spec, corpus, dim=dim, device="cpu")


def _write_sts(root, rows_by_subset):
    for name, rows in rows_by_subset.items():
        path = root / f"{name}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{g}\t{a}\t{b}\n" for g, a, b in rows), encoding="utf-8")
    return str(root)


# ------------------------------------------------------------------ text and encoders

def test_tokenize_and_trigrams_treat_hostile_text():
    assert tokenize("A man's HAT, isn't it?") == ["a", "man's", "hat", ",", "isn't", "it", "?"]
    assert tokenize("a\x00b\x1fc") == ["a", "b", "c"]                 # control characters split
    assert len(tokenize("word " * 100_000)) == 100                     # capped, and fast
    assert char_trigrams("a") == ("#a#",)
    assert char_trigrams("dog") == ("#do", "dog", "og#")
    v = Vocabulary.build({"b": 3, "a": 3, "c": 1}, min_count=2)
    assert v.items == ["<pad>", "<unk>", "a", "b"] and v.ids(["b", "zzz", "c"]) == [3, 1, 1]
    assert Vocabulary.from_json(v.to_json()).items == v.items
    with pytest.raises(ValueError):
        Vocabulary.from_json('{"not": "a list"}')


@pytest.mark.parametrize("spec,dim_factor", [("word", 1), ("trigram", 1), ("lstm", 1), ("blstm", 1), ("gran", 1),
                                             ("word+trigram", 2), ("word+trigram:add", 1), ("word+lstm+gran", 3)])
def test_encoder_output_shapes(spec, dim_factor):
    enc = _encoder(spec, dim=16)
    sentences = ["A man is sitting in the park .", "", "zzzz unseen qqqq", "a " * 300]
    out = enc.encode(sentences)
    assert out.shape == (4, 16 * dim_factor) and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert not np.allclose(out[0], out[2])
    # order of the input is kept although encode() sorts by length inside
    assert np.allclose(enc.encode(sentences[::-1])[::-1], out, atol=1e-6)


def test_trigram_encoder_embeds_unknown_words_by_their_pieces():
    enc = _encoder("trigram", dim=16)
    word_enc = _encoder("word", dim=16)
    unseen = ["parks", "streets"]                       # not words of the corpus; most of their trigrams are
    assert all(w not in enc.words.index for w in unseen)
    a, b = enc.encode(unseen)
    assert not np.allclose(a, b)
    wa, wb = word_enc.encode(unseen)                    # a word model sees two <unk>
    assert np.allclose(wa, wb)


def test_bad_specs_fail_clearly():
    for bad in ("bow", "word+word", "word:mul", ""):
        with pytest.raises(ValueError):
            parse_spec(bad)
    with pytest.raises(ValueError, match="equal output sizes"):
        SentenceEncoder.from_corpus("word+blstm:add", ["a b"], dim=15, hidden=4, device="cpu")
    assert set(KINDS) == {"word", "trigram", "lstm", "blstm", "gran"}


# ------------------------------------------------------------------ negative mining and loss

def _brute_force_negatives(e1, e2):
    pool = torch.cat([e1, e2])
    n = e1.size(0)
    picks = []
    for r in range(2 * n):
        best, best_j = -math.inf, None
        for j in range(2 * n):
            if j % n == r % n:
                continue
            c = F.cosine_similarity(pool[r], pool[j], dim=0).item()
            if c > best:
                best, best_j = c, j
        picks.append(best_j)
    return picks[:n], picks[n:]


def test_hardest_negative_is_the_masked_argmax_over_the_pool():
    g = torch.Generator().manual_seed(0)
    for n in (2, 3, 17, 60):
        e1, e2 = torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g)
        n1, n2 = hardest_negatives(e1, e2)
        b1, b2 = _brute_force_negatives(e1, e2)
        assert n1.tolist() == b1 and n2.tolist() == b2
        assert all(i % n != k for k, i in enumerate(n1.tolist()))     # never its own pair
    with pytest.raises(ValueError):
        hardest_negatives(torch.randn(1, 4), torch.randn(1, 4))


def test_margin_loss_by_hand():
    s1 = torch.tensor([[1.0, 0.0]])
    s2 = torch.tensor([[1.0, 1.0]])          # cos(s1, s2) = 0.7071
    n1 = torch.tensor([[0.0, 1.0]])          # cos(s1, n1) = 0
    n2 = torch.tensor([[1.0, 0.0]])          # cos(s2, n2) = 0.7071
    expect = max(0, 0.4 - 0.70711 + 0) + max(0, 0.4 - 0.70711 + 0.70711)
    assert margin_loss(s1, s2, n1, n2, 0.4).item() == pytest.approx(expect, abs=1e-4)


def _plain_in_batch_step(encoder, optimizer, toks, delta):
    """Reference: embed the batch, pick negatives by brute force over the batch, margin loss."""
    n = len(toks)
    e = encoder.embed_tokens([a for a, _ in toks] + [b for _, b in toks])
    b1, b2 = _brute_force_negatives(e[:n].detach(), e[n:].detach())
    loss = margin_loss(e[:n], e[n:], e[b1], e[b2], delta)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


@pytest.mark.slow
def test_megabatch_of_one_is_plain_in_batch_mining():
    pairs = toy_paraphrases(90, seed=5)
    encs = [_encoder("word+trigram", dim=12, seed=3) for _ in range(2)]
    opts = [torch.optim.Adam(e.module.parameters(), lr=1e-2) for e in encs]
    for step in range(3):
        chunk = pairs[30 * step:30 * (step + 1)]
        toks = [(tokenize(a), tokenize(b)) for a, b in chunk]
        ours = megabatch_step(encs[0], opts[0], toks, batch_size=30, delta=0.4)
        ref = _plain_in_batch_step(encs[1], opts[1], toks, 0.4)
        assert ours == [pytest.approx(ref, rel=1e-5)]
    for p, q in zip(encs[0].module.parameters(), encs[1].module.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_megabatch_mines_over_all_its_minibatches():
    pairs = toy_paraphrases(60, seed=6)
    toks = [(tokenize(a), tokenize(b)) for a, b in pairs]
    enc = _encoder("word", dim=12, seed=4)
    ref = _encoder("word", dim=12, seed=4)
    # negatives with the weights before the step, over the pool of all 3 mini-batches (120 sentences)
    with torch.no_grad():
        e = ref.embed_tokens([a for a, _ in toks] + [b for _, b in toks])
    b1, b2 = _brute_force_negatives(e[:60], e[60:])
    assert any(j % 60 >= 20 for j in b1[:20])         # some negatives come from other mini-batches
    pool = [a for a, _ in toks] + [b for _, b in toks]
    out = ref.embed_tokens([a for a, _ in toks[:20]] + [b for _, b in toks[:20]]
                           + [pool[j] for j in b1[:20]] + [pool[j] for j in b2[:20]])
    first = margin_loss(out[:20], out[20:40], out[40:60], out[60:], 0.4).item()
    losses = megabatch_step(enc, torch.optim.Adam(enc.module.parameters(), lr=1e-2), toks, batch_size=20, delta=0.4)
    assert len(losses) == 3 and losses[0] == pytest.approx(first, rel=1e-5)


# ------------------------------------------------------------------ data

def test_scramble_changes_order_not_the_bag():
    rng = random.Random(0)
    sents = [tokenize(a) for a, _ in toy_paraphrases(50, seed=2)]
    scrambled = [scramble(t, 1.0, rng) for t in sents]
    assert all(sorted(a) == sorted(b) for a, b in zip(sents, scrambled))
    assert sum(a != b for a, b in zip(sents, scrambled)) >= 45
    assert all(scramble(t, 0.0, rng) == t for t in sents)
    half = [scramble(t, 0.5, random.Random(i)) != t for i, t in enumerate(sents)]
    assert 10 <= sum(half) <= 40
    assert [scramble(t, 0.5, random.Random(9)) for t in sents] == [scramble(t, 0.5, random.Random(9)) for t in sents]


def test_streaming_shuffle_keeps_every_item():
    items = list(range(1000))
    out = list(shuffled(iter(items), 64, random.Random(0)))
    assert sorted(out) == items and out != items
    assert list(shuffled(iter(items), 64, random.Random(0))) == out


def _generation_like_parquet(root):
    from paracorpus.schema import PARAPHRASE_SCHEMA
    from tests.toydata import write_generation_run

    rows = []
    for i, (a, b) in enumerate(toy_paraphrases(40, seed=3)):
        row = {f.name: None for f in PARAPHRASE_SCHEMA}
        row.update(pair_id=f"p{i // 2}", reference=a, paraphrase=b, rank=1 + i % 2, combined_score=float(i % 5),
                   constraint_set=[], src_lang="cs", tgt_lang="en")
        rows.append(row)
    rows[3]["paraphrase"] = None                                       # a null side
    write_generation_run(root, rows, shards=2)
    return rows


def test_pair_source_reads_generation_parquet_with_filters(tmp_path):
    from paracorpus.schema import PARAPHRASE_SCHEMA
    from tests.toydata import write_generation_run

    rows = _generation_like_parquet(tmp_path)
    src = PairSource(str(tmp_path))                                    # the generate --output dir
    pairs = list(src)
    assert src.stats == {"read": 40, "used": 39, "skipped_empty_side": 1}
    assert src.generation_manifest["counts"] == {"reconciled": True}
    assert PairSource(str(tmp_path / "paraphrases")).generation_manifest == src.generation_manifest
    # a file no manifest lists (an abandoned attempt's) is never read
    stray = tmp_path / "paraphrases" / "cs-en" / "00000" / "part-u000009-deadbeef.parquet"
    pq.write_table(pa.Table.from_pylist(rows[:4], schema=PARAPHRASE_SCHEMA), stray)
    assert sorted(PairSource(str(tmp_path))) == sorted(pairs)
    # a run directory without its manifest is refused, not read
    os.remove(tmp_path / "_manifest.json")
    with pytest.raises(ValueError, match="without its manifest"):
        PairSource(str(tmp_path))
    write_generation_run(tmp_path, rows, shards=2)
    assert sorted(pairs) == sorted((r["reference"], r["paraphrase"]) for r in rows if r["paraphrase"])
    best = PairSource(str(tmp_path / "paraphrases"), where=["rank<=1", "combined_score < 3"])
    expect = [r for r in rows if r["rank"] <= 1 and r["combined_score"] < 3 and r["paraphrase"]]
    assert sorted(best) == sorted((r["reference"], r["paraphrase"]) for r in expect)
    assert len(list(PairSource(str(tmp_path), where=["lang_pair == 'cs-en'"]))) == 39   # partition column
    assert list(PairSource(str(tmp_path), max_pairs=5)).__len__() == 5
    with pytest.raises(ValueError, match="no column 'keep'"):
        PairSource(str(tmp_path), where=["keep == true"])
    with pytest.raises(ValueError, match="unsupported expression"):
        PairSource(str(tmp_path), where=["rank << 2"])
    with pytest.raises(ValueError, match="no column"):
        PairSource(str(tmp_path), columns=("reference", "nope"))


def test_parse_where_literals():
    schema = pa.schema([("keep", pa.bool_()), ("score", pa.float32()), ("lang", pa.string())])
    t = pa.table({"keep": [True, False, True], "score": [0.1, 0.5, 0.9], "lang": ["a", "b", "a"]})
    expr = parse_where(["keep == true", "score>=0.5", "lang != \"b\""], schema)
    assert pa.dataset.dataset(t).to_table(filter=expr).num_rows == 1   # only the third row


def test_pair_source_tsv_counts_bad_lines(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_bytes(b"a man sits .\ta guy sits .\nno tab here\nx\ty\tz\n\xff\xfe bad\tutf8\n"
                     b"a dog runs .\t  \n" + b"w " * 60_000 + b"\tlong\n"
                     b"a cat sleeps .\ta cat is sleeping .\r\n")
    src = PairSource(str(path))
    assert list(src) == [("a man sits .", "a guy sits ."), ("a cat sleeps .", "a cat is sleeping .")]
    assert src.stats == {"read": 3, "used": 2, "skipped_empty_side": 1, "skipped_not_two_columns": 2,
                         "skipped_bad_utf8": 1, "skipped_overlong": 1}
    with pytest.raises(ValueError, match="Parquet"):
        PairSource(str(path), where=["rank<=1"])
    with pytest.raises(FileNotFoundError):
        PairSource(str(tmp_path / "missing.tsv"))


# ------------------------------------------------------------------ STS evaluation

def test_sts_evaluation_reproduces_scipy(tmp_path):
    rng = random.Random(0)
    data = {f"{y}/{s}": [(round(rng.uniform(0, 5), 2), f"w{rng.randrange(9)} x", f"w{rng.randrange(9)} y")
                         for _ in range(12)] for y, s in (("2031", "alpha"), ("2031", "beta"), ("news", "gamma"))}
    root = _write_sts(tmp_path / "sts", data)
    with open(tmp_path / "sts" / "news" / "gamma.tsv", "a", encoding="utf-8") as f:
        f.write("not-a-score\ta\tb\nonly two\tfields\n")                 # malformed: skipped, counted

    def sim(s1, s2):                                                   # a fixed, deterministic scorer
        return np.array([int(a[1]) - 0.5 * int(b[1]) for a, b in zip(s1, s2)], dtype=float)

    res = evaluate(sim, root)
    for name, rows in data.items():
        gold = [g for g, _, _ in rows]
        pred = sim([a for _, a, _ in rows], [b for _, _, b in rows])
        assert res["subsets"][name]["pearson"] == pytest.approx(100 * pearsonr(pred, gold)[0])
        assert res["subsets"][name]["spearman"] == pytest.approx(100 * spearmanr(pred, gold)[0])
        assert res["subsets"][name]["n"] == 12
    assert res["subsets"]["news/gamma"]["skipped"] == 2
    y2031 = (res["subsets"]["2031/alpha"]["pearson"] + res["subsets"]["2031/beta"]["pearson"]) / 2
    assert res["years"]["2031"]["pearson"] == pytest.approx(y2031)
    assert res["mean_of_year_means"]["pearson"] == pytest.approx((y2031 + res["subsets"]["news/gamma"]["pearson"]) / 2)
    assert res["mean_of_subsets"]["spearman"] == pytest.approx(
        np.mean([res["subsets"][n]["spearman"] for n in data]))
    table = markdown(res)
    assert "| 2031/alpha | 12 |" in table and "mean of yearly means" in table
    # one year's directory and one file are accepted too
    assert list(read_sts_dir(str(tmp_path / "sts" / "2031"))) == ["2031"]
    assert [s.name for s in read_sts_dir(str(tmp_path / "sts" / "news" / "gamma.tsv"))["news"]] == ["news/gamma"]
    with pytest.raises(ValueError):
        read_sts_dir(str(tmp_path / "sts" / "2031" / ".." / ".."))           # no <year>/<subset>.tsv


def test_sentence_bleu_baseline_orders_similarity():
    same, close, far = sentence_bleu_similarity(["a man is sitting in the park ."] * 3,
                                                ["a man is sitting in the park .", "a man sits in the park .",
                                                 "the dog runs on the beach ."])
    assert same == pytest.approx(100) and same > close > far


# ------------------------------------------------------------------ training, saving

def _sts_dir(tmp_path):
    return _write_sts(tmp_path / "sts", {"toy/dev": toy_sts(200, seed=7)})


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["word", "trigram", "gran", "word+trigram"])
def test_training_lowers_loss_and_improves_sts(tmp_path, spec):
    pairs = toy_paraphrases(1500, seed=0)
    sts = _sts_dir(tmp_path)
    untrained = evaluate(_encoder(spec, dim=32, corpus=[s for p in pairs for s in p]).similarity, sts)
    rep = train(pairs, str(tmp_path / "m"), TrainConfig(encoder=spec, dim=32, epochs=3, **QUIET), sts,
                log=lambda m: None)
    losses = [e["loss"] for e in rep["epochs"]]
    assert losses[-1] < losses[0]
    best = max(e["dev_pearson"] for e in rep["epochs"])
    assert best > untrained["mean_of_subsets"]["pearson"] + 5
    assert rep["best_epoch"] == max(rep["epochs"], key=lambda e: e["dev_pearson"])["epoch"]
    for epoch in (1, 2, 3):
        assert os.path.isfile(tmp_path / "m" / "checkpoints" / f"epoch-{epoch}" / "weights.pt")


@pytest.mark.slow
def test_saved_model_reloads_identically_and_training_is_seeded(tmp_path):
    pairs = toy_paraphrases(400, seed=1)
    cfg = dict(encoder="word+trigram", dim=16, epochs=2, megabatch=2, **QUIET)
    train(pairs, str(tmp_path / "a"), TrainConfig(**cfg), log=lambda m: None)
    train(pairs, str(tmp_path / "b"), TrainConfig(**cfg), log=lambda m: None)
    train(pairs, str(tmp_path / "c"), TrainConfig(**cfg, seed=2), log=lambda m: None)
    sents = [a for a, _ in pairs[:50]]
    a, b, c = (load_encoder(str(tmp_path / x)).encode(sents) for x in "abc")
    assert np.array_equal(a, b) and not np.allclose(a, c)
    enc = load_encoder(str(tmp_path / "a"))
    enc.save(str(tmp_path / "copy"))
    assert np.array_equal(load_encoder(str(tmp_path / "copy")).encode(sents), a)
    assert enc.config()["training"]["encoder"] == "word+trigram"


def test_loading_refuses_pickled_objects_and_incomplete_dirs(tmp_path):
    import pickle

    train(toy_paraphrases(100, seed=1), str(tmp_path / "m"), TrainConfig(dim=8, epochs=1, **QUIET), log=lambda m: None)
    os.remove(tmp_path / "m" / "trigrams.json")
    with pytest.raises(FileNotFoundError, match="trigrams.json"):
        load_encoder(str(tmp_path / "m"))
    train(toy_paraphrases(100, seed=1), str(tmp_path / "n"), TrainConfig(dim=8, epochs=1, **QUIET), log=lambda m: None)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    with open(tmp_path / "n" / "weights.pt", "wb") as f:
        pickle.dump({"x": Evil()}, f)
    from models.safety import UnsafeModelError

    with pytest.raises(UnsafeModelError, match="refused: it holds pickled Python objects"):
        load_encoder(str(tmp_path / "n"))


def test_train_config_is_validated():
    for bad in (dict(batch_size=1), dict(megabatch=0), dict(scramble_rate=1.5), dict(encoder="bow"), dict(lr=0)):
        with pytest.raises(ValueError):
            TrainConfig(**bad).validate()


# ------------------------------------------------------------------ lexicon

def test_adjusted_pmi_finds_the_synonyms():
    pairs = toy_paraphrases(3000, seed=4)
    rows, stats = adjusted_pmi(pairs, min_count=5)
    assert stats["used"] == 3000
    score = {(r["word1"], r["word2"]): r["adjusted_pmi"] for r in rows}
    top = [(r["word1"], r["word2"]) for r in rows[:25]]
    # the toy corpus's synonyms and inflection swaps (sits/sitting) head the list
    for synonyms in (("guy", "man"), ("lady", "woman"), ("child", "kid"), ("road", "street"), ("city", "town"),
                     ("sits", "sitting"), ("elderly", "old")):
        assert synonyms in top and score[synonyms] > 3, (synonyms, top)
    assert score[("park", "woman")] < 1                                 # words that merely co-occur
    r = next(r for r in rows if (r["word1"], r["word2"]) == ("lady", "woman"))
    assert r["adjusted_pmi"] == pytest.approx(r["cross_pmi"] - r["ordinary_pmi"])


def test_lexicon_drops_long_sentences_and_low_scores():
    pairs = toy_paraphrases(50, seed=4) + [(" ".join(["w"] * 31), "short one")]
    _, stats = adjusted_pmi(pairs, max_tokens=30)
    assert stats["dropped_length"] == 1 and stats["used"] == 50

    class Scorer:                       # encoder stand-in with a fixed similarity: drops half
        def similarity(self, s1, s2):
            return np.array([0.9 if i % 2 else 0.1 for i in range(len(s1))])

    _, stats = adjusted_pmi(pairs[:50], encoder=Scorer(), min_score=0.5)
    assert stats["used"] == 25 and stats["dropped_low_score"] == 25


# ------------------------------------------------------------------ command lines

def _cli(module, *args, timeout=300):
    return warm_python.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)


@pytest.mark.slow
def test_cli_train_sts_lexicon_end_to_end(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{a}\t{b}\n" for a, b in toy_paraphrases(600, seed=8)), encoding="utf-8")
    sts = _sts_dir(tmp_path)
    r = _cli("embeddings.train", "--input", str(tsv), "--output", str(tmp_path / "m"), "--encoder", "word+trigram",
             "--dim", "16", "--epochs", "2", "--dev_sts", sts, "--no_progress")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "epoch 2: loss" in r.stdout and "dev STS Pearson" in r.stdout
    r = _cli("embeddings.sts", "--model", str(tmp_path / "m"), "--sts_dir", sts, "--json", str(tmp_path / "s.json"))
    assert r.returncode == 0 and "| toy/dev | 200 |" in r.stdout
    r = _cli("embeddings.lexicon", "--input", str(tsv), "--model", str(tmp_path / "m"), "--min_score", "0.0",
             "--output", str(tmp_path / "lex.tsv"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "lex.tsv").read_text().startswith("word1\tword2\tadjusted_pmi")


@pytest.mark.slow
def test_cli_errors_are_clear(tmp_path):
    r = _cli("embeddings.train", "--help")
    assert r.returncode == 0 and "--megabatch" in r.stdout and "--where" in r.stdout
    r = _cli("embeddings.train", "--input", str(tmp_path / "none.tsv"), "--output", str(tmp_path / "m"))
    assert r.returncode == 2 and "error:" in r.stderr
    r = _cli("embeddings.train", "--input", str(tmp_path), "--output", str(tmp_path / "m"), "--encoder", "bow")
    assert r.returncode == 2 and "unknown encoder" in r.stderr
    r = _cli("embeddings.sts", "--baseline", "sentence_bleu", "--sts_dir", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "does not exist" in r.stderr
