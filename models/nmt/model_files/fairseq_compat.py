"""fairseq's command-line tools (train, preprocess, generate, interactive) run with checkpoints
loaded safely (models/nmt/model_files/checkpoint.py: allow_fairseq_checkpoints, validated configs).

Loading fairseq checkpoints under torch >= 2.6 without turning safe loading off.

torch.load defaults to weights_only=True, which refuses the argparse.Namespace that fairseq
stores in a checkpoint. Allowlisting that one class keeps unpickling restricted to tensors,
primitive containers and the listed globals. For the checkpoints fairseq-fixed 0.12.3.1 writes
(training and models.nmt.train exports alike), torch.serialization.get_unsafe_globals_in_checkpoint
reports exactly ['argparse.Namespace']: "args" is None and "cfg" a plain dict whose "model"
entry is the Namespace of the model's command-line arguments.
"""
from __future__ import annotations

import os

from common.cli import option_value

_COMMANDS = {"train": "fairseq_cli.train", "preprocess": "fairseq_cli.preprocess",
             "generate": "fairseq_cli.generate", "interactive": "fairseq_cli.interactive"}


def _option(argv: list[str], name: str, default=None):
    """The value of a fairseq option NAME (--opt VALUE or --opt=VALUE) in ARGV, else DEFAULT."""
    value = option_value(argv, name)
    return default if value is None else value


def _checked_argv(command: str, argv: list[str], workdir: str) -> list[str]:
    """ARGV with every checkpoint fairseq would load replaced by a sanitized copy in WORKDIR
    (generate, interactive: --path) or validated in place (train: the checkpoint it resumes from),
    so fairseq's own loader never sees an unvalidated model config (see models/nmt/model_files/checkpoint.py)."""
    from models.nmt.model_files.checkpoint import check_checkpoint, sanitized_copy

    argv = list(argv)
    if command in ("generate", "interactive"):
        paths = _option(argv, "--path")
        if paths:
            clean = []
            for i, path in enumerate(paths.split(":")):          # fairseq's ensemble separator
                dst = os.path.join(workdir, f"model{i}.pt")
                sanitized_copy(path, dst)
                clean.append(dst)
            at = next(i for i, a in enumerate(argv) if a == "--path" or a.startswith("--path="))
            argv[at:at + (1 if "=" in argv[at] else 2)] = ["--path", ":".join(clean)]
    elif command == "train":
        save_dir = _option(argv, "--save-dir", "checkpoints")
        restore = _option(argv, "--restore-file", "checkpoint_last.pt")
        path = restore if os.path.isabs(restore) else os.path.join(save_dir, restore)
        if os.path.exists(path):
            check_checkpoint(path)
    return argv


def main(argv=None) -> None:
    """`python -m models.nmt.model_files.fairseq_compat train|preprocess|generate|interactive ARGS`: fairseq's CLI
    with checkpoints loaded safely: weights-only unpickling, and model configs validated first."""
    import importlib
    import sys
    import tempfile

    from models.nmt.model_files.checkpoint import UnsafeModelError, allow_fairseq_checkpoints

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in _COMMANDS:
        raise SystemExit(f"usage: python -m models.nmt.model_files.fairseq_compat {{{','.join(_COMMANDS)}}} "
                         "[fairseq args]")
    allow_fairseq_checkpoints()
    with tempfile.TemporaryDirectory(prefix="paragen-ckpt-") as workdir:
        try:
            args = _checked_argv(argv[0], argv[1:], workdir)
        except (UnsafeModelError, FileNotFoundError) as exc:
            raise SystemExit(f"error: {exc}") from None
        module = importlib.import_module(_COMMANDS[argv[0]])
        sys.argv = [f"fairseq-{argv[0]}", *args]
        module.cli_main()


if __name__ == "__main__":
    main()
