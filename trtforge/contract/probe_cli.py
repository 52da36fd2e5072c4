"""`trtforge gpu probe`: print what the GPU probe sees (NVML on a real GPU, the test bed's emulated GPUs)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("gpu", help="inspect GPUs through the probe the builder and runtime use")
    gsub = p.add_subparsers(dest="gpu_command", required=True)
    probe = gsub.add_parser("probe", help="print the visible devices and their engine identity as JSON")
    probe.add_argument(
        "--probe", default=None, help="nvml | emulated:<file> | none (default: $TRTFORGE_GPU_PROBE)"
    )
    probe.set_defaults(func=_probe)


def _probe(args: argparse.Namespace) -> int:
    from trtforge.contract.gpu_probe import probe_from_env, probe_identity

    probe = probe_from_env(args.probe)
    try:
        out = {
            "probe": probe.kind,
            "arch": probe.arch(),
            "devices": [d.model_dump(exclude={"xid_events"}) for d in probe.devices()],
            "identity": probe_identity(probe).model_dump(),
        }
    finally:
        probe.close()
    print(json.dumps(out, indent=2))
    return 0
