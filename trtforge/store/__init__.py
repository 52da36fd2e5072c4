"""Engine store implementations behind :class:`trtforge.store.base.EngineStore`; `open_store(uri)` picks one.

=================================  =====================================================  ==========
URI                                implementation                                         writes
=================================  =====================================================  ==========
``pvc://<claim>/<path>``           :class:`~trtforge.store.local.LocalStore` under        yes
                                   ``$TRTFORGE_PVC_ROOT/<claim>/<path>``
``file:///abs/path``, ``/abs``     :class:`~trtforge.store.local.LocalStore`              yes
``s3://<bucket>/<prefix>``         :class:`~trtforge.store.s3.S3Store`                    yes
``http(s)://host:port[/base]``     :class:`~trtforge.store.http.BrokerStore` (engine      read-only
                                   broker; see its module for the URL scheme)
=================================  =====================================================  ==========
"""

from __future__ import annotations

from trtforge.store.base import EngineStore, IntegrityError, ObjectNotFound, PutResult, StoreError

__all__ = [
    "EngineStore",
    "IntegrityError",
    "ObjectNotFound",
    "PutResult",
    "StoreError",
    "join_uri",
    "open_store",
]


def open_store(uri: str) -> EngineStore:
    """The store named by `uri` (raises StoreError for an unknown scheme or a malformed URI).

    Opening does not touch the network or the disk; the first operation does, and its StoreError
    names the URI and what failed.
    """
    uri = uri.strip()
    if not uri:
        raise StoreError(
            "store URI is empty; expected pvc://<claim>/<path>, s3://<bucket>/<prefix>, "
            "http(s)://<broker> or an absolute path"
        )
    if uri.startswith("s3://"):
        from trtforge.store.s3 import S3Store

        return S3Store(uri)
    if uri.startswith(("http://", "https://")):
        from trtforge.store.http import BrokerStore

        return BrokerStore(uri)
    if uri.startswith(("pvc://", "file://")) or "://" not in uri:
        from trtforge.store.local import local_store_for

        return local_store_for(uri)
    scheme = uri.split("://", 1)[0]
    raise StoreError(
        f"store URI {uri!r} has an unknown scheme {scheme!r}; expected pvc://, s3://, "
        "file://, http(s):// or an absolute path"
    )


def join_uri(store_uri: str, path: str) -> str:
    """The URI of `path` inside the store at `store_uri`."""
    return f"{store_uri.rstrip('/')}/{path.lstrip('/')}"
