"""Loading fairseq checkpoints under torch >= 2.6 without turning safe loading off.

torch.load defaults to weights_only=True, which refuses the argparse.Namespace that fairseq
stores in a checkpoint. Allowlisting that one class keeps unpickling restricted to tensors,
primitive containers and the listed globals.
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
