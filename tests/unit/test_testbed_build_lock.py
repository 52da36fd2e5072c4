"""`trtforge cluster install` builds under a lock: two real processes, the build replaced by a cheap
step that waits for the test's go-ahead (trtforge_dev.testbed.build_lock)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from trtforge_dev.testbed.wait import wait_for

# One install: build under the lock unless the cache has the binaries. The build marks that it
# started, waits until the test writes `release`, then publishes `cache/bin` and counts itself.
INSTALL = """
import logging, sys, time
from pathlib import Path
from trtforge_dev.testbed.build_lock import build_once

tmp, me = Path(sys.argv[1]), sys.argv[2]
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
cache = tmp / "cache"

def missing():
    return [] if (cache / "bin").exists() else ["no binaries"]

def build():
    (tmp / f"started-{me}").touch()
    while not (tmp / "release").exists():
        time.sleep(0.02)
    cache.mkdir(exist_ok=True)
    (cache / "bin").write_text(me)
    with open(tmp / "builds", "a") as f:
        f.write(me + "\\n")

print("built" if build_once(tmp / "install.lock", missing, build, "the test build") else "reused")
"""


def start(tmp: Path, name: str) -> subprocess.Popen[str]:
    with open(tmp / f"{name}.err", "w") as err:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-c", INSTALL, str(tmp), name], stdout=subprocess.PIPE, stderr=err, text=True
        )


def finish(p: subprocess.Popen[str]) -> str:
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    return out.strip()


def test_a_second_install_waits_for_the_first_and_reuses_its_build(tmp_path: Path) -> None:
    first = start(tmp_path, "first")
    wait_for(lambda: (tmp_path / "started-first").exists(), timeout=60, desc="the first build started")
    second = start(tmp_path, "second")
    waiting = f"waiting for another process (pid {first.pid}) to finish the test build"
    wait_for(lambda: waiting in (tmp_path / "second.err").read_text(), timeout=60, desc="the second waits")
    assert not (tmp_path / "started-second").exists()
    (tmp_path / "release").touch()
    assert finish(first) == "built"
    assert finish(second) == "reused"
    assert (tmp_path / "builds").read_text() == "first\n"  # one build, by the first
    assert (tmp_path / "cache" / "bin").read_text() == "first"
    assert "reusing the cached result of the test build" in (tmp_path / "second.err").read_text()


def test_a_killed_build_leaves_no_lock_behind(tmp_path: Path) -> None:
    first = start(tmp_path, "first")
    wait_for(lambda: (tmp_path / "started-first").exists(), timeout=60, desc="the first build started")
    second = start(tmp_path, "second")
    wait_for(lambda: "waiting for" in (tmp_path / "second.err").read_text(), timeout=60, desc="waits")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    wait_for(lambda: (tmp_path / "started-second").exists(), timeout=60, desc="the second builds")
    (tmp_path / "release").touch()
    assert finish(second) == "built"
    assert (tmp_path / "builds").read_text() == "second\n"


def test_an_install_alone_builds_once_then_reuses(tmp_path: Path) -> None:
    (tmp_path / "release").touch()
    assert finish(start(tmp_path, "one")) == "built"
    assert finish(start(tmp_path, "two")) == "reused"
    assert (tmp_path / "builds").read_text() == "one\n"
    assert "waiting for" not in (tmp_path / "two.err").read_text()
