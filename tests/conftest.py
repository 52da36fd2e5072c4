"""Shared fixtures and the suite's tiers.

Fixtures: `testbed` (session): the local control plane with emulated GPU nodes, reused if already up;
`namespace` (per test): a fresh namespace, deleted afterwards. Wait with
`trtforge_dev.testbed.wait.wait_for`, never with fixed sleeps. `s3_endpoint` (per module): moto's
S3-compatible server on a loopback port, its URL.

Tiers (markers set here, from where a test lives and what it uses; docs/development.md, "Tests"):
`unit` (tests/unit), `testbed` (any test that uses the `testbed` fixture), `serve` (tests in a module
that starts `trtforge serve` processes through tests/integration/serve_process.py). `make test` runs
the `testbed` tier over pytest-xdist workers with a test bed each (`pytest_configure` below), and
everything else at the same time over workers of its own; both `--dist loadscope`, scheduled by
`pytest_xdist_make_scheduler` below."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trtforge_dev.testbed.handle import TestBed

TESTS = Path(__file__).resolve().parent
SERVE_PROCESS = "tests.integration.serve_process"


def _starts_serve_processes(module: object) -> bool:
    """Whether a test module uses the `trtforge serve` process helpers (imports anything from them)."""
    return any(getattr(v, "__module__", None) == SERVE_PROCESS for v in vars(module).values())


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker that uses the test bed starts one of its own: its state next to
    the default one (`.cluster-gw0`, ...), and a pod address block of its own, so that workers never
    share emulated GPUs, nodes or a control plane that a test stops or faults."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    from trtforge_dev.testbed.kubelet.podspec import POD_BLOCK_ENV, pod_block_for
    from trtforge_dev.testbed.paths import ROOT_ENV, default_root

    base = default_root()
    lane = int(worker.removeprefix("gw"))
    os.environ[ROOT_ENV] = str(base.with_name(f"{base.name}-{worker}"))
    # base's block + 1 + lane (wrapping within 1..254): the lanes differ from each other and from base
    os.environ[POD_BLOCK_ENV] = str((pod_block_for(str(base)) + lane) % 254 + 1)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            rel = Path(item.path).resolve().relative_to(TESTS)
        except ValueError:
            continue  # not under tests/
        if rel.parts[0] == "unit":
            item.add_marker(pytest.mark.unit)
        if "testbed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.testbed)
        module = getattr(item, "module", None)
        if module is not None and _starts_serve_processes(module):
            item.add_marker(pytest.mark.serve)
    items[:] = scheduled_order(items)


def scheduled_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The order `--dist loadscope` hands modules out in (`pytest_xdist_make_scheduler`): modules
    marked `long` first, then those marked `slow`, then the others, each group by how many tests a
    module has; each module's tests together and in their own order. The last module a worker starts
    is then a short one, so the workers finish close together."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(
        modules.values(),
        key=lambda tests: (
            tests[0].get_closest_marker("long") is None,
            tests[0].get_closest_marker("slow") is None,
            -len(tests),
        ),
    )
    return [item for tests in order for item in tests]


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown when xdist is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadscope`: a unit test is a unit of work of its own; outside tests/unit a
    module's tests go to one worker together, so its module-scoped fixtures start once."""
    if config.getvalue("dist") != "loadscope":
        return None
    config.option.loadscopereorder = False  # the collection's order is the schedule (scheduled_order)
    from xdist.scheduler import LoadScopeScheduling

    class UnitTestsAloneModulesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path.startswith("tests/unit/") else path

    return UnitTestsAloneModulesTogether(config, log)


@pytest.fixture(scope="session")
def testbed() -> Iterator[TestBed]:
    """The test bed at $TRTFORGE_CLUSTER_DIR or <project>/.cluster: used if up, else started here
    (and stopped by the last pytest session using it)."""
    from trtforge_dev.testbed import handle
    from trtforge_dev.testbed.binaries import BinariesError
    from trtforge_dev.testbed.controlplane import ClusterError
    from trtforge_dev.testbed.paths import StatePaths, default_root

    paths = StatePaths(default_root())
    try:
        tb = handle.acquire(paths)
    except (BinariesError, ClusterError) as e:
        pytest.fail(f"the test bed could not start: {e}", pytrace=False)
    try:
        yield tb
    finally:
        handle.release(paths)


@pytest.fixture
def namespace(testbed: TestBed, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace whose `default` ServiceAccount has its token; deleted (not awaited) after."""
    from kubernetes import client
    from trtforge_dev.testbed.wait import wait_for

    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{secrets.token_hex(3)}"
    with testbed.api_client() as api:
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

        def sa_ready() -> bool:
            sas = core.list_namespaced_service_account(name).items
            return any(sa.metadata.name == "default" and sa.secrets for sa in sas)

        wait_for(sa_ready, timeout=30, desc=f"ServiceAccount default with a token in {name}")
        try:
            yield name
        finally:
            core.delete_namespace(name)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3-compatible server on a free loopback port, for one test module; its URL."""
    from moto.server import ThreadedMotoServer
    from trtforge_dev.testbed.procs import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
