"""The control-plane binaries: find them, or build them from Debian's `kubernetes` source and cache them.

Order of preference for etcd, kube-apiserver, kube-controller-manager and kube-scheduler:
``$KUBEBUILDER_ASSETS``, then PATH, then the cache ``~/.cache/trtforge/bin/<version>/`` (which holds
a ``SHA256SUMS`` file so a corrupt cache is detected). kubectl prefers ``$KUBEBUILDER_ASSETS``, then
the cache (a 1.20 kubectl matching the apiserver), then PATH.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from trtforge.logs import fields
from trtforge_dev.testbed.paths import cache_dir

log = logging.getLogger(__name__)

K8S_VERSION = "1.20.2"
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
KUBE_BINARIES = (*CONTROL_PLANE, "kubectl")
SUMS_FILE = "SHA256SUMS"
ASSETS_ENV = "KUBEBUILDER_ASSETS"


class BinariesError(RuntimeError):
    """A binary is missing or the cache is corrupt; the message says what to run."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path

    def as_dict(self) -> dict[str, str]:
        return {
            "etcd": str(self.etcd),
            "kube-apiserver": str(self.kube_apiserver),
            "kube-controller-manager": str(self.kube_controller_manager),
            "kube-scheduler": str(self.kube_scheduler),
            "kubectl": str(self.kubectl),
        }


def cache_bin_dir(version: str = K8S_VERSION) -> Path:
    return cache_dir() / "bin" / version


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_sums(directory: Path, names: tuple[str, ...] = KUBE_BINARIES) -> None:
    lines = [f"{sha256_file(directory / n)}  {n}" for n in names]
    (directory / SUMS_FILE).write_text("\n".join(lines) + "\n")


def cache_problems(directory: Path, names: tuple[str, ...] = KUBE_BINARIES) -> list[str]:
    """What is wrong with a cache directory (empty list: it is complete and intact)."""
    sums = directory / SUMS_FILE
    if not directory.is_dir():
        return [f"{directory} does not exist"]
    if not sums.is_file():
        return [f"{sums} is missing"]
    expected: dict[str, str] = {}
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            expected[parts[1]] = parts[0]
    problems = []
    for n in names:
        p = directory / n
        if n not in expected:
            problems.append(f"{n} is not listed in {sums}")
        elif not p.is_file():
            problems.append(f"{p} is missing")
        elif not os.access(p, os.X_OK):
            problems.append(f"{p} is not executable")
        elif sha256_file(p) != expected[n]:
            problems.append(f"{p} does not match its checksum in {sums}")
    return problems


def _from_assets(name: str) -> Path | None:
    assets = os.environ.get(ASSETS_ENV)
    if assets:
        p = Path(assets) / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def _from_path(name: str) -> Path | None:
    found = shutil.which(name)
    return Path(found) if found else None


def external_control_plane() -> bool:
    """True when KUBEBUILDER_ASSETS or PATH provide all three control-plane binaries."""
    return all(_from_assets(n) or _from_path(n) for n in CONTROL_PLANE)


def resolve(verify_cache: bool = True) -> Binaries:
    """Find every binary the test bed runs, or raise :class:`BinariesError` saying what to do."""
    cache = cache_bin_dir()
    need_cache = not external_control_plane()
    if need_cache:
        problems = cache_problems(cache) if verify_cache else []
        if not cache.is_dir():
            raise BinariesError(
                "the Kubernetes control-plane binaries are not installed (none in $KUBEBUILDER_ASSETS, "
                f"on PATH or in {cache}): run `trtforge cluster install` (or `make binaries`)"
            )
        if problems:
            raise BinariesError(
                f"the binary cache {cache} is corrupt ({'; '.join(problems)}): run "
                "`trtforge cluster install` to rebuild it"
            )
    etcd = _from_assets("etcd") or _from_path("etcd")
    if etcd is None:
        raise BinariesError(
            "etcd is not installed: run `sudo apt-get install -y etcd-server` "
            "(or `make deps`), or point $KUBEBUILDER_ASSETS at a directory holding it"
        )
    found: dict[str, Path] = {}
    for n in CONTROL_PLANE:
        found[n] = _from_assets(n) or _from_path(n) or cache / n
    cached_kubectl = cache / "kubectl"
    kubectl = (
        _from_assets("kubectl")
        or (cached_kubectl if cached_kubectl.is_file() else None)
        or _from_path("kubectl")
    )
    if kubectl is None:
        raise BinariesError("kubectl was not found: run `trtforge cluster install`")
    return Binaries(
        etcd=etcd,
        kube_apiserver=found["kube-apiserver"],
        kube_controller_manager=found["kube-controller-manager"],
        kube_scheduler=found["kube-scheduler"],
        kubectl=kubectl,
    )


def seed_cache(source: Path, version: str = K8S_VERSION) -> Path:
    """Copy already-built binaries from `source` into the cache (atomically) and checksum them."""
    missing = [n for n in KUBE_BINARIES if not (source / n).is_file()]
    if missing:
        raise BinariesError(
            f"{source} lacks {', '.join(missing)}; expected the four binaries "
            f"{', '.join(KUBE_BINARIES)} built from Kubernetes {version}"
        )
    dest = cache_bin_dir(version)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for n in KUBE_BINARIES:
        shutil.copy2(source / n, tmp / n)
        (tmp / n).chmod(0o755)
    write_sums(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    log.info("binaries cached", extra=fields(dir=str(dest)))
    return dest
