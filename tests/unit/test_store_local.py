"""The directory store (pvc://, file://, paths) on disk: atomic put, commit races, a crash mid-put."""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trtforge.contract import layout
from trtforge.store import IntegrityError, ObjectNotFound, StoreError, join_uri, open_store
from trtforge.store.local import LocalStore

KEY = "a" * 64


def test_put_get_list_delete(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    data = os.urandom(3 * (1 << 20) + 17)
    res = store.put(layout.engine_path(KEY, "engine.plan"), io.BytesIO(data))
    import hashlib

    assert res.sha256 == hashlib.sha256(data).hexdigest() and res.size_bytes == len(data)
    out = io.BytesIO()
    got = store.get(layout.engine_path(KEY, "engine.plan"), out, expected_sha256=res.sha256)
    assert out.getvalue() == data and got.sha256 == res.sha256
    store.put_bytes(layout.manifest_path(KEY), b"{}")
    assert store.list("engines/") == [layout.engine_path(KEY, "engine.plan"), layout.manifest_path(KEY)]
    assert store.list(f"engines/{KEY[:10]}") == store.list("engines/")
    assert store.list("timing-caches/") == []
    assert store.exists(layout.manifest_path(KEY))
    with pytest.raises(IntegrityError, match="expected 0000"):
        store.get(layout.engine_path(KEY, "engine.plan"), io.BytesIO(), expected_sha256="0" * 64)
    store.delete(layout.engine_path(KEY, "engine.plan"))
    store.delete(layout.manifest_path(KEY))
    store.delete(layout.manifest_path(KEY))  # already gone: fine
    assert store.list("") == [] and not (tmp_path / "s" / "engines").exists()
    with pytest.raises(ObjectNotFound, match="does not exist"):
        store.read_bytes(layout.manifest_path(KEY))


def test_uris_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTFORGE_PVC_ROOT", str(tmp_path))
    (tmp_path / "claim").mkdir()
    s = open_store("pvc://claim/prefix/")
    assert (
        isinstance(s, LocalStore)
        and s.root == tmp_path / "claim" / "prefix"
        and s.uri == "pvc://claim/prefix"
    )
    s.put_bytes("x/y", b"1")
    assert (tmp_path / "claim" / "prefix" / "x" / "y").read_bytes() == b"1"
    assert join_uri(s.uri, "x/y") == "pvc://claim/prefix/x/y"
    f = open_store(f"file://{tmp_path}/f")
    assert isinstance(f, LocalStore) and f.root == tmp_path / "f"
    with pytest.raises(StoreError, match=r"not mounted at .*/nope"):
        open_store("pvc://nope/x").exists("a")
    with pytest.raises(StoreError, match="unknown scheme 'gs'"):
        open_store("gs://bucket/x")
    with pytest.raises(StoreError, match="relative path"):
        s.put_bytes("../escape", b"")
    with pytest.raises(StoreError, match="relative path"):
        s.put_bytes("x/.hidden", b"")


def test_commit_never_replaces(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    assert store.commit(layout.manifest_path(KEY), b"first") is True
    assert store.commit(layout.manifest_path(KEY), b"second") is False
    assert store.read_bytes(layout.manifest_path(KEY)) == b"first"
    assert store.list("") == [layout.manifest_path(KEY)]  # no temp files left


def test_unwritable_store_names_the_path(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        blocker = tmp_path / "file"
        blocker.write_text("x")
        store = open_store(str(blocker / "sub"))  # a path below a regular file
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        store = open_store(str(ro / "sub"))
    with pytest.raises(StoreError, match=r"cannot create the directory for engines/"):
        store.put_bytes(layout.manifest_path(KEY), b"x")


def _racer(root: str, n: int, start: float, q: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = open_store(root)
    while time.time() < start:
        pass
    won = store.commit(layout.manifest_path(KEY), f"writer-{n}".encode() * 1000)
    q.put((n, won))


def test_racing_commits_have_one_winner(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    q: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    start = time.time() + 0.3
    procs = [ctx.Process(target=_racer, args=(str(tmp_path), n, start, q)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(10)
    results = dict(q.get(timeout=5) for _ in procs)
    winners = [n for n, won in results.items() if won]
    assert len(winners) == 1
    assert (
        open_store(str(tmp_path)).read_bytes(layout.manifest_path(KEY))
        == f"writer-{winners[0]}".encode() * 1000
    )


def test_crash_mid_put_leaves_no_visible_object(tmp_path: Path) -> None:
    """A writer SIGKILLed halfway through an upload: nothing at the final name, nothing listed."""
    script = textwrap.dedent(f"""
        import sys
        from trtforge.store import open_store
        store = open_store({str(tmp_path)!r})
        store.put("engines/{KEY}/engine.plan", sys.stdin.buffer)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(os.urandom(4 << 20))
    proc.stdin.flush()
    engine_dir = tmp_path / "engines" / KEY
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (engine_dir.is_dir() and any(engine_dir.iterdir())):
        time.sleep(0.05)
    time.sleep(0.2)  # let it copy some of what was sent
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    store = open_store(str(tmp_path))
    leftovers = list(engine_dir.iterdir())
    assert leftovers and all(p.name.startswith(".engine.plan.") for p in leftovers)  # only the hidden temp
    assert leftovers[0].stat().st_size > 0
    assert not store.exists(layout.engine_path(KEY, "engine.plan"))
    assert store.list("") == []
    assert isinstance(store, LocalStore)
    assert store.clean_temp(older_than_s=0) == 1 and not any(engine_dir.iterdir())
