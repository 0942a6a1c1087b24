"""Loading fairseq checkpoints under torch >= 2.6 without turning safe loading off.

torch.load defaults to weights_only=True, which refuses the argparse.Namespace that fairseq
stores in a checkpoint. Allowlisting that one class keeps unpickling restricted to tensors,
primitive containers and the listed globals. For the checkpoints fairseq-fixed 0.12.3.1 writes
(training and models.train_nmt exports alike), torch.serialization.get_unsafe_globals_in_checkpoint
reports exactly ['argparse.Namespace']: "args" is None and "cfg" a plain dict whose "model"
entry is the Namespace of the model's command-line arguments.
"""
from __future__ import annotations

import argparse

_DONE = False


def allow_fairseq_checkpoints() -> None:
    """Register the globals fairseq checkpoints need with torch's safe unpickler (idempotent)."""
    global _DONE
    if _DONE:
        return
    import torch

    torch.serialization.add_safe_globals([argparse.Namespace])
    _DONE = True


_COMMANDS = {"train": "fairseq_cli.train", "preprocess": "fairseq_cli.preprocess",
             "generate": "fairseq_cli.generate", "interactive": "fairseq_cli.interactive"}


def main(argv=None) -> None:
    """`python -m models.fairseq_compat train|preprocess|generate ARGS`: fairseq's CLI with
    checkpoints loaded safely (fairseq-train reloads checkpoint_last.pt when resuming)."""
    import importlib
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in _COMMANDS:
        raise SystemExit(f"usage: python -m models.fairseq_compat {{{','.join(_COMMANDS)}}} [fairseq args]")
    allow_fairseq_checkpoints()
    module = importlib.import_module(_COMMANDS[argv[0]])
    sys.argv = [f"fairseq-{argv[0]}", *argv[1:]]
    module.cli_main()


if __name__ == "__main__":
    main()
