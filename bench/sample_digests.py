"""Digests of what the decoding engines give for fixed input: a check that a change meant to move
code (not behaviour) left samples, beam outputs and scores as they were.

    python bench/sample_digests.py --forward_model M/cs-en --backward_model M/en-cs \\
        --bitext ../shared/data/bitext/multi30k [--sources 40]

Takes the first --sources pairs of val.{cs,en}.gz; samples each with the forward model (30
samples, top-10, each of two banned-word sets, seed 0) in the tree and fixed-shape decoder steps,
beam-searches it (beam 5, 2-best), and scores the references and the first samples with the
backward model. Prints one sha256 per output (of its texts, token ids and NLLs rounded to 1e-4
nats) and the count of rows each covers. Run it before and after: the digests must be equal.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def hypotheses(rows) -> list:
    return [[(h.text, list(h.token_ids), round(h.nll, 4)) for h in row] for row in rows]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forward_model", required=True, help="cs->en model directory")
    ap.add_argument("--backward_model", required=True, help="en->cs model directory")
    ap.add_argument("--bitext", required=True, help="folder with val.{cs,en}.gz")
    ap.add_argument("--sources", type=int, default=40, help="val pairs decoded (default 40)")
    a = ap.parse_args(argv)

    import torch

    from bench_gpu import read_pairs
    from models.nmt.engine import SampleRequest
    from models.nmt.engines.fairseq_engine import Translator

    torch.set_num_threads(1)
    pairs = read_pairs(a.bitext, "val", a.sources)
    backward = Translator(a.backward_model, device="cpu", precision="fp32")
    out = {}
    for mode in ("tree", "fixed"):
        forward = Translator(a.forward_model, device="cpu", precision="fp32", step_mode=mode)
        requests = [SampleRequest(cs, key=f"{i}:{k}", banned_words=tuple(en.split()[k::3][:2]), num_samples=30)
                    for i, (cs, en) in enumerate(pairs) for k in range(2)]
        rows = hypotheses(forward.sample(requests, topk=10, seed=0))
        out[f"sample {mode}"] = (digest(rows), sum(map(len, rows)))
    beams = hypotheses(forward.beam_search([cs for cs, _ in pairs], beam=5, nbest=2))
    out["beam"] = (digest(beams), sum(map(len, beams)))
    firsts = [row[0][0] if row else "" for row in rows[::2]]
    scores = [round(s, 4) for s in backward.score([en for _, en in pairs] + firsts, [cs for cs, _ in pairs] * 2)]
    out["score"] = (digest(scores), len(scores))
    for name, (value, count) in out.items():
        print(f"{name:12s} {value}  ({count} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
