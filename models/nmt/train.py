"""Train the two NMT models the generation job needs, from a bitext, and measure their BLEU.

    python -m models.nmt.train --src_file train.cs.gz --tgt_file train.en.gz \\
        --src_lang cs --tgt_lang en --output runs/models --layers 3 --dim 256 --max_epoch 10

Steps: joint sentencepiece (unigram) on both sides -> fairseq-preprocess (joined dictionary) ->
fairseq-train src->tgt (the generator) and tgt->src (the dual scorer) -> BLEU (sacrebleu) of each
on held-out pairs, decoding with beam 5.

Output (read by models.nmt.Translator)::

    OUT/spm.model  OUT/data-bin/  OUT/report.json
    OUT/<src>-<tgt>/{model.pt, dict.<src>.txt, dict.<tgt>.txt, spm.model, model.json}
    OUT/<tgt>-<src>/...
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time

from common.atomic import copy_file, write_json
from common.cli import UsageError
from common.shards import bounded_lines, open_binary
from common.text import train_spm

log = logging.getLogger("paragen.train_nmt")


MAX_LINE_BYTES = 100_000   # a longer training line is no sentence: read as empty, then skipped


def _raw_lines(path: str):
    """Decoded lines, never holding more than MAX_LINE_BYTES of one; an overlong line is ''."""
    with open_binary(path) as f:
        for raw, overlong in bounded_lines(f, MAX_LINE_BYTES):
            yield "" if overlong else raw.decode("utf-8", errors="replace")


def _lines(path: str) -> list[str]:
    return [" ".join(line.split()) for line in _raw_lines(path)]


def read_bitext(tsv: str | None = None, src_file: str | None = None, tgt_file: str | None = None,
                max_lines: int | None = None) -> list[tuple[str, str]]:
    if tsv:
        pairs = list(_read_tsv_lines(tsv))
    else:
        src, tgt = _lines(src_file), _lines(tgt_file)
        if len(src) != len(tgt):
            raise UsageError(f"{src_file} has {len(src)} lines but {tgt_file} has {len(tgt)}")
        pairs = list(zip(src, tgt))
    total = len(pairs)
    pairs = [p for p in pairs if p is not None and p[0] and p[1]]
    if len(pairs) < total:          # not an error for training data, but never silent
        log.warning("%s: skipped %d of %d lines (an empty side%s)", tsv or f"{src_file} + {tgt_file}",
                    total - len(pairs), total, ", or not two tab-separated columns" if tsv else "")
    return pairs[:max_lines] if max_lines else pairs


def _read_tsv_lines(path):  # tabs survive: _lines() collapses whitespace, so split raw lines here
    for line in _raw_lines(path):
        cells = line.split("\t")
        yield (" ".join(cells[0].split()), " ".join(cells[1].split())) if len(cells) == 2 else None


def _fairseq(command: str, args: list[str], log_path: str, cpu_threads: int | None = None) -> None:
    """Run a fairseq CLI through models.nmt.model_files.fairseq_compat (safe checkpoint loading), streaming its log.

    ``python -m models.nmt.model_files.fairseq_compat`` runs with the interpreter of this process (sys.executable),
    so it is the fairseq of this virtualenv; the console scripts fairseq-train / fairseq-preprocess
    next to it run the same code but would load checkpoints without the allowlist."""
    cmd = [sys.executable, "-m", "models.nmt.model_files.fairseq_compat", command, *args]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if cpu_threads:
        env.update(OMP_NUM_THREADS=str(cpu_threads), MKL_NUM_THREADS=str(cpu_threads))
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for line in proc.stdout:
            logf.write(line)
            if any(key in line for key in ("| epoch", "train_inner", "| valid |", "done training", "Error")):
                print(line.rstrip()[-220:], flush=True)
        if proc.wait() != 0:
            raise RuntimeError(f"fairseq-{command} failed (exit {proc.returncode}); see {log_path}")


def evaluate_bleu(model_dir: str, sources: list[str], references: list[str], beam: int = 5) -> dict:
    """Corpus BLEU (sacrebleu, default 13a tokenisation) of beam-search translations of SOURCES
    against the untokenised REFERENCES. Returns bleu, signature, sentences and 5 examples."""
    import sacrebleu

    from models.nmt.engines.fairseq_engine import Translator

    t = Translator(model_dir, device=None)
    hyps = [h[0].text if h else "" for h in t.beam_search(sources, beam=beam, nbest=1)]
    metric = sacrebleu.metrics.BLEU()
    bleu = metric.corpus_score(hyps, [references])
    return {"bleu": round(bleu.score, 2), "signature": str(metric.get_signature()), "sentences": len(sources),
            "examples": [{"source": s, "reference": r, "hypothesis": h}
                         for s, r, h in list(zip(sources, references, hyps))[:5]]}


def train_models(pairs: list[tuple[str, str]], out: str, src_lang: str = "cs", tgt_lang: str = "en",
                 valid_pairs: list[tuple[str, str]] | None = None, valid_size: int = 500,
                 vocab_size: int = 8000, layers: int = 3, dim: int = 256, ffn_dim: int | None = None,
                 heads: int = 4, max_epoch: int = 10, max_update: int | None = None, max_tokens: int = 4096,
                 lr: float = 5e-4, dropout: float = 0.1, seed: int = 1, directions: str = "fwd,bwd",
                 bleu_samples: int = 500, warmup: int | None = None, cpu_threads: int | None = None) -> dict:
    """Train and evaluate; returns the report written to OUT/report.json.

    PAIRS and VALID_PAIRS are (src, tgt) sentences; whitespace is normalised and pairs with an
    empty side are dropped. Without VALID_PAIRS, min(VALID_SIZE, 10%) pairs are held out (seeded).
    CPU_THREADS caps torch/OpenMP threads in the fairseq subprocesses and, while this call runs,
    in this process (BLEU decoding); 1 is much faster for small models on a busy machine.
    """
    import torch

    threads_before = torch.get_num_threads()
    if cpu_threads:
        torch.set_num_threads(cpu_threads)
    try:
        return _train_models(pairs, out, src_lang, tgt_lang, valid_pairs, valid_size, vocab_size, layers, dim,
                             ffn_dim, heads, max_epoch, max_update, max_tokens, lr, dropout, seed, directions,
                             bleu_samples, warmup, cpu_threads)
    finally:
        torch.set_num_threads(threads_before)


def _train_models(pairs, out, src_lang, tgt_lang, valid_pairs, valid_size, vocab_size, layers, dim, ffn_dim,
                  heads, max_epoch, max_update, max_tokens, lr, dropout, seed, directions, bleu_samples, warmup,
                  cpu_threads) -> dict:
    import torch

    # every refusal comes before OUT is created
    pairs = _clean(pairs)
    if valid_pairs is not None:
        valid_pairs = _clean(valid_pairs)
    if not pairs:
        raise UsageError("no training pairs")
    unknown = {d.strip() for d in directions.split(",") if d.strip()} - {"fwd", "bwd"}
    if unknown:
        raise ValueError(f"directions must be fwd and/or bwd, got {sorted(unknown)}")
    check_settings(src_lang=src_lang, tgt_lang=tgt_lang, vocab_size=vocab_size, layers=layers, dim=dim,
                   ffn_dim=ffn_dim, heads=heads, max_epoch=max_epoch, max_update=max_update, max_tokens=max_tokens,
                   lr=lr, dropout=dropout, valid_size=valid_size, bleu_samples=bleu_samples, warmup=warmup,
                   cpu_threads=cpu_threads)
    if valid_pairs is None:
        pairs, valid_pairs = hold_out(pairs, valid_size, seed)
    if not pairs or not valid_pairs:
        raise UsageError(f"need training and held-out pairs (got {len(pairs)} and {len(valid_pairs)})")
    os.makedirs(out, exist_ok=True)
    report = {"src_lang": src_lang, "tgt_lang": tgt_lang, "train_pairs": len(pairs),
              "valid_pairs": len(valid_pairs), "stage_seconds": {}, "directions": {}}
    t0 = time.time()
    wanted = [d.strip() for d in directions.split(",") if d.strip()]
    stages = 2 + len(wanted)
    print(f"[1/{stages}] sentencepiece on {2 * len(pairs)} sentences (vocab {vocab_size})", flush=True)
    spm_path = train_spm([s for s, _ in pairs] + [t for _, t in pairs], os.path.join(out, "spm"), vocab_size)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_path)
    report["vocab_size"] = len(sp)
    report["stage_seconds"]["sentencepiece"] = round(time.time() - t0, 1)
    tok = os.path.join(out, "tok")
    os.makedirs(tok, exist_ok=True)
    for split, data in (("train", pairs), ("valid", valid_pairs)):
        for side, lang in ((0, src_lang), (1, tgt_lang)):
            with open(os.path.join(tok, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(sp.encode(p[side], out_type=str)) + "\n" for p in data)
    print(f"[2/{stages}] fairseq-preprocess (sentencepiece: {len(sp)} pieces, {time.time() - t0:.0f}s)", flush=True)
    t1 = time.time()
    data_bin = os.path.join(out, "data-bin")
    shutil.rmtree(data_bin, ignore_errors=True)
    _fairseq("preprocess", ["--source-lang", src_lang, "--target-lang", tgt_lang,
                            "--trainpref", os.path.join(tok, "train"), "--validpref", os.path.join(tok, "valid"),
                            "--destdir", data_bin, "--joined-dictionary", "--workers", "1"],
             os.path.join(out, "preprocess.log"), cpu_threads)
    report["stage_seconds"]["preprocess"] = round(time.time() - t1, 1)
    use_cuda = torch.cuda.is_available()
    ffn_dim = ffn_dim or 4 * dim
    pairs_of = {"fwd": (src_lang, tgt_lang), "bwd": (tgt_lang, src_lang)}
    tokens_per_epoch = sum(len(sp.encode(t)) for _, t in pairs)
    est_updates = max(1, tokens_per_epoch // max_tokens + 1) * max_epoch
    if max_update:
        est_updates = min(est_updates, max_update)
    warmup = warmup or min(4000, max(10, est_updates // 10))
    for step, d in enumerate(wanted, start=3):
        s, t = pairs_of[d]
        name = f"{s}-{t}"
        model_dir = os.path.join(out, name)
        save_dir = os.path.join(out, f"checkpoints-{name}")
        shutil.rmtree(save_dir, ignore_errors=True)
        print(f"[{step}/{stages}] fairseq-train {name}: {layers}+{layers} layers, d{dim}, {max_epoch} epochs "
              f"({'GPU' if use_cuda else 'CPU'})", flush=True)
        start = time.time()
        args = [data_bin, "--source-lang", s, "--target-lang", t, "--arch", "transformer",
                "--encoder-layers", str(layers), "--decoder-layers", str(layers),
                "--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim),
                "--encoder-ffn-embed-dim", str(ffn_dim), "--decoder-ffn-embed-dim", str(ffn_dim),
                "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads),
                "--share-all-embeddings", "--dropout", str(dropout), "--optimizer", "adam",
                "--adam-betas", "(0.9,0.98)", "--lr", str(lr), "--lr-scheduler", "inverse_sqrt",
                "--warmup-updates", str(warmup), "--criterion", "label_smoothed_cross_entropy",
                "--label-smoothing", "0.1", "--max-tokens", str(max_tokens), "--max-epoch", str(max_epoch),
                "--save-dir", save_dir, "--no-epoch-checkpoints", "--no-last-checkpoints",
                "--no-save-optimizer-state", "--seed", str(seed),
                "--log-interval", "50", "--num-workers", "0", "--log-format", "simple",
                # fairseq 0.12 drops a last batch smaller than this multiple (default 8) from every
                # split (facebookresearch/fairseq#5036): a held-out set under 8 pairs would be empty.
                "--required-batch-size-multiple", "1"]
        if max_update:
            args += ["--max-update", str(max_update)]
        args += ["--fp16"] if use_cuda else ["--cpu"]
        _fairseq("train", args, os.path.join(out, f"train-{name}.log"), cpu_threads)
        seconds = time.time() - start
        os.makedirs(model_dir, exist_ok=True)
        _export_checkpoint(os.path.join(save_dir, "checkpoint_best.pt"), os.path.join(model_dir, "model.pt"))
        for lang in (s, t):
            copy_file(os.path.join(data_bin, f"dict.{lang}.txt"), os.path.join(model_dir, f"dict.{lang}.txt"))
        copy_file(spm_path, os.path.join(model_dir, "spm.model"))
        meta = {"src_lang": s, "tgt_lang": t, "arch": "transformer", "layers": layers, "dim": dim,
                "ffn_dim": ffn_dim, "heads": heads, "vocab_size": len(sp), "train_pairs": len(pairs),
                "valid_pairs": len(valid_pairs), "max_epoch": max_epoch, "train_seconds": round(seconds, 1),
                "device": "cuda" if use_cuda else "cpu", "bleu": None, "bleu_signature": None}
        write_json(os.path.join(model_dir, "model.json"), meta)
        shutil.rmtree(save_dir, ignore_errors=True)
        sample = valid_pairs[:bleu_samples]
        srcs = [p[0] if d == "fwd" else p[1] for p in sample]
        refs = [p[1] if d == "fwd" else p[0] for p in sample]
        t2 = time.time()
        bleu = evaluate_bleu(model_dir, srcs, refs)
        report["stage_seconds"][f"train-{name}"] = round(seconds, 1)
        report["stage_seconds"][f"bleu-{name}"] = round(time.time() - t2, 1)
        meta.update({"bleu": bleu["bleu"], "bleu_signature": bleu["signature"], "bleu_sentences": bleu["sentences"]})
        write_json(os.path.join(model_dir, "model.json"), meta)
        print(f"      {name}: BLEU {bleu['bleu']} on {bleu['sentences']} held-out sentences, "
              f"trained in {seconds:.0f}s, decoded in {time.time() - t2:.0f}s", flush=True)
        report["directions"][name] = {**meta, "examples": bleu["examples"]}
    shutil.rmtree(tok, ignore_errors=True)
    report["seconds"] = round(time.time() - t0, 1)
    write_json(os.path.join(out, "report.json"), report, ensure_ascii=False)
    return report


def check_settings(src_lang: str, tgt_lang: str, **settings) -> None:
    """Refuse (UsageError) settings that cannot train a model: the same language on both sides
    (the two directions would be one model, trained twice into one directory), counts below 1,
    a learning rate that is not positive, a dropout outside [0, 1), heads that do not divide the
    dimension. SETTINGS that are None are left to their defaults."""
    if src_lang == tgt_lang:
        raise UsageError(f"--src_lang and --tgt_lang are both {src_lang!r}: a model translates between two languages")
    for name in ("vocab_size", "layers", "dim", "ffn_dim", "heads", "max_epoch", "max_update", "max_tokens",
                 "valid_size", "bleu_samples", "warmup", "cpu_threads"):
        value = settings.get(name)
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be >= 1, not {value}")
    lr, dropout = settings.get("lr"), settings.get("dropout")
    if lr is not None and not lr > 0:
        raise UsageError(f"--lr must be > 0, not {lr}")
    if dropout is not None and not 0 <= dropout < 1:
        raise UsageError(f"--dropout must be in [0, 1), not {dropout}")
    dim, heads = settings.get("dim"), settings.get("heads")
    if dim and heads and dim % heads:
        raise UsageError(f"--dim {dim} is not a multiple of --heads {heads}")


def hold_out(pairs: list, valid_size: int, seed: int = 1) -> tuple[list, list]:
    """(train, held-out): min(valid_size, 10% of the pairs, at least 1) positions drawn with SEED;
    both keep the input order."""
    idx = list(range(len(pairs)))
    random.Random(seed).shuffle(idx)
    held = set(idx[:max(1, min(valid_size, len(pairs) // 10))])
    return ([p for i, p in enumerate(pairs) if i not in held], [pairs[i] for i in sorted(held)])


def _clean(pairs) -> list[tuple[str, str]]:
    out = []
    for s, t in pairs:
        s, t = " ".join(s.split()), " ".join(t.split())
        if s and t:
            out.append((s, t))
    return out


def _export_checkpoint(src: str, dst: str) -> None:
    """Copy the best checkpoint without its optimizer state (a third of the size), after checking
    that its config passes the same validation as every model the jobs load."""
    from models.nmt.model_files.checkpoint import load_state, model_config_of
    from models.safety import save_torch_file

    state = load_state(src)
    model_config_of(state)
    state.pop("last_optimizer_state", None)
    save_torch_file(state, dst)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="paragen-train-nmt", description=__doc__.split("\n")[0], allow_abbrev=False,
        epilog="Example (the bundled example, tiny models in a few minutes): paragen-train-nmt --tsv "
               "examples/cs-en.example.tsv --src_lang cs --tgt_lang en --output runs/example-models "
               "--vocab_size 800 --layers 2 --dim 128 --max_epoch 10")
    data = ap.add_argument_group("training data (one of --tsv or --src_file + --tgt_file)")
    src = data.add_mutually_exclusive_group(required=True)
    src.add_argument("--tsv", metavar="FILE", help="bitext as src<TAB>tgt lines (plain or .gz)")
    src.add_argument("--src_file", metavar="FILE", help="source side, one sentence per line (plain or .gz)")
    data.add_argument("--tgt_file", metavar="FILE", help="target side, line-aligned with --src_file")
    data.add_argument("--valid_src_file", metavar="FILE",
                      help="held-out source for validation and BLEU (default: held out from the training data)")
    data.add_argument("--valid_tgt_file", metavar="FILE", help="held-out target, line-aligned with --valid_src_file")
    data.add_argument("--valid_size", type=int, default=500,
                      help="pairs held out when no validation files are given (at most 10%%; default 500)")
    data.add_argument("--max_lines", type=int, default=None, help="use only the first N pairs (default: all)")
    data.add_argument("--src_lang", default="cs", help="source language code (default cs)")
    data.add_argument("--tgt_lang", default="en", help="target language code (default en)")
    out = ap.add_argument_group("output")
    out.add_argument("--output", required=True, metavar="DIR",
                     help="directory for <src>-<tgt>/ and <tgt>-<src>/ model directories, spm.model and "
                          "report.json (required)")
    out.add_argument("--overwrite", action="store_true",
                     help="replace models already in --output (default: refuse)")
    out.add_argument("--directions", default="fwd,bwd",
                     help="which models to train: fwd (src->tgt), bwd (tgt->src) or both (default fwd,bwd)")
    model = ap.add_argument_group("model (a fairseq transformer) and training")
    model.add_argument("--vocab_size", type=int, default=8000, help="joint sentencepiece vocabulary (default 8000)")
    model.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each (default 3)")
    model.add_argument("--dim", type=int, default=256, help="embedding and model dimension (default 256)")
    model.add_argument("--ffn_dim", type=int, default=None, help="feed-forward dimension (default 4 x --dim)")
    model.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    model.add_argument("--dropout", type=float, default=0.1, help="dropout (default 0.1)")
    model.add_argument("--max_epoch", type=int, default=10, help="training epochs (default 10)")
    model.add_argument("--max_update", type=int, default=None, help="stop after this many updates (default: none)")
    model.add_argument("--max_tokens", type=int, default=4096, help="tokens per batch (default 4096)")
    model.add_argument("--lr", type=float, default=5e-4, help="peak learning rate, Adam (default 5e-4)")
    model.add_argument("--warmup", type=int, default=None,
                       help="warm-up updates of the inverse-sqrt schedule (default: 10%% of training, at most 4000)")
    model.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    model.add_argument("--cpu_threads", type=int, default=None,
                       help="torch/OpenMP threads for training and decoding (default: torch's choice; "
                            "1 is best for small models on a shared machine)")
    model.add_argument("--bleu_samples", type=int, default=500,
                       help="held-out sentences translated for the BLEU in model.json (default 500)")
    return ap


def run(argv=None) -> dict:
    from common.cli import check_output_location
    from common.names import check_lang_code

    ap = build_parser()
    a = ap.parse_args(argv)
    if a.src_file and not a.tgt_file:
        raise UsageError("--src_file needs --tgt_file")
    if a.tsv and a.tgt_file:
        raise UsageError("--tgt_file goes with --src_file, not --tsv")
    if bool(a.valid_src_file) != bool(a.valid_tgt_file):
        raise UsageError("--valid_src_file and --valid_tgt_file go together")
    check_lang_code(a.src_lang, "--src_lang")
    check_lang_code(a.tgt_lang, "--tgt_lang")
    check_settings(a.src_lang, a.tgt_lang, **{k: getattr(a, k) for k in (
        "vocab_size", "layers", "dim", "ffn_dim", "heads", "max_epoch", "max_update", "max_tokens", "lr", "dropout",
        "valid_size", "bleu_samples", "warmup", "cpu_threads")})
    if a.max_lines is not None and a.max_lines < 1:
        raise UsageError(f"--max_lines must be >= 1, not {a.max_lines}")
    for path in filter(None, (a.tsv, a.src_file, a.tgt_file, a.valid_src_file, a.valid_tgt_file)):
        if not os.path.isfile(path):
            raise UsageError(f"{path}: no such file")
    unknown = [d for d in a.directions.split(",") if d.strip() and d.strip() not in ("fwd", "bwd")]
    if unknown or not a.directions.strip():
        raise UsageError(f"--directions takes fwd, bwd or fwd,bwd, not {a.directions!r}")
    output = check_output_location(a.output)
    existing = [d for d in (f"{a.src_lang}-{a.tgt_lang}", f"{a.tgt_lang}-{a.src_lang}")
                if os.path.exists(os.path.join(output, d, "model.pt"))]
    if existing and not a.overwrite:
        raise UsageError(f"{output} already holds model(s) {', '.join(existing)}; pass --overwrite to replace them")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)
    pairs = read_bitext(a.tsv, a.src_file, a.tgt_file, max_lines=a.max_lines)
    if not pairs:
        raise UsageError(f"{a.tsv or a.src_file}: no training pairs (no line with text on both sides" +
                         (", separated by one tab)" if a.tsv else ")"))
    valid = (read_bitext(src_file=a.valid_src_file, tgt_file=a.valid_tgt_file)
             if a.valid_src_file else None)
    if valid is not None and not valid:
        raise UsageError(f"{a.valid_src_file}: no held-out pairs")
    report = train_models(pairs, output, a.src_lang, a.tgt_lang, valid, a.valid_size, a.vocab_size, a.layers,
                          a.dim, a.ffn_dim, a.heads, a.max_epoch, a.max_update, a.max_tokens, a.lr,
                          a.dropout, a.seed, a.directions, a.bleu_samples, a.warmup, a.cpu_threads)
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "examples"} if k == "directions" else v
                      for k, v in report.items()}, indent=2))
    return report


def main(argv=None) -> int:
    from common.cli import cli_main

    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
