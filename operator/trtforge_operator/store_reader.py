"""The operator's read side of the engine store: manifests by key, with a short cache."""

from __future__ import annotations

import logging
import time

from trtforge.contract.engine_key import RequestRecord
from trtforge.contract.layout import ENGINES, MANIFEST, manifest_path, request_path
from trtforge.contract.llm.artefact import ArtefactKind, ArtefactManifest
from trtforge.contract.manifest import Manifest
from trtforge.contract.possession import PossessionRecord, VerifyGrant, possession_path, verify_grant_path
from trtforge.logs import fields
from trtforge.store import EngineStore, ObjectNotFound, StoreError, open_store
from trtforge.store.artefacts import read_manifest
from trtforge_operator.config import OperatorConfig

log = logging.getLogger(__name__)


def operator_store_reader(cfg: OperatorConfig) -> StoreReader:
    """The operator's reader: through the broker's operator endpoints (`store_via_broker`), else the
    store itself as the operator process sees it."""
    if cfg.store_via_broker:
        from trtforge_operator.broker.store_client import OperatorBrokerStore

        url = cfg.broker_url()
        return StoreReader(url, store=OperatorBrokerStore(url))
    return StoreReader(cfg.reader_store_uri)


class StoreReader:
    """Reads manifests; a missing manifest is cached for less time than a present one."""

    def __init__(self, uri: str, ttl_s: float = 2.0, store: EngineStore | None = None) -> None:
        self.uri = uri
        self.store: EngineStore = store if store is not None else open_store(uri)
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, Manifest | None]] = {}
        self._requests: dict[str, tuple[float, RequestRecord | None]] = {}
        self._artefacts: dict[tuple[ArtefactKind, str], tuple[float, ArtefactManifest | None]] = {}
        self._possession: dict[tuple[str, str], tuple[float, PossessionRecord | None]] = {}
        self.last_error: str | None = None

    def manifest(self, key: str) -> Manifest | None:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < (self.ttl_s if hit[1] is not None else self.ttl_s / 2):
            return hit[1]
        try:
            m: Manifest | None = Manifest.from_json(self.store.read_bytes(manifest_path(key)))
            self.last_error = None
        except ObjectNotFound:
            m = None
        except (StoreError, ValueError) as e:
            self.last_error = f"store {self.uri}: {e}"
            log.warning("cannot read manifest %s: %s", key[:12], e, extra=fields(key=key))
            return hit[1] if hit is not None else None
        self._cache[key] = (now, m)
        return m

    def artefact_manifest(self, kind: ArtefactKind, key: str) -> ArtefactManifest | None:
        """An LLM artefact's committed manifest (None: absent), cached as engine manifests are. A
        committed manifest never changes, so a present one is kept for the TTL; StoreError when the
        store cannot answer or the manifest does not parse."""
        now = time.monotonic()
        hit = self._artefacts.get((kind, key))
        if hit is not None and now - hit[0] < (self.ttl_s if hit[1] is not None else self.ttl_s / 2):
            return hit[1]
        m = read_manifest(self.store, kind, key)
        self._artefacts[(kind, key)] = (now, m)
        return m

    def verify_grant(self, namespace: str, job: str) -> VerifyGrant | None:
        """The operator's record of its verify Job `namespace/job` (never cached: it changes within a
        second of being written). None when there is none or it does not parse; StoreError when the
        store cannot answer."""
        try:
            path = verify_grant_path(namespace, job)
        except ValueError:
            return None
        try:
            return VerifyGrant.from_json(self.store.read_bytes(path))
        except ObjectNotFound:
            return None
        except ValueError as e:
            log.warning("verify grant %s is not valid: %s", path, e, extra=fields(path=path))
            return None

    def possession(self, namespace: str, fingerprint: str) -> PossessionRecord | None:
        """The broker's record that `namespace` holds a model through the source `fingerprint`.

        A record that does not parse counts as none (the namespace verifies again)."""
        now = time.monotonic()
        k = (namespace, fingerprint)
        hit = self._possession.get(k)
        if hit is not None and now - hit[0] < (self.ttl_s if hit[1] is not None else self.ttl_s / 2):
            return hit[1]
        try:
            rec: PossessionRecord | None = PossessionRecord.from_json(
                self.store.read_bytes(possession_path(namespace, fingerprint))
            )
        except ObjectNotFound:
            rec = None
        except ValueError as e:
            log.warning("possession record %s/%s is not valid: %s", namespace, fingerprint[:12], e)
            rec = None
        except StoreError as e:
            self.last_error = f"store {self.uri}: {e}"
            log.warning("cannot read possession record %s/%s: %s", namespace, fingerprint[:12], e)
            return hit[1] if hit is not None else None
        self._possession[k] = (now, rec)
        return rec

    def invalidate_possession(self, namespace: str, fingerprint: str) -> None:
        self._possession.pop((namespace, fingerprint), None)

    def invalidate(self, key: str) -> None:
        self._cache.pop(key, None)

    def request(self, request_key: str) -> RequestRecord | None:
        """The request index entry a builder filed (docs/design.md §"Engine keys"); None when absent.

        Missing entries are cached briefly, present ones for the TTL (a builder may replace one)."""
        now = time.monotonic()
        hit = self._requests.get(request_key)
        if hit is not None and now - hit[0] < (self.ttl_s if hit[1] is not None else self.ttl_s / 2):
            return hit[1]
        try:
            r: RequestRecord | None = RequestRecord.from_json(
                self.store.read_bytes(request_path(request_key))
            )
            if r is not None and r.request_key != request_key:
                raise ValueError(f"{request_path(request_key)} names request {r.request_key}")
        except ObjectNotFound:
            r = None
        except (StoreError, ValueError) as e:
            self.last_error = f"store {self.uri}: {e}"
            log.warning("cannot read request %s: %s", request_key[:12], e, extra=fields(request=request_key))
            return hit[1] if hit is not None else None
        self._requests[request_key] = (now, r)
        return r

    def invalidate_request(self, request_key: str) -> None:
        self._requests.pop(request_key, None)

    def keys(self) -> list[str]:
        """Keys with a committed manifest."""
        out = []
        for p in self.store.list(f"{ENGINES}/"):
            parts = p.split("/")
            if len(parts) == 3 and parts[2] == MANIFEST:
                out.append(parts[1])
        return out

    def delete_engine(self, key: str) -> None:
        """Manifest first (the engine stops existing), then the files."""
        d = f"{ENGINES}/{key}/"
        files = self.store.list(d)
        mpath = manifest_path(key)
        if mpath in files:
            self.store.delete(mpath)
        for p in files:
            if p != mpath:
                self.store.delete(p)
        self.invalidate(key)
