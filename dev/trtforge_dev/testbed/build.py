"""Build kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from Debian's
`kubernetes` source package (docs/design.md §"The test bed") and put them in the binary cache.

Steps, each logged: check Debian packages → make sure a deb-src entry exists → ``apt-get source
--download-only kubernetes`` → unpack the upstream tarball → patch reflect2 → ``make WHAT=…`` (progress
every few seconds) → copy into the cache with a checksum file.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path

from trtforge.logs import fields
from trtforge_dev.testbed import reflect2_patch
from trtforge_dev.testbed.binaries import K8S_VERSION, KUBE_BINARIES, BinariesError, seed_cache
from trtforge_dev.testbed.paths import cache_dir

log = logging.getLogger(__name__)

BUILD_PACKAGES = ("golang-go", "rsync", "dpkg-dev", "etcd-server")
SOURCE_PACKAGE = "kubernetes"
SOURCES_FILE = Path("/etc/apt/sources.list.d/trtforge-src.sources")
MAKE_WHAT = " ".join(f"cmd/{n}" for n in KUBE_BINARIES)


def missing_debian_packages(packages: tuple[str, ...] = BUILD_PACKAGES) -> list[str]:
    missing = []
    for p in packages:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
        if r.returncode != 0 or "install ok installed" not in r.stdout:
            missing.append(p)
    return missing


def check_debian_packages() -> None:
    if shutil.which("dpkg-query") is None:
        raise BinariesError(
            "this is not a Debian-like system (no dpkg-query): install etcd and the "
            "Kubernetes 1.20 binaries yourself and point $KUBEBUILDER_ASSETS at them"
        )
    missing = missing_debian_packages()
    if missing:
        names = " ".join(missing)
        raise BinariesError(
            f"missing Debian packages: {names}. Install them with "
            f"`sudo apt-get install -y {names}` (or `make deps`), then run this again"
        )


def go_version() -> tuple[int, int]:
    out = subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"go(\d+)\.(\d+)", out)
    if not m:
        raise BinariesError(f"cannot read the Go version from {out.strip()!r}")
    return int(m[1]), int(m[2])


def deb_src_entry(sources_dir: Path = Path("/etc/apt"), os_release: Path = Path("/etc/os-release")) -> str:
    """A deb822 deb-src stanza for the mirror and suites the system already uses for binaries."""
    uris, suites = "http://deb.debian.org/debian", ""
    for f in sorted(sources_dir.glob("sources.list.d/*.sources")):
        if f == SOURCES_FILE:
            continue
        for stanza in f.read_text().split("\n\n"):
            kv = dict(
                line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith("#")
            )
            if "deb" in kv.get("Types", "").split() and "security" not in kv.get("URIs", ""):
                uris = kv.get("URIs", uris).strip()
                suites = kv.get("Suites", "").strip()
                break
        if suites:
            break
    if not suites:
        codename = ""
        if os_release.is_file():
            m = re.search(r"^VERSION_CODENAME=(\S+)", os_release.read_text(), re.M)
            codename = m[1].strip('"') if m else ""
        suites = codename or "bookworm"
    return (
        f"Types: deb-src\nURIs: {uris}\nSuites: {suites}\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BinariesError(
            f"`{' '.join(cmd)}` failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-600:]}"
        )
    return r.stdout


def ensure_deb_src() -> None:
    """Make `apt-get source kubernetes` possible: add our own deb-src file if none provides it."""
    probe = subprocess.run(["apt-cache", "showsrc", SOURCE_PACKAGE], capture_output=True, text=True)
    if probe.returncode == 0 and "Package: kubernetes" in probe.stdout:
        return
    if os.geteuid() != 0:
        raise BinariesError(
            f"no deb-src entry provides `{SOURCE_PACKAGE}`; run as root (or add one "
            f"like this to {SOURCES_FILE}):\n{deb_src_entry()}"
        )
    log.info("adding a deb-src entry", extra=fields(file=str(SOURCES_FILE)))
    SOURCES_FILE.write_text(deb_src_entry())
    log.info("apt-get update")
    _run(["apt-get", "update", "-qq"])


def download_source(workdir: Path) -> Path:
    """`apt-get source --download-only kubernetes` into `workdir`; returns the upstream tarball."""
    workdir.mkdir(parents=True, exist_ok=True)
    existing = sorted(workdir.glob(f"{SOURCE_PACKAGE}_*.orig.tar.gz"))
    if not existing:
        log.info("downloading the Debian source package", extra=fields(package=SOURCE_PACKAGE))
        _run(["apt-get", "source", "--download-only", SOURCE_PACKAGE], cwd=workdir)
        existing = sorted(workdir.glob(f"{SOURCE_PACKAGE}_*.orig.tar.gz"))
    if not existing:
        raise BinariesError(f"apt-get source left no {SOURCE_PACKAGE}_*.orig.tar.gz in {workdir}")
    tarball = existing[-1]
    if f"really{K8S_VERSION}" not in tarball.name and f"_{K8S_VERSION}." not in tarball.name:
        raise BinariesError(
            f"{tarball.name} is not Kubernetes {K8S_VERSION}; this test bed is made for "
            "Debian 12's kubernetes 1.20.5+really1.20.2"
        )
    return tarball


def unpack(tarball: Path, dest: Path) -> Path:
    """Unpack the upstream tree (fresh) into `dest`."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    log.info("unpacking", extra=fields(tarball=tarball.name, dest=str(dest)))
    with tarfile.open(tarball) as tf:
        tf.extractall(dest, filter="tar")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1 or not (tops[0] / "Makefile").is_file():
        raise BinariesError(f"{tarball} did not unpack to one Kubernetes source tree")
    return tops[0]


def run_make(tree: Path, log_file: Path, progress_every_s: float = 15.0) -> None:
    """The tree's own `make WHAT=…`, output to `log_file`, progress logged while it runs."""
    log.info("building (about 6-7 minutes on 2 cores)", extra=fields(what=MAKE_WHAT, log=str(log_file)))
    start = time.monotonic()
    with log_file.open("w") as out:
        proc = subprocess.Popen(["make", f"WHAT={MAKE_WHAT}"], cwd=tree, stdout=out, stderr=subprocess.STDOUT)
        stop = threading.Event()

        def report() -> None:
            while not stop.wait(progress_every_s):
                last = _last_line(log_file)
                log.info("still building", extra=fields(elapsed_s=round(time.monotonic() - start), last=last))

        t = threading.Thread(target=report, daemon=True)
        t.start()
        rc = proc.wait()
        stop.set()
    if rc != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-20:])
        raise BinariesError(f"`make` failed (exit {rc}); see {log_file}. Last lines:\n{tail}")
    log.info("build finished", extra=fields(seconds=round(time.monotonic() - start)))


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:120] if lines else ""


def build_from_debian_source() -> Path:
    """The whole build; returns the cache directory holding the binaries."""
    check_debian_packages()
    work = cache_dir() / "build"
    ensure_deb_src()
    tarball = download_source(work)
    tree = unpack(tarball, work / "src")
    if go_version() >= (1, 18):
        changed = reflect2_patch.apply(tree)
        log.info("patched vendored reflect2 for Go >= 1.18", extra=fields(changed=changed))
    run_make(tree, work / "make.log")
    out = tree / "_output" / "bin"
    dest = seed_cache(out)
    shutil.rmtree(work / "src", ignore_errors=True)
    return dest
