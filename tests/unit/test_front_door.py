"""One set of image names and one store: the contract (trtforge/contract/images.py) against the
operator's defaults, the chart's values, `make images`' plan and the docs' commands."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from trtforge_dev import images as make_images
from trtforge_operator.config import OperatorConfig

from trtforge.contract import images

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trtforge"
DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "examples").rglob("*.yaml")),
]
DOCS += [REPO / "deploy" / "argocd" / "application.yaml"]
REPOSITORIES = {s.repository for s in images.IMAGES}
# An image reference in a page: <registry>/trtforge-<name>[:<tag>], where the registry is a host name
# (with a dot), a shell variable or a <placeholder>.
IMAGE_REF = re.compile(
    r"(?:[\w-]+\.[\w.:/-]*|\$\w+|\$\{\w+\}|<[\w -]+>)/(trtforge-[a-z-]+)(?::([\w.${}<>-]+))?"
)


def test_operator_defaults_are_the_contracts_images_and_store() -> None:
    cfg = OperatorConfig()
    assert cfg.builder_image == "ghcr.io/trtforge/trtforge-builder:0.1.0"
    assert cfg.runtime_image == "ghcr.io/trtforge/trtforge-runtime:0.1.0"
    assert cfg.runtime_image_full == "ghcr.io/trtforge/trtforge-runtime:0.1.0-full"
    assert cfg.store_uri == f"pvc://{images.STORE_CLAIM}/" == "pvc://trtforge-engines/"


def test_the_chart_names_the_same_images_registry_version_and_claim() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert values["global"]["imageRegistry"] == images.DEFAULT_REGISTRY
    assert chart["appVersion"] == chart["version"] == images.VERSION
    for spec in (images.OPERATOR, images.BUILDER, images.RUNTIME, images.RUNTIME_FULL):
        v = values["images"][spec.key]
        assert v["repository"] == spec.repository, spec.key
        assert v.get("tagSuffix", "") == spec.tag_suffix, spec.key
    # The claim is `<fullname>-engines`: trtforge-engines for the release `trtforge` the docs install.
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert '(printf "%s-engines" (include "trtforge.fullname" .))' in helpers
    assert images.STORE_CLAIM == "trtforge-engines"


def test_every_distribution_has_the_contracts_version() -> None:
    for p in [
        "pyproject.toml",
        "operator/pyproject.toml",
        "builder_job/pyproject.toml",
        "runtime_image/pyproject.toml",
    ]:
        assert tomllib.loads((REPO / p).read_text())["project"]["version"] == images.VERSION, p


def test_the_builder_dockerfile_is_based_on_the_contracts_tensorrt_container() -> None:
    text = (REPO / "builder_job" / "Dockerfile").read_text()
    assert f"ARG TENSORRT_CONTAINER_VERSION={images.TENSORRT_CONTAINER_VERSION}" in text
    assert make_images.TRT_VERSION_FILE in text  # where `make images` reads the builder's TensorRT


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_name_only_the_contracts_images_and_store(page: Path) -> None:
    text = page.read_text()
    for m in IMAGE_REF.finditer(text):
        assert m.group(1) in REPOSITORIES, f"{page.name}: {m.group(0)} is not one of {sorted(REPOSITORIES)}"
        tag = m.group(2)
        if tag and re.match(r"^\d", tag):
            assert tag in {images.VERSION + s.tag_suffix for s in images.IMAGES}, f"{page.name}: {m.group(0)}"
    for claim in re.findall(r"pvc://(trtforge-[a-z-]+)/", text):
        assert claim == images.STORE_CLAIM, f"{page.name}: pvc://{claim}/ is not the store's claim"


@pytest.mark.parametrize("page", ["docs/install.md", "docs/quickstart.md"])
def test_install_pushes_and_installs_under_one_prefix(page: str) -> None:
    """The page pushes the images under a prefix and gives the chart that same prefix."""
    text = (REPO / page).read_text()
    pushed = re.findall(r"make images PUSH=([\w./:-]+)", text)
    given = re.findall(r"--set global\.imageRegistry=([\w./:-]+)", text)
    assert pushed and given and set(pushed) == set(given), (pushed, given)


def test_make_images_plans_every_image_with_the_contracts_names() -> None:
    steps = make_images.plan("docker", "registry.example.com/team", None)
    builds = [s.argv for s in steps if s.argv[1] == "build"]
    tags = [a[a.index("-t") + 1] for a in builds]
    assert tags == [s.reference("registry.example.com/team") for s in images.IMAGES]
    assert tags[0] == "registry.example.com/team/trtforge-builder:0.1.0"
    # The builder's TensorRT version is read before the runtimes are built with it.
    read = next(i for i, s in enumerate(steps) if s.reads_trt_version)
    assert read == 1 and steps[read].argv[-1] == make_images.TRT_VERSION_FILE
    runtimes = [a for a in builds if "runtime_image/Dockerfile" in a]
    assert len(runtimes) == 2
    assert all(f"TENSORRT_VERSION={make_images.TRT_PLACEHOLDER}" in a for a in runtimes)
    pushes = [s.argv[2] for s in steps if s.argv[1] == "push"]
    assert pushes == tags


def test_make_images_with_a_known_tensorrt_reads_nothing_and_buildah_uses_bud() -> None:
    steps = make_images.plan("buildah", None, "10.13.3.9")
    assert not any(s.reads_trt_version for s in steps)
    assert all(s.argv[1] == "bud" for s in steps)  # no push without PUSH
    assert any("TENSORRT_VERSION=10.13.3.9" in s.argv for s in steps)


def test_no_container_tool_is_refused_naming_what_was_looked_for() -> None:
    with pytest.raises(make_images.ImagesError, match=r"no container tool found.*docker, podman"):
        make_images.find_tool(("docker", "podman"), which=lambda n: None)
    assert (
        make_images.find_tool(("docker", "podman"), which=lambda n: "/x" if n == "podman" else None)
        == "podman"
    )


def test_a_tool_whose_daemon_does_not_answer_is_a_problem() -> None:
    down = subprocess.CompletedProcess(
        ["docker", "info"], 1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n"
    )
    assert "Cannot connect to the Docker daemon" in (
        make_images.daemon_problem("docker", lambda c: down) or ""
    )
    up = subprocess.CompletedProcess(["docker", "info"], 0, "ok", "")
    assert make_images.daemon_problem("docker", lambda c: up) is None
