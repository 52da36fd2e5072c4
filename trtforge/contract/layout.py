"""Store layout (PVC path or S3 prefix), shared by builder, runtime and operator (docs/design.md §"Store
and engine broker")."""

from __future__ import annotations

import re

ENGINES = "engines"
TIMING_CACHES = "timing-caches"
MANIFEST = "manifest.json"
CANARY = "canary.npz"
KEY_RE = re.compile(r"^[0-9a-f]{64}$")


def _check_key(key: str) -> str:
    if not KEY_RE.match(key):
        raise ValueError(f"engine key {key!r} is not 64 lowercase hex characters")
    return key


def engine_dir(key: str) -> str:
    return f"{ENGINES}/{_check_key(key)}"


def engine_path(key: str, file_name: str) -> str:
    return f"{engine_dir(key)}/{file_name}"


def manifest_path(key: str) -> str:
    return f"{engine_dir(key)}/{MANIFEST}"


def timing_cache_path(backend_version: str, gpu: str, mig: str | None) -> str:
    safe = [re.sub(r"[^A-Za-z0-9._-]", "_", p) for p in (backend_version, gpu, mig or "full")]
    return f"{TIMING_CACHES}/{safe[0]}/{safe[1]}/{safe[2]}.cache"


REQUESTS = "requests"


def request_path(request_key: str) -> str:
    """The request index entry: which engine a request key produced (docs/design.md §"Engine keys")."""
    return f"{REQUESTS}/{_check_key(request_key)}.json"
