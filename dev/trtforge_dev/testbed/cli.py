"""`trtforge cluster …`: install the binaries, bring the test bed up or down, inject GPU faults.

Top-level imports stay light (argparse only); each handler imports what it needs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def _root(args: argparse.Namespace) -> Any:
    from trtforge_dev.testbed.paths import StatePaths, default_root

    return StatePaths(Path(args.root).resolve() if args.root else default_root())


def _errors() -> tuple[type[BaseException], ...]:
    from trtforge_dev.testbed.binaries import BinariesError
    from trtforge_dev.testbed.controlplane import ClusterError
    from trtforge_dev.testbed.gpus import GPUError
    from trtforge_dev.testbed.procs import PortInUseError
    from trtforge_dev.testbed.profile import ProfileError
    from trtforge_dev.testbed.reflect2_patch import PatchError

    return (BinariesError, ClusterError, GPUError, PortInUseError, ProfileError, PatchError)


def _run(fn: Any, args: argparse.Namespace) -> int:
    """Run a handler; a user-facing error prints one clear line (no traceback) and exits 1."""
    import logging
    import sys

    try:
        return int(fn(args) or 0)
    except _errors() as e:
        logging.getLogger("trtforge_dev.testbed").debug("error", exc_info=True)
        print(f"trtforge cluster {args.cluster_command}: {e}", file=sys.stderr)
        return 1


def cmd_install(args: argparse.Namespace) -> int:
    from trtforge_dev.testbed import binaries as b
    from trtforge_dev.testbed.build import build_from_debian_source
    from trtforge_dev.testbed.build_lock import LOCK_NAME, build_once
    from trtforge_dev.testbed.paths import cache_dir

    if args.from_dir:
        b.seed_cache(Path(args.from_dir))
    elif b.external_control_plane() and not args.force:
        print("using the control-plane binaries from $KUBEBUILDER_ASSETS / PATH")
    else:
        cache = b.cache_bin_dir()

        def missing() -> list[str]:  # asked under the lock: another install may have built it
            problems = b.cache_problems(cache)
            if problems and cache.exists():
                print(f"binary cache {cache} is corrupt ({'; '.join(problems)}); rebuilding it")
            return [*problems, "a rebuild is asked for (--force)"] if args.force else problems

        build_once(cache_dir() / LOCK_NAME, missing, build_from_debian_source, "the control-plane build")
    found = b.resolve()
    for name, path in found.as_dict().items():
        print(f"{name:<24} {path}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from trtforge_dev.testbed.controlplane import AlreadyUpError, up

    paths = _root(args)
    try:
        st = up(paths, apiserver_port=args.port, profile=Path(args.profile) if args.profile else None)
    except AlreadyUpError as e:
        print(str(e))
        return 0
    print(
        f"test bed up: {st.server}\n  export KUBECONFIG={paths.kubeconfig}\n"
        f"  kubectl get nodes -L nvidia.com/gpu.product"
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from trtforge_dev.testbed.controlplane import down

    stopped = down(_root(args))
    print("stopped: " + ", ".join(stopped) if stopped else "nothing was running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from trtforge_dev.testbed.controlplane import status

    st = status(_root(args))
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        print(f"root:   {st['root']}\nstate:  {'up' if st['up'] else 'down'}")
        if "server" in st:
            print(
                f"server: {st['server']} (ready: {st.get('apiserver_ready')})\nkubeconfig: {st['kubeconfig']}"
            )
        for c, pid in st["components"].items():
            print(f"  {c:<24} {'pid ' + str(pid) if pid else 'not running'}")
    return 0 if st["up"] else 3


def cmd_logs(args: argparse.Namespace) -> int:
    import sys

    from trtforge_dev.testbed.podlogs import read_pod_log

    sys.stdout.write(
        read_pod_log(_root(args), args.namespace, args.pod, args.container, previous=args.previous)
    )
    return 0


def cmd_fault(args: argparse.Namespace) -> int:
    from trtforge_dev.testbed.faults import fault

    dev = fault(_root(args), args.node, gpu=args.gpu, xid=args.xid)
    print(f"{args.node}: Xid {args.xid} on {dev.uuid} ({dev.name}); healthy={dev.healthy}")
    return 0


def cmd_heal(args: argparse.Namespace) -> int:
    from trtforge_dev.testbed.faults import heal

    heal(_root(args), args.node)
    print(f"{args.node}: every GPU healthy, node up")
    return 0


def cmd_node_down(args: argparse.Namespace) -> int:
    from trtforge_dev.testbed.faults import node_down

    node_down(_root(args), args.node)
    print(f"{args.node}: down (no heartbeats, its pods stopped)")
    return 0


def cmd_node_up(args: argparse.Namespace) -> int:
    from trtforge_dev.testbed.faults import node_up

    node_up(_root(args), args.node)
    print(f"{args.node}: up")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "cluster", help="the local test bed: control plane + emulated GPU nodes", description=__doc__
    )
    p.add_argument(
        "--root", default=None, help="state directory (default: $TRTFORGE_CLUSTER_DIR or <project>/.cluster)"
    )
    sub = p.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    def add(name: str, fn: Any, help_: str) -> argparse.ArgumentParser:
        sp: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(func=lambda a, f=fn: _run(f, a))
        return sp

    sp = add("install", cmd_install, "provide etcd and the Kubernetes 1.20 binaries (build and cache them)")
    sp.add_argument("--force", action="store_true", help="rebuild even if the cache is intact")
    sp.add_argument(
        "--from",
        dest="from_dir",
        default=None,
        help="seed the cache from a directory of already-built binaries",
    )
    sp = add("up", cmd_up, "start the control plane and the emulated nodes")
    sp.add_argument("--port", type=int, default=None, help="kube-apiserver port (default: a free one)")
    sp.add_argument("--profile", default=None, help="node-profile YAML (default: the packaged set)")
    add("down", cmd_down, "stop every process the test bed started")
    sp = add("status", cmd_status, "what runs (exit 0 if up, 3 if down)")
    sp.add_argument("--json", action="store_true")
    sp = add("logs", cmd_logs, "a pod's log")
    sp.add_argument("pod")
    sp.add_argument("-n", "--namespace", default="default")
    sp.add_argument("-c", "--container", default=None)
    sp.add_argument("-p", "--previous", action="store_true", help="the previous run of the container")
    sp = add("fault", cmd_fault, "inject an Xid into an emulated GPU")
    sp.add_argument("node")
    sp.add_argument(
        "--gpu", type=int, default=None, help="device number on the node (default: first healthy)"
    )
    sp.add_argument("--xid", type=int, default=79)
    sp = add("heal", cmd_heal, "make every GPU of a node healthy again (and bring it back up)")
    sp.add_argument("node")
    sp = add("node-down", cmd_node_down, "stop a node's heartbeats and its pods")
    sp.add_argument("node")
    sp = add("node-up", cmd_node_up, "resume a downed node")
    sp.add_argument("node")
