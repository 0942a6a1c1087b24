"""Which engine runs a model directory, loaded once per process (models/nmt/engine.py)."""
from __future__ import annotations

from models.nmt.engine import Engine


def load_engine(model_dir: str, device: str | None = None, sha256: dict | None = None, **kwargs) -> Engine:
    """The engine a model directory names (model.json), loaded once per process. MODEL_DIR may
    be a bucket URL: it is copied to a local cache and checked against SHA256 ({file: digest})."""
    from models.nmt.translator import load_translator

    return load_translator(model_dir, device=device, sha256=sha256, **kwargs)
