"""`make images` itself: where it cannot build it says why and exits non-zero; DRY_RUN=1 lists the
commands, with the contract's names under the PUSH prefix."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from trtforge.contract import images

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def make_images(
    *args: str, path: str | None = None, tools: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    if tools is not None:
        env["TRTFORGE_CONTAINER_TOOLS"] = tools
    return subprocess.run(
        ["make", "-s", "-C", str(REPO), "images", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_without_a_container_tool_it_says_so_and_fails() -> None:
    r = make_images(tools="no-such-docker no-such-podman")
    assert r.returncode != 0
    assert "no container tool found (looked for no-such-docker, no-such-podman on PATH)" in r.stderr


def test_a_tool_whose_daemon_does_not_answer_is_refused(tmp_path: Path) -> None:
    """A docker client with no daemon behind it (as on this development machine): `docker info` fails."""
    fake = tmp_path / "docker"
    fake.write_text(
        "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    r = make_images(path=f"{tmp_path}:{os.environ['PATH']}", tools="docker")
    assert r.returncode != 0
    assert "docker is installed but cannot build" in r.stderr
    assert "Cannot connect to the Docker daemon" in r.stderr


def test_dry_run_lists_every_image_under_the_push_prefix() -> None:
    r = make_images("PUSH=registry.example.com/team", "DRY_RUN=1", tools="docker")
    assert r.returncode == 0, r.stderr
    for spec in images.IMAGES:
        ref = spec.reference("registry.example.com/team")
        assert f"-t {ref}" in r.stdout and f"docker push {ref}" in r.stdout
