"""Three tiny bitext models (a bilingual encoder, its MLP, a divergence detector) trained on the
synthetic bitext of tests/toydata.py, for the bitext filter's tests and bench/bench_bitext.py's smoke run."""
import pathlib

import numpy as np

from tests.toydata import toy_alignments, toy_bitext


def build_bitext_models(folder: str) -> dict:
    """{"encoder", "mlp", "divergence"}: directories of three tiny models, and a cosine threshold
    below the cosine of 95% of held-out aligned pairs. (A bilingual encoder this small, trained for
    seconds, barely tells aligned from misaligned pairs; the divergence detector does. How well the
    encoder filters is measured in bench/bench_bitext.py on real data.)"""
    import torch

    from models.bitext.bilingual_encoder import BilingualConfig, load_bilingual_encoder, train_bilingual
    from models.bitext.divergence import DivergenceConfig, tokenize, train_divergence
    from models.bitext.similarity import cosine_pairs
    from models.bitext.train_pair_classifier import run as train_mlp

    torch.set_num_threads(1)
    root = pathlib.Path(folder)
    train = toy_bitext(600, seed=11)
    train_bilingual(train, str(root / "enc"), BilingualConfig("cs", "en", vocab_size=100, emb_dim=24, hidden=24,
                                                              max_pieces=30, dropout=0.0),
                    epochs=4, batch_size=16, lr=5e-3, device="cpu", seed=3, log=lambda *a: None, progress=False)
    clean = root / "clean.tsv"
    clean.write_text("".join(f"{cs}\t{en}\n" for cs, en in train[:300]), encoding="utf-8")
    train_mlp(["--encoder", str(root / "enc"), "--input", str(clean), "--src_lang", "cs", "--tgt_lang", "en",
               "--output", str(root / "mlp"), "--epochs", "20"])
    # the toy bitext's known word alignment: exact, and faster than aligning
    trained = train_divergence([tokenize(cs) for cs, _ in train], [tokenize(en) for _, en in train],
                               DivergenceConfig(src_lang="cs", tgt_lang="en", dim=16, hidden=12, channels=(8, 8),
                                                dense=16, dropout=0.0, epochs=3, batch_size=16, lr=3e-3,
                                                device="cpu", progress=False, max_tries=400, members=1),
                               alignments=toy_alignments(train, tokenize), log=lambda m: None)
    trained.detector.save(str(root / "div"))

    enc = load_bilingual_encoder(str(root / "enc"))
    held = toy_bitext(200, seed=12)
    good = cosine_pairs(enc.encode([c for c, _ in held], "cs"), enc.encode([e for _, e in held], "en"))
    return {"encoder": str(root / "enc"), "mlp": str(root / "mlp"), "divergence": str(root / "div"),
            "threshold": float(np.percentile(good, 5))}
