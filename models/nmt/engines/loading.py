"""Which engine runs a model directory (its model.json says), loaded once per process
(models/nmt/engine.py): the fairseq engine (models/nmt/engines/fairseq_engine.py) or CTranslate2
(models/nmt/engines/ct2_engine.py)."""
from __future__ import annotations

import threading

from models.nmt.engine import Engine

_CACHE: dict = {}
_LOCK = threading.Lock()


def load_engine(model_dir: str, device: str | None = None, sha256: dict | None = None, precision: str = "auto",
                threads: int | None = None, **kwargs) -> Engine:
    """The engine MODEL_DIR names, loaded once per process. MODEL_DIR may be a bucket URL: it is
    copied to a local cache and checked against SHA256 ({file: digest}). PRECISION is the fairseq
    engine's (a CTranslate2 model's compute type was chosen at import); THREADS the CPU threads
    of a CTranslate2 model (the fairseq engine's follow torch's setting)."""
    from common import storage
    from models.nmt.model_files.model_dir import local_model_dir, read_model_meta

    meta = read_model_meta(model_dir)
    if meta["engine"] == "fairseq":
        from models.nmt.engines.fairseq_engine import load_translator

        return load_translator(model_dir, device=device, sha256=sha256, precision=precision, **kwargs)
    from models.nmt.engines.ct2_engine import CT2Engine

    key = (storage.absolute(model_dir), device, threads)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = CT2Engine(local_model_dir(model_dir, sha256), device=device, threads=threads)
        return _CACHE[key]
