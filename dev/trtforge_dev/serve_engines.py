"""Engines for the `trtforge serve` tests, made by the real builder.

:func:`build_engine` runs `trtforge_builder`'s pipeline (``run_build``, what ``trtforge build`` runs)
on a :mod:`trtforge_dev.modelzoo` model for the emulated H100 of the serve tests' GPU file, so the
manifest's GPU identity is the one the serve process probes. The negative scenarios start from such
a build and then break one thing: :func:`copy_engine` (optionally re-keyed for another GPU, as a
build for that GPU would publish it), :func:`tamper_engine` (one artifact byte flipped) and
:func:`perturb_canary` (reference outputs that the engine cannot reproduce). No tests here; the test
modules import these helpers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from trtforge_builder.pipeline import run_build
from trtforge_builder.request import BuildRequest, make_build_config, parse_profiles

from trtforge.contract import layout
from trtforge.contract.canary import Canary
from trtforge.contract.engine_key import EngineKeyRecord, engine_key
from trtforge.contract.gpu import GPUTarget, known_identity
from trtforge.contract.gpu_probe import EmulatedGPUFile, EmulatedGPUProbe, GPUDevice, XidEvent
from trtforge.contract.manifest import CanaryRef, Manifest
from trtforge_dev.modelzoo import dynamic_mlp, light_model

H100_TARGET = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
H100_UUID = "GPU-11111111-2222-3333-4444-555555555555"


def build_engine(
    store: Path,
    model: Path,
    *,
    name: str,
    gpu_file: Path,
    samples: int,
    profiles: list[str] | None = None,
) -> str:
    """Build `model` (fp32, ONNX Runtime backend) into `store` for the GPU in `gpu_file`; the key.

    The model is linked as ``<store>/../models/<name>.onnx`` first: the manifest's model URI is that
    path, so the served model's default name is `name`. `profiles` are ``--profile`` entries.
    """
    link = store.parent / "models" / f"{name}.onnx"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(model.resolve())
    req = BuildRequest(
        model_uri=str(link),
        target=H100_TARGET,
        build=make_build_config(precision="fp32", profiles=parse_profiles(profiles or [])),
        store_uri=str(store),
        samples=samples,
    )
    probe = EmulatedGPUProbe(gpu_file, visible="all")
    try:
        res = run_build(req, probe=probe)
    finally:
        probe.close()
    assert res.gpu == H100_TARGET.gpu and res.accuracy is not None and res.accuracy.passed, res
    return res.key


def manifest_of(store: Path, key: str) -> Manifest:
    return Manifest.from_json((store / layout.manifest_path(key)).read_text())


def _write_manifest(store: Path, m: Manifest) -> None:
    path = store / layout.manifest_path(m.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(m.to_json())


def copy_engine(src: Path, key: str, dst: Path, *, gpu: GPUTarget | None = None) -> str:
    """Copy engine `key` from store `src` into store `dst`; its key there.

    With `gpu`, the copy is what a build of the same model and settings for that GPU (on the same CPU
    architecture) publishes: the manifest names that GPU and the key computed from it; the artifact
    and canary are still the H100 build's.
    """
    m = manifest_of(src, key)
    if gpu is not None:
        ident = known_identity(gpu, arch=m.gpu.arch)
        record = EngineKeyRecord.for_identity(
            model_sha256=m.model_sha256,
            build=m.build,
            backend=m.backend,
            backend_version=m.backend_version,
            cuda=m.cuda,
            identity=ident,
            recipe=m.recipe,
        )
        m = m.model_copy(update={"gpu": ident, "key": engine_key(record)})
    d = dst / layout.engine_dir(m.key)
    d.mkdir(parents=True, exist_ok=True)
    for f in (m.engine_file, m.canary.file):
        shutil.copyfile(src / layout.engine_path(key, f), d / f)
    _write_manifest(dst, m)  # last, as a build commits
    return m.key


def tamper_engine(store: Path, key: str) -> Path:
    """Flip one bit in the middle of the engine's artifact (the manifest keeps the built sha256)."""
    artifact = store / layout.engine_path(key, manifest_of(store, key).engine_file)
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0x01
    artifact.write_bytes(bytes(data))
    return artifact


def perturb_canary(store: Path, key: str, value: float) -> None:
    """Replace every reference output of the engine's canary by `value`, consistently published.

    The new canary gets its content-addressed name and the manifest its sha256, so only the
    comparison at start-up can fail.
    """
    m = manifest_of(store, key)
    d = store / layout.engine_dir(key)
    canary = Canary.from_bytes((d / m.canary.file).read_bytes())
    canary.outputs = [{k: np.full_like(v, value) for k, v in s.items()} for s in canary.outputs]
    data = canary.to_bytes()
    sha = hashlib.sha256(data).hexdigest()
    new_file = f"canary-{sha[:16]}.npz"
    (d / new_file).write_bytes(data)
    (d / m.canary.file).unlink()
    ref = CanaryRef(file=new_file, sha256=sha, atol=m.canary.atol, rtol=m.canary.rtol)
    _write_manifest(store, m.model_copy(update={"canary": ref}))


def run_ort(model: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ONNX Runtime, run directly on the source model."""
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs), strict=True))


def write_gpu_file(path: Path, devices: list[GPUDevice] | None = None) -> Path:
    """An emulated node with one H100 (the engines above are built for it)."""
    devs = devices or [
        GPUDevice(
            index=0,
            uuid=H100_UUID,
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81559,
            compute_capability="9.0",
            sm_count=132,
        )
    ]
    EmulatedGPUFile(node="node-a", devices=devs).write(path)
    return path


def inject_xid(path: Path, xid: int, uuid: str = H100_UUID) -> None:
    f = EmulatedGPUFile.read(path)
    for d in f.devices:
        if d.uuid == uuid:
            d.xid_events.append(XidEvent(xid=xid, gpu_uuid=uuid, message=f"injected Xid {xid}"))
            d.healthy = False
    f.write(path)


def termination(path: Path) -> dict[str, object]:
    return dict(json.loads(path.read_text().strip().splitlines()[-1])) if path.exists() else {}


def env_for(gpu_file: Path, term_log: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "TRTFORGE_GPU_PROBE": f"emulated:{gpu_file}",
            "NVIDIA_VISIBLE_DEVICES": "all",
            "TRTFORGE_TERMINATION_LOG": str(term_log),
            "TRTFORGE_LOG_FORMAT": "json",
        }
    )
    return env


RESNET_IN, RESNET_OUT = "gpu_0/data_0", "gpu_0/softmax_1"


@dataclass
class Bed:
    """A store with two real builds for the emulated H100 of `gpu_file` (what the servers probe):
    ResNet-50 (one canary sample) and a dynamic-batch MLP (x: 1..32 x 64 -> y: 10)."""

    tmp: Path
    store: Path
    gpu_file: Path
    resnet: Path  # the source models
    mlp: Path
    resnet_key: str
    mlp_key: str


def make_bed(tmp: Path, mlp_seed: int) -> Bed:
    """Build both engines into `tmp`/store (the MLP's weights from `mlp_seed`)."""
    store = tmp / "store"
    gpu_file = write_gpu_file(tmp / "gpus.json")  # the builds probe the GPU the servers get
    resnet = light_model("resnet50")
    mlp = dynamic_mlp(seed=mlp_seed, features=64, hidden=128, outputs=10)
    return Bed(
        tmp=tmp,
        store=store,
        gpu_file=gpu_file,
        resnet=resnet,
        mlp=mlp,
        resnet_key=build_engine(store, resnet, name="resnet50", gpu_file=gpu_file, samples=1),
        mlp_key=build_engine(
            store, mlp, name="mlp", gpu_file=gpu_file, samples=8, profiles=["x:1x64:16x64:32x64"]
        ),
    )


@dataclass
class MlpBed:
    """A store with one real build of a dynamic-batch MLP (x: 1..32 x 64 -> y: 10, four canary
    samples) for the emulated H100 of `gpu_file`."""

    tmp: Path
    store: Path
    gpu_file: Path
    mlp: Path  # the source model
    key: str


def make_mlp_bed(tmp: Path, mlp_seed: int, features: int = 64, outputs: int = 10) -> MlpBed:
    """Build the MLP (weights from `mlp_seed`; `features` inputs and `outputs` outputs per row) into
    `tmp`/store."""
    store = tmp / "store"
    gpu_file = write_gpu_file(tmp / "gpus.json")
    mlp = dynamic_mlp(seed=mlp_seed, features=features, hidden=128, outputs=outputs)
    profile = f"x:1x{features}:16x{features}:32x{features}"
    key = build_engine(store, mlp, name="mlp", gpu_file=gpu_file, samples=4, profiles=[profile])
    return MlpBed(tmp, store, gpu_file, mlp, key)
