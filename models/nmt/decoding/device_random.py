"""Counter-based random numbers for sampling, computed where the model runs (CPU or GPU).

A sample's randomness is a function of (seed, request key, sample index, step, candidate): a pair's
samples do not depend on its batch-mates, on the worker that decodes it, or on the device. Each
row gets a 64-bit seed once per batch (:func:`row_seed`, a hash on the host); the Gumbel noise of
every step is then SplitMix64 over int64 tensors on the device, so a decoder step never sends
random numbers from the host.

SplitMix64 is defined on unsigned 64-bit integers. torch's int64 arithmetic wraps modulo 2**64
like uint64 (two's complement), XOR is the same, and a logical right shift is an arithmetic shift
masked to the low 64 - s bits, so the numbers are bit for bit those of a uint64 implementation
(tests/test_device_random.py checks them against one in numpy). The final ``-log(-log(u))`` runs
in float64 and is rounded to float32, which absorbs the last-bit differences between libm
implementations.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch


def _signed(value: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    value %= 1 << 64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MUL1 = _signed(0xBF58476D1CE4E5B9)
_MUL2 = _signed(0x94D049BB133111EB)
_STEP = 0xD1B54A32D192ED03


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The SplitMix64 finaliser of each int64 (read as uint64 bits)."""
    x = x + _GOLDEN
    x = (x ^ _shr(x, 30)) * _MUL1
    x = (x ^ _shr(x, 27)) * _MUL2
    return x ^ _shr(x, 31)


def row_seed(seed: int, key: str, sample: int) -> int:
    """A row's 64-bit seed (as a signed int64) from the job's seed, the request key and the sample."""
    digest = hashlib.blake2b(f"{seed}\x00{key}\x00{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def row_seeds(values: list[int], device) -> torch.Tensor:
    """The rows' seeds (from :func:`row_seed`) as one int64 tensor on DEVICE (one transfer)."""
    return torch.from_numpy(np.asarray(values, dtype=np.int64)).to(device)


def gumbel(seeds: torch.Tensor, step: int, k: int) -> torch.Tensor:
    """(rows, k) float32 Gumbel(0, 1) noise for decoder step STEP: row r, column j is a function of
    (seeds[r], step, j) only. On SEEDS' device; no host round trip."""
    return gumbel_steps(seeds, step, 1, k)[:, 0]


def gumbel_steps(seeds: torch.Tensor, first: int, steps: int, k: int) -> torch.Tensor:
    """(rows, steps, k): :func:`gumbel` of steps FIRST .. FIRST + STEPS - 1 at once, bit for bit.
    The noise takes ~35 small tensor operations however many rows: made for several steps at a
    time, they are that many fewer kernel launches a decoder step."""
    # (step + 1) * _STEP in int64 wraps modulo 2**64 exactly as the uint64 product does.
    salt = torch.arange(first + 1, first + steps + 1, dtype=torch.int64, device=seeds.device) * _signed(_STEP)
    base = splitmix64(seeds[:, None] ^ salt[None, :])                   # (rows, steps)
    counters = base[:, :, None] + torch.arange(k, dtype=torch.int64, device=seeds.device)
    bits = _shr(splitmix64(counters), 11)                               # 53 random bits
    uniform = (bits.to(torch.float64) + 0.5) * (1.0 / (1 << 53))        # in (0, 1)
    return (-torch.log(-torch.log(uniform))).to(torch.float32)


def gumbel_at(seeds: torch.Tensor, step: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`gumbel` with the step as a 0-d int64 device tensor (a compiled or replayed
    decoder step cannot take it from the host), bit for bit."""
    salt = (step + 1) * _signed(_STEP)
    counters = splitmix64(seeds ^ salt)[:, None] + torch.arange(k, dtype=torch.int64, device=seeds.device)
    uniform = (_shr(splitmix64(counters), 11).to(torch.float64) + 0.5) * (1.0 / (1 << 53))
    return (-torch.log(-torch.log(uniform))).to(torch.float32)


__all__ = ["gumbel", "gumbel_at", "gumbel_steps", "row_seed", "row_seeds", "splitmix64"]
