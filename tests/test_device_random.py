"""models/nmt/decoding/device_random.py: the sampler's random numbers, computed on the device, are those of a
uint64 SplitMix64 in numpy (the implementation the sampler used before it ran on the device), so a
pair's samples did not change when the loop moved there."""
import hashlib

import numpy as np
import pytest
import torch

from models.nmt.decoding.device_random import gumbel, gumbel_steps, row_seed, splitmix64


def _np_splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _np_gumbel(row_seeds, step, k):
    with np.errstate(over="ignore"):
        base = _np_splitmix64(row_seeds ^ np.uint64((step + 1) * 0xD1B54A32D192ED03 % (1 << 64)))
        counters = base[:, None] + np.arange(k, dtype=np.uint64)[None, :]
        bits = _np_splitmix64(counters) >> np.uint64(11)
    uniform = (bits.astype(np.float64) + 0.5) * (1.0 / (1 << 53))
    return torch.from_numpy(-np.log(-np.log(uniform))).float()


def _np_key_seed(seed, key, sample):
    digest = hashlib.blake2b(f"{seed}\x00{key}\x00{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def test_row_seed_has_the_bits_of_the_unsigned_hash():
    for seed, key, sample in [(0, "a", 0), (1, "pair:3", 29), (7, "é\x00x", 5)]:
        assert row_seed(seed, key, sample) % (1 << 64) == _np_key_seed(seed, key, sample)


def test_splitmix64_on_int64_tensors_equals_uint64():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**64 - 1, size=10_000, dtype=np.uint64, endpoint=True)
    x[:4] = [0, 1, 2**63, 2**64 - 1]                          # the edges of the signed range
    with np.errstate(over="ignore"):
        want = _np_splitmix64(x)
    got = splitmix64(torch.from_numpy(x.view(np.int64))).numpy().view(np.uint64)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("step", [0, 1, 17, 250])
def test_gumbel_noise_is_bit_identical_to_the_numpy_reference(step):
    keys = [(s, f"p{i}:{j}", n) for i, s in enumerate(range(5)) for j in range(4) for n in range(30)]
    seeds_u = np.array([_np_key_seed(*k) for k in keys], dtype=np.uint64)
    seeds_t = torch.tensor([row_seed(*k) for k in keys], dtype=torch.int64)
    for k in (1, 10, 57):
        want = _np_gumbel(seeds_u, step, k)
        got = gumbel(seeds_t, step, k)
        assert got.dtype == torch.float32 and got.shape == (len(keys), k)
        assert torch.equal(got, want)
        # The sampler makes several steps' noise at once: each step's is the same, bit for bit.
        block = gumbel_steps(seeds_t, step, 3, k)
        assert block.shape == (len(keys), 3, k)
        for j in range(3):
            assert torch.equal(block[:, j], _np_gumbel(seeds_u, step + j, k))


def test_noise_depends_on_the_row_seed_step_and_column_only():
    seeds = torch.tensor([row_seed(1, f"k{i}", 0) for i in range(6)])
    full = gumbel(seeds, 3, 12)
    assert torch.equal(gumbel(seeds[[4, 1]], 3, 12), full[[4, 1]])   # a row's noise ignores its batch-mates
    assert torch.equal(gumbel(seeds, 3, 5), full[:, :5])               # and the width asked for
    assert not torch.equal(gumbel(seeds, 4, 12), full)
    # Gumbel(0, 1): mean ~0.577, variance pi^2/6 ~1.645 over many draws.
    many = gumbel(torch.arange(20_000, dtype=torch.int64), 0, 50)
    assert abs(float(many.mean()) - 0.5772) < 0.01 and abs(float(many.var()) - 1.6449) < 0.03
