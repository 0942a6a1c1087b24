"""The bilingual sentence encoder (models/bitext/bilingual_encoder.py) and its command line
(models/bitext/train_bilingual.py): shapes, padding-independent max-pooling, training, safe loading."""
import gzip
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from models.bitext.bilingual_encoder import (BilingualConfig, BilingualEncoder, alignment_loss, load_bilingual_encoder,
                                      pad_batch, train_bilingual, train_sentencepiece)
from models.safety import UnsafeModelError
from tests.toydata import toy_bitext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(emb_dim=16, hidden=12, dropout=0.0)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread: faster than two on a shared 2-core machine (see conftest.TINY)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def sp(tmp_path_factory):
    texts = [s for pair in toy_bitext(200, seed=0) for s in pair]
    return train_sentencepiece(texts, 80, random.Random(0), str(tmp_path_factory.mktemp("spm")))


@pytest.fixture(scope="module")
def encoder(sp):
    """An untrained (randomly initialised, seeded) cs-en encoder."""
    torch.manual_seed(0)
    cfg = BilingualConfig("cs", "en", vocab_size=sp.get_piece_size(), max_pieces=30, **TINY)
    enc = BilingualEncoder(cfg, sp, device="cpu")
    enc.module.eval()
    return enc


# ------------------------------------------------------------------ shapes and pooling

def test_module_shapes_and_loss(encoder):
    module = encoder.module
    ids, lengths = pad_batch([[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]])
    states, mask = module.encode_states(ids, lengths, "src")
    assert states.shape == (3, 5, 24) and mask.shape == (3, 5)
    assert mask.sum(1).tolist() == [3, 2, 5]
    for side in ("src", "tgt"):
        assert module.embed(ids, lengths, side).shape == (3, 24)
    loss = module.loss(ids, lengths, "src", *pad_batch([[5, 6], [7], [8, 9, 10]]))
    assert loss.dim() == 0 and torch.isfinite(loss)
    # an untrained model is about uniform over the vocabulary
    assert abs(loss.item() - np.log(module.output.out_features)) < 1.0
    with pytest.raises(ValueError, match="side"):
        module.embed(ids, lengths, "cs")


def test_encode_shapes_and_order(encoder):
    cs = ["Muž sedí v parku .", "Pes běží na ulici před domem u řeky .", "", "Dívka spí ."]
    out = encoder.encode(cs, "cs", batch_size=2)
    assert out.shape == (4, encoder.dim) == (4, 24) and out.dtype == np.float32
    assert np.isfinite(out).all()
    # input order is kept although encode sorts by length inside (equal up to float rounding:
    # BLAS sums in another order for another batch size)
    for i, s in enumerate(cs):
        np.testing.assert_allclose(out[i], encoder.encode([s], "cs")[0], rtol=0, atol=1e-6)
    assert encoder.encode([], "en").shape == (0, 24)
    # the two encoders differ: one sentence, two vectors
    assert not np.allclose(encoder.encode(cs[:1], "cs"), encoder.encode(cs[:1], "en"))


@pytest.mark.slow
def test_max_pool_ignores_padding(encoder):
    short = "Pes spí ."
    longer = ["Stařec stojí na trávě před domem a čeká u řeky ve městě .", "Chlapec skáče na pláži ve městě ."]
    for lang in ("cs", "en"):
        alone = encoder.encode([short], lang)[0]
        batched = encoder.encode([short] + longer, lang, batch_size=8)[0]   # one batch, padded to the longest
        # equal up to float rounding (another batch size, another BLAS summation order)
        np.testing.assert_allclose(batched, alone, rtol=0, atol=1e-6)
        # the check has teeth: some dimensions are negative everywhere, where an unmasked max
        # would pick the zero states of the padding
        assert (alone < 0).any()
    ids, lengths = pad_batch(encoder.token_ids([short] + longer))
    states, _ = encoder.module.encode_states(ids, lengths, "src")
    n = int(lengths[0])
    torch.testing.assert_close(encoder.module.embed(ids, lengths, "src")[0], states[0, :n].max(0).values)


def test_encode_refuses_unknown_language(encoder):
    with pytest.raises(ValueError, match="knows 'cs' and 'en', not 'de'"):
        encoder.encode(["Hallo ."], "de")


def test_config_validation():
    with pytest.raises(ValueError, match="hidden"):
        BilingualConfig("cs", "en", hidden=True)
    with pytest.raises(ValueError, match="emb_dim"):
        BilingualConfig("cs", "en", emb_dim="16")
    with pytest.raises(ValueError, match="layers"):
        BilingualConfig("cs", "en", layers=0)
    with pytest.raises(ValueError, match="must differ"):
        BilingualConfig("en", "en")
    with pytest.raises(ValueError, match="language code"):
        BilingualConfig("../x", "en")
    with pytest.raises(ValueError, match="dropout"):
        BilingualConfig("cs", "en", dropout=1.0)


# ------------------------------------------------------------------ persistence and safe loading

def test_save_load_round_trip(encoder, tmp_path):
    encoder.save(str(tmp_path / "m"))
    assert sorted(os.listdir(tmp_path / "m")) == ["config.json", "spm.model", "weights.pt"]
    loaded = load_bilingual_encoder(str(tmp_path / "m"), device="cpu")
    assert loaded.cfg == encoder.cfg and loaded.dim == encoder.dim
    assert not loaded.module.training
    cs, en = zip(*toy_bitext(20, seed=5))
    np.testing.assert_array_equal(loaded.encode(list(cs), "cs"), encoder.encode(list(cs), "cs"))
    np.testing.assert_array_equal(loaded.encode(list(en), "en"), encoder.encode(list(en), "en"))
    # a file:// URL goes through common.storage
    np.testing.assert_array_equal(load_bilingual_encoder(f"file://{tmp_path}/m", device="cpu").encode(list(cs), "cs"),
                                  encoder.encode(list(cs), "cs"))


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_load_refuses_pickled_objects(encoder, tmp_path):
    model = tmp_path / "m"
    encoder.save(str(model))
    marker = tmp_path / "ran"
    torch.save({"embedding.weight": _RunsCode(marker)}, model / "weights.pt")
    with pytest.raises(UnsafeModelError, match="pickled Python objects"):
        load_bilingual_encoder(str(model), device="cpu")
    assert not marker.exists()


@pytest.mark.parametrize("change, message", [
    ({"activation": "relu"}, "unknown key"),
    ({"hidden": "12"}, "hidden must be an integer"),
    ({"hidden": 12.0}, "hidden must be an integer"),
    ({"layers": True}, "layers must be an integer"),
    ({"vocab_size": 10 ** 9}, "vocab_size must be an integer in"),
    ({"src_lang": "cs/../x"}, "language code"),
    ({"format_version": 99}, "format_version"),
    ({"hidden": 13}, "do not match config.json"),         # a valid config, but not these weights
])
def test_load_refuses_bad_config(encoder, tmp_path, change, message):
    model = tmp_path / "m"
    encoder.save(str(model))
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(UnsafeModelError, match=message):
        load_bilingual_encoder(str(model), device="cpu")


def test_load_refuses_incomplete_and_non_json(encoder, tmp_path):
    model = tmp_path / "m"
    encoder.save(str(model))
    (model / "config.json").write_text("[1, 2")
    with pytest.raises(UnsafeModelError, match="not valid JSON"):
        load_bilingual_encoder(str(model))
    (model / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="missing config.json"):
        load_bilingual_encoder(str(model))


# ------------------------------------------------------------------ training

@pytest.mark.slow
def test_training_lowers_both_losses(tmp_path):
    pairs = toy_bitext(300, seed=1)
    mono = [en for _, en in toy_bitext(60, seed=2)]
    cfg = BilingualConfig("cs", "en", vocab_size=100, **TINY)
    report = train_bilingual(pairs, str(tmp_path / "m"), cfg, monolingual=mono, epochs=4, batch_size=16, lr=5e-3,
                             device="cpu", seed=3, log=lambda m: None, progress=False)
    tr, ae = report["translation_loss"], report["autoencoding_loss"]
    assert len(tr) == len(ae) == len(report["epochs"]) == 4
    assert report["pairs"] == 300 and report["monolingual"] == 60
    assert tr[-1] < 0.75 * tr[0] and ae[-1] < 0.75 * ae[0], (tr, ae)
    saved = json.loads((tmp_path / "m" / "training.json").read_text())
    assert saved["translation_loss"] == tr
    enc = load_bilingual_encoder(str(tmp_path / "m"), device="cpu")
    assert enc.cfg.vocab_size == report["config"]["vocab_size"]
    assert enc.encode(["Pes spí v parku ."], "cs").shape == (1, 24)


def test_alignment_loss_against_a_brute_force_computation():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    cos = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T
    logits = cos / 0.1

    def xent(m):          # mean over rows of -log softmax(row)[own column]
        return np.mean([np.log(np.exp(row).sum()) - row[i] for i, row in enumerate(m)])

    want = (xent(logits) + xent(logits.T)) / 2
    got = alignment_loss(torch.tensor(a), torch.tensor(b), temperature=0.1).item()
    assert got == pytest.approx(want, rel=1e-6)
    # each row pointing the same way as its partner only: near 0; partners swapped: large
    eye = torch.eye(4, dtype=torch.float64) * 3
    assert alignment_loss(eye, eye * 2, temperature=0.05).item() < 1e-6
    assert alignment_loss(eye, eye.flip(0), temperature=0.05).item() > 10


@pytest.mark.slow
def test_alignment_loss_puts_translations_together(tmp_path):
    """The paper's objective alone vs with the alignment loss, same data and seed: with it, a
    sentence's translation is much closer than other sentences (cosine), and the per-epoch dev
    alignment error is reported and lower."""
    from models.bitext.similarity import cosine_pairs

    pairs = toy_bitext(300, seed=1)
    dev = list(dict(toy_bitext(120, seed=9)).items())          # distinct Czech sentences
    cfg = BilingualConfig("cs", "en", vocab_size=100, **TINY)
    gaps, errors = {}, {}
    for weight in (0.0, 1.0):
        report = train_bilingual(pairs, str(tmp_path / f"m{weight}"), cfg, epochs=3, batch_size=16, lr=5e-3,
                                 device="cpu", seed=3, log=lambda m: None, progress=False, align_weight=weight,
                                 dev_pairs=dev)
        assert [sorted(e["dev_error"]) for e in report["epochs"]] == [["cosine", "csls"]] * 3
        assert ("alignment_loss" in report["epochs"][0]) == (weight > 0)
        assert report["training"]["align_weight"] == weight
        enc = load_bilingual_encoder(str(tmp_path / f"m{weight}"), device="cpu")
        cs, en = enc.encode([c for c, _ in dev], "cs"), enc.encode([e for _, e in dev], "en")
        gaps[weight] = cosine_pairs(cs, en).mean() - cosine_pairs(cs, np.roll(en, 7, axis=0)).mean()
        errors[weight] = report["epochs"][-1]["dev_error"]["csls"]
    assert gaps[1.0] > gaps[0.0] + 0.2, gaps
    assert errors[1.0] < errors[0.0], errors


@pytest.mark.slow
def test_cli_trains_and_refuses_to_overwrite(tmp_path):
    from models.bitext.train_bilingual import run

    pairs = toy_bitext(200, seed=4)
    lines = [f"{cs}\t{en}" for cs, en in pairs] + ["no tab here", " \tA dog sleeps ."]
    (tmp_path / "bitext.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "mono.en.gz", "wt", encoding="utf-8") as f:
        f.write("".join(f"{en}\n" for _, en in toy_bitext(30, seed=6)) + "\n")
    out = tmp_path / "model"
    args = ["--input", str(tmp_path / "bitext.tsv"), "--src_lang", "cs", "--tgt_lang", "en", "--output", str(out),
            "--monolingual", str(tmp_path / "mono.en.gz"), "--vocab_size", "90", "--emb_dim", "16", "--hidden", "12",
            "--epochs", "2", "--batch_size", "16", "--threads", "1", "--no_progress",
            "--dev", str(tmp_path / "bitext.tsv"), "--max_dev_pairs", "50"]
    report = run(args)
    assert all(set(e["dev_error"]) == {"cosine", "csls"} for e in report["epochs"])
    assert report["pairs"] == 200 and report["monolingual"] == 30
    assert report["input"]["rejected"] == {"missing_column": 1} and report["input"]["empty"] == 1
    assert report["input"]["monolingual_skipped"] == 1
    assert len(report["translation_loss"]) == 2
    enc = load_bilingual_encoder(str(out), device="cpu")
    assert enc.langs == ("cs", "en") and enc.encode(["Žena čeká ."], "cs").shape == (1, 24)

    before = (out / "config.json").stat().st_mtime_ns
    done = subprocess.run([sys.executable, "-m", "models.bitext.train_bilingual", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error:" in done.stderr and "already exists" in done.stderr and "--overwrite" in done.stderr
    assert (out / "config.json").stat().st_mtime_ns == before


def test_cli_refuses_bad_options(tmp_path):
    from models.bitext.train_bilingual import run
    from common.cli import UsageError

    tsv = tmp_path / "b.tsv"
    tsv.write_text("Pes spí .\tA dog sleeps .\n", encoding="utf-8")

    def args(src="cs", tgt="en", inp=str(tsv), *extra):
        return ["--input", inp, "--src_lang", src, "--tgt_lang", tgt, "--output", str(tmp_path / "m"), *extra]

    with pytest.raises(UsageError, match="hidden must be an integer in"):
        run(args("cs", "en", str(tsv), "--hidden", "0"))
    with pytest.raises(UsageError, match="must differ"):
        run(args("cs", "cs"))
    with pytest.raises(UsageError, match="epochs"):
        run(args("cs", "en", str(tsv), "--epochs", "0"))
    with pytest.raises(UsageError, match="--align_weight must be in"):
        run(args("cs", "en", str(tsv), "--align_weight", "-1"))
    with pytest.raises(UsageError, match="--dev .*at least 2 usable pairs"):
        run(args("cs", "en", str(tsv), "--dev", str(tsv)))
    with pytest.raises(FileNotFoundError, match="matches no file"):
        run(args("cs", "en", str(tmp_path / "none")))
    assert not (tmp_path / "m").exists()


def test_cli_defaults_are_the_settings_behind_the_documented_figures():
    """docs/benchmarks.md trains its encoders with the defaults and spells them out once: a user who
    runs the documented command gets the documented settings."""
    import re

    from models.bitext.train_bilingual import build_parser

    doc = open(os.path.join(ROOT, "docs", "benchmarks.md"), encoding="utf-8").read()
    spelled = doc[doc.index("spelled out:"):]
    spelled = spelled[:spelled.index(")")]
    flags = dict(re.findall(r"--(\w+) ([\d.]+)", spelled))
    assert {"hidden", "dropout", "epochs", "batch_size", "lr", "vocab_size", "emb_dim"} <= set(flags)
    defaults = build_parser().parse_args(["--input", "x", "--src_lang", "cs", "--tgt_lang", "en", "--output", "o"])
    for name, value in flags.items():
        assert getattr(defaults, name) == type(getattr(defaults, name))(value), name


@pytest.mark.slow
def test_two_trainings_with_the_same_seed_give_the_same_encoder(tmp_path):
    from models.bitext.train_bilingual import run

    (tmp_path / "bitext.tsv").write_text("".join(f"{cs}\t{en}\n" for cs, en in toy_bitext(150, seed=8)),
                                         encoding="utf-8")

    def train(name, seed):
        run(["--input", str(tmp_path / "bitext.tsv"), "--src_lang", "cs", "--tgt_lang", "en",
             "--output", str(tmp_path / name), "--vocab_size", "90", "--emb_dim", "16", "--hidden", "12",
             "--epochs", "1", "--batch_size", "16", "--threads", "1", "--seed", str(seed), "--no_progress"])
        return load_bilingual_encoder(str(tmp_path / name), device="cpu").encode(["Žena čeká .", "Pes spí ."], "cs")

    first, again, other = train("a", 5), train("b", 5), train("c", 6)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
