"""`python -m trtforge_dev.testbed.kubelet --root .cluster [--profile nodes.yaml]`, started by
`cluster up`."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from trtforge.logs import configure_logging


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trtforge_dev.testbed.kubelet")
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--profile", type=Path, default=None)
    args = ap.parse_args(argv)
    configure_logging("INFO", "text")

    from trtforge_dev.testbed.controlplane import ClusterState
    from trtforge_dev.testbed.kube import api_client
    from trtforge_dev.testbed.kubelet.agent import Kubelet
    from trtforge_dev.testbed.kubelet.context import KubeletContext
    from trtforge_dev.testbed.paths import StatePaths
    from trtforge_dev.testbed.profile import load_profile

    paths = StatePaths(args.root.resolve())
    st = ClusterState.load(paths)
    if st is None:
        print(
            f"no test bed state at {paths.state_file}; start it with `trtforge cluster up`", file=sys.stderr
        )
        return 2
    profile = load_profile(args.profile)
    paths.profile_file.write_text(profile.model_dump_json(indent=2))
    ctx = KubeletContext(
        paths=paths,
        profile=profile,
        api=api_client(paths.kubeconfig),
        apiserver_port=st.apiserver_port,
        kubelet_port=st.kubelet_port,
    )

    def stop(_sig: int, _frame: FrameType | None) -> None:
        ctx.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    Kubelet(ctx).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
