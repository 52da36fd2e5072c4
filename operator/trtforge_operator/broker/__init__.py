"""The engine broker, a Deployment of its own: the HTTP front of the engine store (server.py) and its
command, `trtforge broker` (cli.py)."""

from __future__ import annotations

from trtforge_operator.broker.server import (
    SHA256_HEADER,
    Denied,
    Identity,
    ModelSourceRef,
    UploaderPod,
    grant_denial,
    keys_referenced,
    make_app,
    namespace_of,
    start_broker,
    upload_denial,
)

__all__ = [
    "SHA256_HEADER",
    "Denied",
    "Identity",
    "ModelSourceRef",
    "UploaderPod",
    "grant_denial",
    "keys_referenced",
    "make_app",
    "namespace_of",
    "start_broker",
    "upload_denial",
]
