"""Multi-file LLM artefacts on any store (PVC, S3): publish a folder atomically, fetch and verify it.

Publishing streams every file into ``<kind dir>/<key>/<upload>/`` (a fresh upload id per attempt),
hashing it on the way, then commits the manifest with the store's create-if-absent
(`EngineStore.commit`: a hard link on a PVC, ``If-None-Match: *`` on S3). The manifest is the commit:
until it exists the artefact is absent, and the loser of a race reads the winner's. Fetching
streams each file into a temp folder, checks its size and sha256, and renames the folder into place
only when every file matched; a file that doesn't is refused by name. Nothing is held in memory
beyond one chunk (docs/llm.md §"Artefacts").
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from trtforge.contract.llm.artefact import (
    ArtefactFile,
    ArtefactKind,
    ArtefactManifest,
    artefact_dir,
    check_relative_path,
    file_path,
    manifest_path,
)
from trtforge.store.base import EngineStore, IntegrityError, ObjectNotFound, StoreError

CHUNK = 1 << 20


def local_files(folder: Path) -> list[Path]:
    """The regular files under `folder`, sorted by relative path (hidden names and links refused)."""
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink():
            raise StoreError(f"{folder}: {rel} is a symbolic link; an artefact holds regular files only")
        if p.is_file():
            if any(part.startswith(".") for part in rel.split("/")):
                raise StoreError(f"{folder}: {rel} is a hidden name; an artefact's files need plain names")
            out.append(p)
    return out


def read_manifest(store: EngineStore, kind: ArtefactKind, key: str) -> ArtefactManifest | None:
    """The committed manifest, or None: an artefact without a manifest is absent."""
    try:
        data = store.read_bytes(manifest_path(kind, key))
    except ObjectNotFound:
        return None
    try:
        return ArtefactManifest.from_json(data)
    except ValueError as e:
        raise StoreError(
            f"store {store.uri}: {manifest_path(kind, key)} is not a valid artefact manifest: {e}"
        ) from e


def publish(
    store: EngineStore,
    kind: ArtefactKind,
    key: str,
    folder: Path,
    make_manifest: Callable[[str, list[ArtefactFile]], ArtefactManifest],
    *,
    replace: bool = False,
) -> tuple[ArtefactManifest, bool]:
    """Publish the files under `folder` as artefact `key`; `make_manifest(upload, files)` describes
    them. Returns the committed manifest and whether this call committed it (False: it existed, or
    another writer won the race; either way the returned manifest is the one in the store).
    `replace`: the new manifest replaces one already there (a re-measure after a GPU fault); a reader
    sees the old or the new upload whole, as the manifest is written last."""
    existing = None if replace else read_manifest(store, kind, key)
    if existing is not None:
        return existing, False
    upload = secrets.token_hex(8)
    files = []
    for p in local_files(folder):
        rel = check_relative_path(p.relative_to(folder).as_posix())
        with p.open("rb") as src:
            put = store.put(file_path(kind, key, upload, rel), src)
        files.append(ArtefactFile(path=rel, size=put.size_bytes, sha256=put.sha256))
    manifest = make_manifest(upload, files)
    if (manifest.kind, manifest.key, manifest.upload, manifest.files) != (kind, key, upload, files):
        raise ValueError("make_manifest must describe the kind, key, upload and files it was given")
    if replace:
        store.put_bytes(manifest_path(kind, key), manifest.to_json().encode())
        return manifest, True
    if store.commit(manifest_path(kind, key), manifest.to_json().encode()):
        return manifest, True
    winner = read_manifest(store, kind, key)
    if winner is None:
        raise StoreError(
            f"store {store.uri}: lost the commit of {manifest_path(kind, key)} but can't read it"
        )
    for f in files:  # the loser's upload is garbage: nothing names it
        store.delete(file_path(kind, key, upload, f.path))
    return winner, False


def _stream_verified(
    store: EngineStore, manifest: ArtefactManifest, f: ArtefactFile, dst: Path | None
) -> None:
    where = file_path(manifest.kind, manifest.key, manifest.upload, f.path)
    h = hashlib.sha256()
    size = 0
    out = dst.open("wb") if dst is not None else None
    try:
        for chunk in store.iter_chunks(where, CHUNK):
            h.update(chunk)
            size += len(chunk)
            if out is not None:
                out.write(chunk)
        if out is not None:
            out.flush()
            os.fsync(out.fileno())
    finally:
        if out is not None:
            out.close()
    if size != f.size or h.hexdigest() != f.sha256:
        raise IntegrityError(
            f"store {store.uri}: artefact {manifest.key} file {f.path} has {size} bytes, "
            f"sha256 {h.hexdigest()}; "
            f"its manifest says {f.size} bytes, sha256 {f.sha256} (tampered or corrupt: refused)"
        )


def verify(store: EngineStore, manifest: ArtefactManifest) -> None:
    """Read every file of a committed artefact and check it against its manifest (IntegrityError
    naming the first file that differs)."""
    for f in manifest.files:
        _stream_verified(store, manifest, f, None)


def fetch(store: EngineStore, kind: ArtefactKind, key: str, dest: Path) -> ArtefactManifest:
    """Fetch artefact `key` into folder `dest` (which must not exist), every file verified; the folder
    appears whole (renamed into place) or not at all. ObjectNotFound when it isn't committed."""
    manifest = read_manifest(store, kind, key)
    if manifest is None:
        raise ObjectNotFound(f"store {store.uri}: artefact {kind} {key} does not exist (no manifest)")
    if dest.exists():
        raise StoreError(f"{dest} exists already; fetch into a new folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial"))
    try:
        for f in manifest.files:
            target = tmp / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            _stream_verified(store, manifest, f, target)
        (tmp / "manifest.json").write_text(manifest.to_json())
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def in_place(store: EngineStore, manifest: ArtefactManifest) -> Path | None:
    """The folder holding a committed artefact's files when the store is a mounted directory (a PVC),
    so a reader can verify it there (`verify_folder`) instead of copying several GiB; else None."""
    from trtforge.store.local import LocalStore

    if not isinstance(store, LocalStore):
        return None
    return store.file(f"{artefact_dir(manifest.kind, manifest.key)}/{manifest.upload}")


def verify_folder(folder: Path, manifest: ArtefactManifest) -> None:
    """Check a local copy (or a PVC folder used in place) against `manifest`: every listed file
    present with its size and sha256 (IntegrityError naming the first that differs)."""
    for f in manifest.files:
        p = folder / f.path
        if not p.is_file():
            raise IntegrityError(f"{folder}: artefact {manifest.key} file {f.path} is missing")
        h = hashlib.sha256()
        size = 0
        with p.open("rb") as src:
            while chunk := src.read(CHUNK):
                h.update(chunk)
                size += len(chunk)
        if size != f.size or h.hexdigest() != f.sha256:
            raise IntegrityError(
                f"{folder}: artefact {manifest.key} file {f.path} has {size} bytes, sha256 {h.hexdigest()}; "
                f"its manifest says {f.size} bytes, sha256 {f.sha256} (tampered or corrupt: refused)"
            )
