"""paragen-translate: fairseq-interactive's counterpart for any model directory the jobs load, so a
model can be checked on a few lines before a 50M-pair run.

    echo "Muž jede na kole." | paragen-translate --model runs/models/cs-en --beam 5
    printf 'Muž jede na kole.\\tman bike\\n' | paragen-translate --model runs/models/cs-en --sample --num_samples 5
    printf 'Muž jede na kole.\\tA man rides a bike.\\n' | paragen-translate --model runs/models/cs-en --score

Reads lines on stdin and writes one line per input line on stdout:

* ``--beam K`` (default 5): the detokenized best translation;
* ``--sample``: ``--num_samples`` top-``--topk`` samples separated by tabs; a second
  tab-separated column lists that line's banned words (space-separated), which no sample contains
  (the generation job's sampler: models/nmt/engines/fairseq_engine.py);
* ``--score``: each line is ``source<TAB>target``; writes the per-token NLL of the target (natural
  log, ``</s>`` included: minus fairseq's score, in nats rather than fairseq-interactive's bits).

A line that is not UTF-8, too long, or lacks the column ``--score`` needs gives an empty output
line and one warning on stderr, so outputs stay aligned with inputs.
"""
from __future__ import annotations

import argparse
import logging
import sys

from common.cli import UsageError, cli_main, configure_logging
from common.shards import bounded_lines
from models.nmt.devices import PRECISIONS

log = logging.getLogger("paragen.translate")
MAX_LINE_BYTES = 100_000


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paragen-translate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("--model", required=True, metavar="DIR",
                    help="a model directory (paragen-train-nmt or paragen-import-model), local or a bucket URL")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--sample", action="store_true", help="top-k samples instead of beam search")
    mode.add_argument("--score", action="store_true", help="score source<TAB>target lines")
    ap.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    ap.add_argument("--topk", type=int, default=10, help="k of top-k sampling (default 10)")
    ap.add_argument("--num_samples", type=int, default=5, help="samples per line (default 5)")
    ap.add_argument("--seed", type=int, default=1, help="random seed of sampling (default 1)")
    ap.add_argument("--batch_lines", type=int, default=64, help="lines decoded together (default 64)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="where to decode (default: cuda when a GPU is visible, else cpu)")
    ap.add_argument("--precision", default="auto", choices=PRECISIONS,
                    help="weights' precision (default auto = fp32: the fastest measured on a GPU for a 6-layer "
                         "d512 model, docs/benchmarks.md; tf32 (a GPU's tensor cores), bf16, fp16 on request)")
    return ap


def _lines(stream):
    """(line number, text or None, why not) for each line of the binary STREAM."""
    for number, (raw, overlong) in enumerate(bounded_lines(stream, MAX_LINE_BYTES), start=1):
        if overlong:
            yield number, None, f"longer than {MAX_LINE_BYTES} bytes"
            continue
        try:
            yield number, raw.decode("utf-8"), None
        except UnicodeDecodeError as exc:
            yield number, None, f"not UTF-8 (byte {exc.start})"


def _batches(stream, size: int):
    batch = []
    for item in _lines(stream):
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def translate_batch(engine, batch: list, a) -> list[str]:
    """Output lines for BATCH [(line number, text or None, why not)] in the mode of A."""
    out = [""] * len(batch)
    todo = []
    for i, (number, text, why) in enumerate(batch):
        if text is None:
            log.warning("line %d: %s; empty output line", number, why)
            continue
        cells = text.split("\t")
        if a.score and len(cells) != 2:
            log.warning("line %d: --score needs source<TAB>target, got %d column(s); empty output line", number,
                        len(cells))
            continue
        if not a.score and len(cells) > 2:
            log.warning("line %d: more than two columns; empty output line", number)
            continue
        todo.append((i, number, cells))
    if not todo:
        return out
    if a.score:
        nlls = engine.score([c[0] for _, _, c in todo], [c[1] for _, _, c in todo])
        for (i, _, _), nll in zip(todo, nlls):
            out[i] = f"{nll:.6f}"
    elif a.sample:
        from models.nmt.engine import SampleRequest

        requests = [SampleRequest(c[0], f"line{number}", tuple(c[1].split()) if len(c) > 1 else (), a.num_samples)
                    for _, number, c in todo]
        for (i, _, _), hyps in zip(todo, engine.sample(requests, topk=a.topk, seed=a.seed)):
            out[i] = "\t".join(h.text for h in hyps)
    else:
        for (i, _, _), hyps in zip(todo, engine.beam_search([c[0] for _, _, c in todo], beam=a.beam, nbest=1)):
            out[i] = hyps[0].text if hyps else ""
    return out


def run(argv=None, stdin=None, stdout=None) -> int:
    from models.nmt.engines.loading import load_engine
    from models.nmt.model_files.model_dir import check_model_dir

    a = build_parser().parse_args(argv)
    for name in ("beam", "topk", "num_samples", "batch_lines"):
        if getattr(a, name) < 1:
            raise UsageError(f"--{name} must be >= 1, not {getattr(a, name)}")
    try:
        check_model_dir(a.model)
    except FileNotFoundError as exc:
        raise UsageError(f"--model: {exc}") from None
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA GPU is visible on this machine")
    try:
        engine = load_engine(a.model, device=a.device, precision=a.precision)
    except ValueError as exc:                         # a precision this device cannot use
        raise UsageError(f"--precision {a.precision}: {exc}") from None
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout
    lines = 0
    for batch in _batches(stdin, a.batch_lines):
        for line in translate_batch(engine, batch, a):
            stdout.write(line + "\n")
        stdout.flush()
        lines += len(batch)
    log.info("%d line(s) %s", lines, "scored" if a.score else "sampled" if a.sample else "translated")
    return 0


def main(argv=None) -> int:
    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
