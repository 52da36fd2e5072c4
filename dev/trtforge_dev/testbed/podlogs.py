"""Pod logs as the emulated kubelet writes them: ``pods/<ns>_<pod>_<uid>/logs/<container>.log``."""

from __future__ import annotations

from pathlib import Path

from trtforge_dev.testbed.paths import StatePaths


class PodLogError(LookupError):
    pass


def log_name(container: str, previous: bool = False) -> str:
    """A container's log file in its pod's `logs/`; the run before the last restart is `.previous`."""
    return f"{container}.previous.log" if previous else f"{container}.log"


def pod_log_dir(paths: StatePaths, namespace: str, pod: str) -> Path:
    """The log directory of the newest pod with that name (a name can be reused after deletion)."""
    dirs = [d for d in paths.pods.glob(f"{namespace}_{pod}_*") if (d / "logs").is_dir()]
    if not dirs:
        raise PodLogError(
            f"no logs for pod {namespace}/{pod} under {paths.pods}: has it started on an emulated node?"
        )
    return max(dirs, key=lambda d: d.stat().st_mtime) / "logs"


def read_pod_log(
    paths: StatePaths, namespace: str, pod: str, container: str | None = None, previous: bool = False
) -> str:
    d = pod_log_dir(paths, namespace, pod)
    logs = sorted(p for p in d.glob("*.log") if not p.name.endswith(".previous.log"))
    if container is None:
        if len(logs) != 1:
            names = ", ".join(p.stem for p in logs)
            raise PodLogError(f"pod {namespace}/{pod} has containers {names}: name one")
        container = logs[0].stem
    f = d / log_name(container, previous)
    if not f.is_file():
        raise PodLogError(
            f"no {'previous ' if previous else ''}log for container {container} of {namespace}/{pod}"
        )
    return f.read_text(errors="replace")
