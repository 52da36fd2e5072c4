"""The store steps both LLM forge commands take (`trtforge quantize`, `trtforge tune`): open the store,
look an artefact up, publish a folder as one; each store failure a BuildError naming its step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtforge.contract.llm.artefact import ArtefactFile, ArtefactFormat, ArtefactKind, ArtefactManifest
from trtforge.contract.llm.recipe import Backend
from trtforge.store import EngineStore, StoreError, artefacts, open_store
from trtforge_builder.errors import BuildError


def open_artefact_store(uri: str) -> EngineStore:
    try:
        return open_store(uri)
    except StoreError as e:
        raise BuildError(str(e), "StoreUnavailable", step="open-store") from e


def look_up(store: EngineStore, kind: ArtefactKind, key: str) -> ArtefactManifest | None:
    try:
        return artefacts.read_manifest(store, kind, key)
    except StoreError as e:
        raise BuildError(str(e), "StoreUnavailable", step="look-up") from e


def publish_folder(
    store: EngineStore,
    kind: ArtefactKind,
    key: str,
    folder: Path,
    fmt: ArtefactFormat,
    backend: Backend,
    version: str,
    replace: bool = False,
    **payload: Any,
) -> tuple[ArtefactManifest, bool]:
    """`folder` published as artefact `key` of `kind` (trtforge.store.artefacts.publish): the manifest
    and whether this call committed it (False: another writer's was there first; `replace`: it
    replaces one already there). `payload` is the manifest's kind-specific part (`checkpoint=` or
    `tuning=`)."""

    def describe(upload: str, files: list[ArtefactFile]) -> ArtefactManifest:
        return ArtefactManifest(
            kind=kind,
            key=key,
            format=fmt,
            backend=backend,
            backend_version=version,
            upload=upload,
            files=files,
            **payload,
        )

    try:
        return artefacts.publish(store, kind, key, folder, describe, replace=replace)
    except StoreError as e:
        raise BuildError(str(e), "StoreUnavailable", step="publish") from e
