"""Basic lint of the three Dockerfiles (no Docker engine here, so they are read, not built)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "operator": REPO / "operator" / "Dockerfile",
    "builder": REPO / "builder_job" / "Dockerfile",
    "runtime": REPO / "runtime_image" / "Dockerfile",
}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{path}: a continuation line runs off the end"
    return out


@pytest.fixture(params=sorted(DOCKERFILES), ids=str)
def component(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_runs_as_a_numeric_non_root_user(component: str) -> None:
    users = [a for i, a in instructions(DOCKERFILES[component]) if i == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), f"USER {users[-1]}: numeric, so that runAsNonRoot can be verified"
    assert int(uid) != 0


def test_base_images_are_pinned_by_arg_versions(component: str) -> None:
    ins = instructions(DOCKERFILES[component])
    stage_names = {a.split()[-1].lower() for i, a in ins if i == "FROM" and " as " in a.lower()}
    declared = {a.split("=")[0] for i, a in ins if i == "ARG"}
    froms = [a.split()[0] for i, a in ins if i == "FROM"]
    assert froms
    for image in froms:
        if image.lower() in stage_names:
            continue
        assert "latest" not in image, image
        assert ":" in image or "@" in image, f"{image}: no tag"
        used = set(re.findall(r"\$\{(\w+)\}", image))
        assert used, f"{image}: its version should be a build ARG"
        assert used <= declared, f"{image}: uses undeclared ARGs {used - declared}"
    for i, a in ins:
        assert "latest" not in a.split("#")[0].lower() or i in ("LABEL",), f"{i} {a}: a latest tag"


FOLDERS = {"operator": "operator", "builder": "builder_job", "runtime": "runtime_image"}


def installed_sources(component: str) -> tuple[list[str], list[str]]:
    """(what the image COPYs from the repository, the local paths its `pip install` names)."""
    ins = instructions(DOCKERFILES[component])
    copies = [a.split()[0] for i, a in ins if i == "COPY" and not a.startswith("--from")]
    runs = " ".join(a for i, a in ins if i == "RUN")
    m = re.search(r"pip install ([^;&]*)", runs)
    assert m, "no `pip install` of this repository"
    local = [w for w in m.group(1).split() if w == "." or w.startswith("./")]
    return copies, local


def test_installs_only_the_base_and_its_own_component(component: str) -> None:
    copies, local = installed_sources(component)
    folder = FOLDERS[component]
    assert sorted(local) == sorted([".", f"./{folder}"]), f"pip installs {local}: the base and {folder} only"
    assert set(copies) == {"pyproject.toml", "trtforge", folder}, f"COPY {copies}: only what it installs"
    assert tomllib.loads((REPO / folder / "pyproject.toml").read_text())["project"]["name"] == (
        f"trtforge-{component}"
    )


def test_no_remote_add_and_entrypoint_is_the_cli(component: str) -> None:
    ins = instructions(DOCKERFILES[component])
    assert not [a for i, a in ins if i == "ADD"], "use COPY (ADD fetches URLs and unpacks archives)"
    assert ("ENTRYPOINT", '["trtforge"]') in ins


def test_builder_is_nvidias_tensorrt_container() -> None:
    ins = instructions(DOCKERFILES["builder"])
    (base,) = [a for i, a in ins if i == "FROM"]
    assert base.startswith("nvcr.io/nvidia/tensorrt:${TENSORRT_CONTAINER_VERSION}")
    assert ("ARG", "TENSORRT_CONTAINER_VERSION") in ins or any(
        i == "ARG" and a.startswith("TENSORRT_CONTAINER_VERSION=") for i, a in ins
    )
    runs = " ".join(a for i, a in ins if i == "RUN")
    assert "--system-site-packages" in runs, "the venv must see the container's TensorRT"
    assert "tensorrt==" not in runs and "tensorrt-cu" not in runs, (
        "never reinstall TensorRT over the container's"
    )


def test_runtime_is_slim_with_the_full_runtime_as_an_option() -> None:
    ins = instructions(DOCKERFILES["runtime"])
    (base,) = [a for i, a in ins if i == "FROM"]
    assert base.startswith("nvidia/cuda:${CUDA_VERSION}-runtime-"), "the CUDA runtime, not devel"
    args = dict(a.split("=", 1) for i, a in ins if i == "ARG" and "=" in a)
    assert args["TENSORRT_RUNTIME"] == "lean"
    runs = " ".join(a for i, a in ins if i == "RUN")
    assert "tensorrt-lean-cu${CUDA_MAJOR}-libs==${TENSORRT_VERSION}" in runs
    assert "tensorrt-lean-cu${CUDA_MAJOR}-bindings==${TENSORRT_VERSION}" in runs
    assert "tensorrt-cu${CUDA_MAJOR}==${TENSORRT_VERSION}" in runs
    assert "--no-install-recommends" in runs and "rm -rf /var/lib/apt/lists/*" in runs
