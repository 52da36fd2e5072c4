"""Each peer server in its own virtual environment under ``.cache/``, so its pins never touch the
project's ``.venv`` or each other's. Every one gets the project's own ONNX Runtime version, so all
servers run the same kernels.

- KServe 0.21 (``.cache/bench-kserve-venv``);
- Triton: the PyPI wheel ``nvidia-pytriton`` 0.7.0, which ships the ``tritonserver`` binary and
  its Python backend (``.cache/bench-triton-venv``);
- MLServer 1.7.1 with ``uvloop==0.21.0``: later uvloop versions break its parallel workers (MLServer
  issue 2286) (``.cache/bench-mlserver-venv``).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, log, pkg_version


@dataclass(frozen=True)
class Venv:
    name: str
    packages: tuple[str, ...]
    onnxruntime: bool = True  # a server's venv gets the project's ONNX Runtime version

    @property
    def path(self) -> Path:
        return ROOT / ".cache" / f"bench-{self.name}-venv"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def requirements(self) -> list[str]:
        return [*self.packages, *([f"onnxruntime=={ort_version()}"] if self.onnxruntime else [])]

    def stamp(self) -> Path:
        digest = hashlib.sha256("\n".join(self.requirements()).encode()).hexdigest()[:12]
        return self.path / f".installed-{digest}"

    def ready(self) -> bool:
        return self.stamp().exists()

    def ensure(self) -> Path:
        """Create or update the venv when its requirements changed; its python."""
        if self.ready():
            return self.python
        reqs = self.requirements()
        log(f"installing {self.path.relative_to(ROOT)}: {' '.join(reqs)}")
        if not self.python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(self.path)], check=True)
        pip = [str(self.python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, *reqs], check=True)
        for old in self.path.glob(".installed-*"):
            old.unlink()
        self.stamp().touch()
        return self.python

    def version(self, dist: str) -> str:
        return pkg_version(self.python, dist) if self.python.exists() else "absent"


def ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


KSERVE = Venv("kserve", ("kserve==0.21.0",))
TRITON = Venv("triton", ("nvidia-pytriton==0.7.0",))
MLSERVER = Venv("mlserver", ("mlserver==1.7.1", "uvloop==0.21.0"))
VENVS = {"kserve": KSERVE, "triton": TRITON, "mlserver": MLSERVER}


def peer_versions() -> dict[str, dict[str, str]]:
    """Each peer venv's pinned distributions and its ONNX Runtime, as installed ("absent" if not)."""
    return {
        name: {d: v.version(d) for d in (*(p.split("==")[0] for p in v.packages), "onnxruntime")}
        for name, v in VENVS.items()
    }


def site_packages(v: Venv) -> Path:
    out = subprocess.run(
        [str(v.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def python_libdir(v: Venv) -> Path:
    """The directory holding the venv's libpython (what Triton's Python-backend stub links to)."""
    out = subprocess.run(
        [str(v.python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def python_version(v: Venv) -> str:
    out = subprocess.run(
        [str(v.python), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.servers.venvs [NAME...]``: make the peers' venvs."""
    names = sys.argv[1:] if argv is None else argv
    for name in names or list(VENVS):
        VENVS[name].ensure()
    return 0


if __name__ == "__main__":
    sys.exit(main())
