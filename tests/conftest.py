"""Shared fixtures: tiny fairseq models trained once per test session on synthetic bitext."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TINY = dict(vocab_size=200, layers=1, dim=64, ffn_dim=128, heads=2, max_epoch=8, max_tokens=2048,
            lr=3e-3, dropout=0.0, warmup=30, valid_size=50, bleu_samples=50,
            cpu_threads=1)  # one thread: several times faster than two when the CPUs are shared


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: trains a model or runs a pipeline end to end (deselect with -m 'not slow')")


@pytest.fixture(scope="session")
def tiny_nmt_models(tmp_path_factory):
    """OUT dir with cs-en/ and en-cs/ model dirs (python -m models.train_nmt layout)."""
    from models.train_nmt import train_models
    from tests.toydata import toy_bitext

    out = str(tmp_path_factory.mktemp("tiny-nmt"))
    train_models(toy_bitext(1500, seed=0), out, "cs", "en", **TINY)
    return out
