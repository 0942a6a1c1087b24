"""Paths: a local path or a URL (``s3://``, ``gs://``, ``webhdfs://``, ``hdfs://``, ``file://``), joined and split
alike, and which server a URL's store talks to (for error messages)."""
from __future__ import annotations

import os

_SCHEMES = {"s3", "gs", "gcs", "hdfs", "webhdfs", "viewfs", "file"}


def is_url(path: str) -> bool:
    """True for scheme://... paths (object stores, HDFS, file://)."""
    return "://" in path and path.split("://", 1)[0].lower() in _SCHEMES


def is_local(path: str) -> bool:
    return not is_url(path) or path.lower().startswith("file://")


def _s3_endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _gcs_emulator() -> str | None:
    return os.environ.get("STORAGE_EMULATOR_HOST") or os.environ.get("CLOUD_STORAGE_EMULATOR_ENDPOINT")


def endpoint_of(path: str) -> str:
    """The server a URL's store talks to, in words (for error messages)."""
    scheme = path.split("://", 1)[0].lower() if is_url(path) else "file"
    if scheme == "s3":
        return _s3_endpoint() or f"AWS S3 ({os.environ.get('AWS_REGION') or os.environ.get('AWS_DEFAULT_REGION') or 'default region'})"
    if scheme in ("gs", "gcs"):
        return _gcs_emulator() or "storage.googleapis.com"
    if scheme == "webhdfs":
        netloc = path.split("://", 1)[1].split("/", 1)[0]
        return f"the NameNode at http://{netloc if ':' in netloc else netloc + ':9870'}"
    return scheme


def join(base: str, *parts: str) -> str:
    """BASE / PARTS for local paths and URLs alike."""
    if not is_url(base):
        return os.path.join(base, *parts)
    out = base.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def parent(path: str) -> str:
    if not is_url(path):
        return os.path.dirname(os.path.abspath(path))
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{rest.rstrip('/').rsplit('/', 1)[0]}" if "/" in rest.rstrip("/") else path


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if is_url(path) else os.path.basename(path)


def absolute(path: str) -> str:
    """PATH as an absolute local path or an unchanged URL (what workers elsewhere can open)."""
    return path if is_url(path) else os.path.abspath(path)


def has_wildcards(path: str) -> bool:
    return any(ch in path for ch in "*?[")
