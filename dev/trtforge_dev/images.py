"""`make images`: build every trtforge image with the names in trtforge.contract.images, and push
them with `make images PUSH=<registry/prefix>` (the chart's `global.imageRegistry`).

The runtimes get the TensorRT version the builder image really has (an engine is tied to it): read
from the built builder image, or given as TENSORRT_VERSION. Without a container tool that works
(docker, podman or nerdctl with their daemon up, or buildah), it says which and exits 2.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trtforge.contract import images

TOOLS = ("docker", "podman", "nerdctl", "buildah")
TOOLS_ENV = "TRTFORGE_CONTAINER_TOOLS"  # which tools to look for, in order (space-separated)
TRT_PLACEHOLDER = "<the builder image's TensorRT version>"
# Where the builder image keeps its TensorRT version (builder_job/Dockerfile writes it).
TRT_VERSION_FILE = "/opt/trtforge/tensorrt-version"


class ImagesError(RuntimeError):
    """Why no image can be built here; the message says what to do."""


@dataclass(frozen=True)
class Step:
    """One command of the plan; `reads_trt_version` marks the one whose output is the version."""

    argv: tuple[str, ...]
    reads_trt_version: bool = False

    def __str__(self) -> str:
        return shlex.join(self.argv)


def find_tool(names: Sequence[str], which: Callable[[str], str | None] = shutil.which) -> str:
    """The first of `names` on PATH, or ImagesError naming what was looked for."""
    for n in names:
        if which(n):
            return n
    raise ImagesError(
        f"make images: no container tool found (looked for {', '.join(names)} on PATH); install one "
        "of them (or run this on a machine that has one) to build the trtforge images"
    )


def daemon_problem(tool: str, run: Callable[[list[str]], subprocess.CompletedProcess[str]]) -> str | None:
    """Why `tool` cannot build right now (its daemon does not answer), or None."""
    probe = [tool, "version"] if tool == "buildah" else [tool, "info"]
    try:
        done = run(probe)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`{shlex.join(probe)}` failed: {e}"
    if done.returncode == 0:
        return None
    lines = [ln.strip() for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
    why = lines[-1].rstrip(".") if lines else f"exit status {done.returncode}"
    return f"`{shlex.join(probe)}` failed: {why}"


def plan(tool: str, push: str | None, tensorrt_version: str | None) -> list[Step]:
    """Every command, in order: the builder, its TensorRT version, the operator, both runtimes, pushes."""
    registry = push.rstrip("/") if push else images.DEFAULT_REGISTRY
    build = ["bud"] if tool == "buildah" else ["build"]
    trt = tensorrt_version or TRT_PLACEHOLDER
    steps: list[Step] = []
    for spec in images.IMAGES:
        args = dict(spec.build_args)
        if spec.dockerfile == images.RUNTIME.dockerfile:
            args["TENSORRT_VERSION"] = trt
        argv = [tool, *build, "-f", spec.dockerfile, "-t", spec.reference(registry)]
        for k, v in args.items():
            argv += ["--build-arg", f"{k}={v}"]
        steps.append(Step((*argv, ".")))
        if spec is images.BUILDER and tensorrt_version is None:
            ref = spec.reference(registry)
            read: tuple[str, ...]
            if tool == "buildah":
                read = (tool, "run", "--", ref, "cat", TRT_VERSION_FILE)
            else:
                read = (tool, "run", "--rm", "--entrypoint", "cat", ref, TRT_VERSION_FILE)
            steps.append(Step(read, reads_trt_version=True))
    if push:
        for ref in dict.fromkeys(s.reference(registry) for s in images.IMAGES):
            steps.append(Step((tool, "push", ref)))
    return steps


def run_plan(steps: list[Step]) -> None:
    trt: str | None = None
    for step in steps:
        argv = [a.replace(TRT_PLACEHOLDER, trt) if trt else a for a in step.argv]
        print(">>", shlex.join(argv), flush=True)
        if step.reads_trt_version:
            trt = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()
            if not trt:
                raise ImagesError(f"make images: {TRT_VERSION_FILE} of the builder image is empty")
            print(f">> the builder image has TensorRT {trt}", flush=True)
        else:
            subprocess.run(argv, check=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make images", description=__doc__)
    ap.add_argument(
        "--push", metavar="REGISTRY/PREFIX", help="tag the images under this prefix and push them"
    )
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args(argv)
    trt = os.environ.get("TENSORRT_VERSION") or None
    names = os.environ.get(TOOLS_ENV, "").split() or list(TOOLS)
    try:
        tool = names[0] if a.dry_run else find_tool(names)
        steps = plan(tool, a.push, trt)
        if a.dry_run:
            print("\n".join(str(s) for s in steps))
            return 0
        problem = daemon_problem(
            tool, lambda c: subprocess.run(c, capture_output=True, text=True, timeout=30, check=False)
        )
        if problem:
            raise ImagesError(
                f"make images: {tool} is installed but cannot build: {problem}; start its daemon "
                f"(e.g. `sudo systemctl start {tool}`) or use a daemonless tool ({TOOLS_ENV}=buildah)"
            )
        run_plan(steps)
    except ImagesError as e:
        print(e, file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"make images: `{shlex.join(e.cmd)}` exited {e.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
