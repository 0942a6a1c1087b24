"""models.nmt.train: sentencepiece + fairseq training recipe, its output layout and BLEU.

The tiny cs-en / en-cs models come from the session fixture ``tiny_nmt_models`` (conftest.py),
trained once on the synthetic bitext of tests/toydata.py. Nothing here reads ../shared.
"""
import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys

import pytest

from common.text import train_spm
from models.nmt.train import evaluate_bleu, hold_out, read_bitext
from tests.toydata import toy_bitext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRS = {"cs-en": ("cs", "en"), "en-cs": ("en", "cs")}


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "models.nmt.train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


# ---------------------------------------------------------------- no training needed

@pytest.mark.slow
def test_cli_help_exits_0():
    r = _cli("--help", timeout=60)
    assert r.returncode == 0, r.stderr
    for option in ("--src_file", "--tsv", "--vocab_size", "--directions", "--cpu_threads", "--bleu_samples"):
        assert option in r.stdout


@pytest.mark.slow
def test_cli_rejects_half_given_files(tmp_path):
    assert _cli("--src_file", "a.cs", "--output", str(tmp_path), timeout=60).returncode == 2
    r = _cli("--tsv", "a.tsv", "--valid_src_file", "v.cs", "--output", str(tmp_path), timeout=60)
    assert r.returncode == 2 and "valid_tgt_file" in r.stderr


def test_fairseq_compat_usage_error():
    r = subprocess.run([sys.executable, "-m", "models.nmt.model_files.fairseq_compat", "bogus"], cwd=ROOT,
                       capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "usage" in r.stderr


def test_read_bitext_plain_gz_tsv_and_cleaning(tmp_path, caplog):
    src, tgt = tmp_path / "t.cs.gz", tmp_path / "t.en"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("Muž  sedí .\n \n Pes\tběží .\nDítě spí .\n")
    tgt.write_text("A man sits .\nempty source\nA dog runs .\n   \n", encoding="utf-8")
    assert read_bitext(src_file=str(src), tgt_file=str(tgt)) == [("Muž sedí .", "A man sits ."),
                                                                 ("Pes běží .", "A dog runs .")]
    assert read_bitext(src_file=str(src), tgt_file=str(tgt), max_lines=1) == [("Muž sedí .", "A man sits .")]
    tsv = tmp_path / "t.tsv.gz"
    with gzip.open(tsv, "wt", encoding="utf-8") as f:
        f.write("Muž sedí .\tA man  sits .\n\tno source\nno tab\nPes běží .\tA dog runs .\r\n"
                + "x " * 60_000 + "\ty\n")                              # an overlong line
    assert read_bitext(tsv=str(tsv)) == [("Muž sedí .", "A man sits ."), ("Pes běží .", "A dog runs .")]
    assert "skipped 3 of 5 lines" in caplog.text                      # counted, not silent
    short = tmp_path / "short.en"
    short.write_text("one\n", encoding="utf-8")
    with pytest.raises(ValueError, match="lines"):
        read_bitext(src_file=str(src), tgt_file=str(short))


def test_hold_out_is_seeded_disjoint_and_capped():
    pairs = toy_bitext(300, seed=1)
    train, valid = hold_out(pairs, 500, seed=1)
    assert len(valid) == 30 and len(train) == 270                     # capped to 10 %
    assert hold_out(pairs, 500, seed=1) == (train, valid)             # deterministic
    assert hold_out(pairs, 500, seed=2)[1] != valid
    assert sorted(train + valid) == sorted(pairs)
    assert len(hold_out(pairs, 7, seed=1)[1]) == 7
    assert len(hold_out(pairs[:5], 500, seed=1)[1]) == 1              # never empty


def test_toy_bitext_is_varied_and_deterministic():
    pairs = toy_bitext(2000, seed=0)
    assert pairs == toy_bitext(2000, seed=0) and pairs != toy_bitext(2000, seed=1)
    english = {en for _, en in pairs}
    assert len(english) >= 500
    assert all(4 <= len(en.split()) <= 12 for en in english)


def test_sentencepiece_vocab_size_adapts_to_tiny_corpora(tmp_path):
    import sentencepiece as spm

    texts = [s for pair in toy_bitext(20, seed=4) for s in pair]
    big = spm.SentencePieceProcessor(model_file=train_spm(texts, str(tmp_path / "big"), 8000))
    assert 20 < len(big) < 8000                                       # shrank instead of failing
    small = spm.SentencePieceProcessor(model_file=train_spm(texts, str(tmp_path / "small"), 5))
    assert len(small) > 5                                             # grew to the character set
    assert small.decode(small.encode(texts[0])) == texts[0]
    assert not list(tmp_path.glob("*.train.txt"))                     # temporary input removed


# ---------------------------------------------------------------- tiny trained models

@pytest.mark.slow
def test_output_layout(tiny_nmt_models):
    out = tiny_nmt_models
    for name in ("spm.model", "spm.vocab", "report.json", "data-bin/dict.cs.txt", "data-bin/dict.en.txt",
                 "data-bin/train.cs-en.cs.bin", "data-bin/train.cs-en.en.idx", "data-bin/valid.cs-en.en.bin"):
        assert os.path.isfile(os.path.join(out, name)), name
    spm_bytes = open(os.path.join(out, "spm.model"), "rb").read()
    for name, (src, tgt) in DIRS.items():
        model_dir = os.path.join(out, name)
        assert sorted(os.listdir(model_dir)) == sorted(
            ["model.pt", f"dict.{src}.txt", f"dict.{tgt}.txt", "spm.model", "model.json"])
        assert open(os.path.join(model_dir, "spm.model"), "rb").read() == spm_bytes
        meta = json.load(open(os.path.join(model_dir, "model.json")))
        assert (meta["src_lang"], meta["tgt_lang"], meta["arch"]) == (src, tgt, "transformer")
        assert (meta["layers"], meta["dim"]) == (1, 64)
        assert meta["train_pairs"] + meta["valid_pairs"] == 1500 and meta["valid_pairs"] == 50
        assert isinstance(meta["bleu"], float) and 0.0 <= meta["bleu"] <= 100.0
        assert "tok:13a" in meta["bleu_signature"] and "nrefs:1" in meta["bleu_signature"]
        assert meta["train_seconds"] > 0
    # no training leftovers
    assert not [n for n in os.listdir(out) if n.startswith("checkpoints-") or n == "tok"]
    report = json.load(open(os.path.join(out, "report.json")))
    assert set(report["directions"]) == set(DIRS)
    assert report["directions"]["cs-en"]["bleu"] == json.load(open(os.path.join(out, "cs-en", "model.json")))["bleu"]
    assert {"sentencepiece", "preprocess", "train-cs-en", "train-en-cs"} <= set(report["stage_seconds"])


@pytest.mark.slow
def test_checkpoint_loads_with_weights_only(tiny_nmt_models):
    import torch

    from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints

    path = os.path.join(tiny_nmt_models, "cs-en", "model.pt")
    # The one non-tensor class a fairseq-fixed checkpoint pickles is argparse.Namespace.
    assert set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) <= {"argparse.Namespace"}
    allow_fairseq_checkpoints()
    allow_fairseq_checkpoints()                                       # idempotent
    assert argparse.Namespace in torch.serialization.get_safe_globals()
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert "last_optimizer_state" not in state                        # exported without optimizer
    weights = state["model"]
    assert weights["encoder.embed_tokens.weight"].shape[1] == 64
    # --share-all-embeddings: one joint table
    assert weights["encoder.embed_tokens.weight"].data_ptr() == weights["decoder.embed_tokens.weight"].data_ptr() \
        or torch.equal(weights["encoder.embed_tokens.weight"], weights["decoder.embed_tokens.weight"])


@pytest.mark.slow
def test_joined_dictionary_holds_sentencepiece_pieces(tiny_nmt_models):
    import sentencepiece as spm

    out = tiny_nmt_models
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))
    pieces = {sp.id_to_piece(i) for i in range(len(sp))}
    dict_cs = open(os.path.join(out, "data-bin", "dict.cs.txt"), encoding="utf-8").read()
    assert dict_cs == open(os.path.join(out, "data-bin", "dict.en.txt"), encoding="utf-8").read()  # joined
    entries = [line.rsplit(" ", 1)[0] for line in dict_cs.splitlines()]
    entries = [e for e in entries if not re.fullmatch(r"madeupword\d{4}", e)]  # fairseq's padding to x8
    assert entries and set(entries) <= pieces
    assert sum(e.startswith("\u2581") and len(e) > 1 for e in entries) >= 10   # word-initial pieces
    # Czech and English pieces share the one dictionary (the toy Czech has no "w", English no "ě")
    assert any("ě" in e for e in entries) and any("w" in e for e in entries)
    for name, (src, tgt) in DIRS.items():
        assert open(os.path.join(out, name, f"dict.{src}.txt"), encoding="utf-8").read() == dict_cs


@pytest.mark.slow
def test_binarized_data_decodes_to_the_sentences(tiny_nmt_models):
    import sentencepiece as spm
    from fairseq.data import Dictionary, data_utils

    from tests.conftest import TINY

    out = tiny_nmt_models
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))
    train, valid = hold_out(toy_bitext(1500, seed=0), TINY["valid_size"], seed=1)   # the fixture's split
    for lang, side in (("cs", 0), ("en", 1)):
        d = Dictionary.load(os.path.join(out, "data-bin", f"dict.{lang}.txt"))
        for split, pairs in (("train", train), ("valid", valid)):
            ds = data_utils.load_indexed_dataset(os.path.join(out, "data-bin", f"{split}.cs-en.{lang}"), d)
            assert len(ds) == len(pairs)
            for i in (0, len(pairs) - 1):
                pieces = [d[int(t)] for t in ds[i][:-1]]                         # drop </s>
                assert sp.decode_pieces(pieces) == pairs[i][side]


@pytest.mark.slow
def test_tiny_models_learn_the_toy_language(tiny_nmt_models):
    for name in DIRS:
        meta = json.load(open(os.path.join(tiny_nmt_models, name, "model.json")))
        print(f"{name}: BLEU {meta['bleu']} ({meta['bleu_signature']})")
        assert meta["bleu"] > 10, (name, meta["bleu"])


@pytest.mark.slow
def test_evaluate_bleu_is_reusable_and_sensitive(tiny_nmt_models):
    pairs = toy_bitext(30, seed=11)
    sources, refs = [cs for cs, _ in pairs], [en for _, en in pairs]
    model_dir = os.path.join(tiny_nmt_models, "cs-en")
    right = evaluate_bleu(model_dir, sources, refs, beam=5)
    assert right["sentences"] == 30 and 0 <= right["bleu"] <= 100
    assert "nrefs:1" in right["signature"]
    shuffled = refs[:]
    random.Random(0).shuffle(shuffled)
    wrong = evaluate_bleu(model_dir, sources, shuffled, beam=5)
    assert right["bleu"] > wrong["bleu"] + 5
    assert all(ex["hypothesis"] and ex["hypothesis"] == ex["hypothesis"].strip() for ex in right["examples"])


# ---------------------------------------------------------------- the command, end to end

@pytest.mark.slow
def test_cli_tiny_corpus_with_oversized_vocab(tmp_path):
    """8000-piece vocabulary on 42 pairs, one direction, explicit held-out files (4 pairs: fewer than
    fairseq's default batch multiple of 8), tsv.gz input."""
    pairs = toy_bitext(48, seed=9)
    tsv = tmp_path / "train.tsv.gz"
    with gzip.open(tsv, "wt", encoding="utf-8") as f:
        f.writelines(f"{cs}\t{en}\n" for cs, en in pairs[:40])
        f.write("Prázdná věta .\t \n")                                 # empty target: skipped
        f.writelines(f"{cs}\t{en}\n" for cs, en in pairs[40:44])       # beyond --max_lines
    (tmp_path / "valid.cs").write_text("".join(cs + "\n" for cs, _ in pairs[44:]), encoding="utf-8")
    (tmp_path / "valid.en").write_text("".join(en + "\n" for _, en in pairs[44:]), encoding="utf-8")
    out = tmp_path / "out"
    r = _cli("--tsv", str(tsv), "--valid_src_file", str(tmp_path / "valid.cs"),
             "--valid_tgt_file", str(tmp_path / "valid.en"), "--output", str(out), "--max_lines", "42",
             "--vocab_size", "8000", "--directions", "fwd", "--layers", "1", "--dim", "16", "--heads", "2",
             "--max_epoch", "2", "--max_update", "4", "--max_tokens", "512", "--cpu_threads", "1",
             "--bleu_samples", "3")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "fairseq-train cs-en" in r.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["train_pairs"] == 42 and report["valid_pairs"] == 4   # empty pair skipped
    assert 0 < report["vocab_size"] < 8000
    assert list(report["directions"]) == ["cs-en"] and not (out / "en-cs").exists()
    meta = json.loads((out / "cs-en" / "model.json").read_text())
    assert meta["vocab_size"] == report["vocab_size"] and meta["dim"] == 16
    assert isinstance(meta["bleu"], float) and 0 <= meta["bleu"] <= 100
    assert (out / "cs-en" / "model.pt").is_file() and (out / "spm.vocab").is_file()
