"""The offline bundle names every distribution `trtforge serve` needs, at this venv's versions."""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks.offline_bundle import CLIENT, HOST, RUNTIME, S3_ONLY, pins


def requirement_closure(name: str) -> set[str]:
    """Every distribution `name` needs as installed here, through the extras it asks of each."""
    seen: dict[str, set[str]] = {}
    todo: list[tuple[str, frozenset[str]]] = [(name, frozenset())]
    while todo:
        dist, extras = todo.pop()
        key = canonicalize_name(dist)
        if key in seen and extras <= seen[key]:
            continue
        seen.setdefault(key, set()).update(extras)
        for line in metadata.requires(dist) or []:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return set(seen)


def test_the_bundle_holds_the_runtimes_whole_closure_but_what_the_host_has() -> None:
    needed = requirement_closure("trtforge-runtime") - {"trtforge", "trtforge-runtime"}
    left_out = {canonicalize_name(n) for n in (*HOST, *S3_ONLY)}
    bundled = {canonicalize_name(n) for n in (*RUNTIME, *CLIENT)}
    assert needed - left_out - bundled == set()
    assert "aiohttp" in needed and "grpcio" in needed  # the closure is read, not empty


def test_pins_are_this_environments_versions() -> None:
    versions = {"aiohttp": "3.14.5", "zope.event": "6.2"}
    assert pins(["aiohttp", "zope.event"], versions.__getitem__) == ["aiohttp==3.14.5", "zope.event==6.2"]
    assert pins(RUNTIME) == [f"{n}=={metadata.version(n)}" for n in RUNTIME]  # every one is installed here
