"""Bad input to `trtforge build`: non-zero exit, one clear line naming the cause, nothing published."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from trtforge_dev.modelzoo import dynamic_cnn, light_model, sha256_of

from trtforge.contract.build_result import BUILD_EXIT_CODES, BuildFailure, parse_build_message
from trtforge.contract.gpu_probe import EmulatedGPUFile, GPUDevice

PROFILE = "images:1x3x16x16:2x3x16x16:4x3x16x16"


def build(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, BuildFailure, str]:
    term = tmp_path / "termination-log"
    full_env = {
        **os.environ,
        "TRTFORGE_ORT_THREADS": "1",
        "TRTFORGE_GPU_PROBE": "none",
        "TRTFORGE_TERMINATION_LOG": str(term),
        "TRTFORGE_LOG_FORMAT": "text",
        **(env or {}),
    }
    p = subprocess.run(
        [sys.executable, "-m", "trtforge.cli", "build", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )
    last = p.stdout.strip().splitlines()[-1]
    msg = parse_build_message(last)
    assert isinstance(msg, BuildFailure), p.stdout + p.stderr
    assert parse_build_message(term.read_text()) == msg  # the termination message is the same line
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == msg.exit_code == BUILD_EXIT_CODES[msg.reason] != 0
    return p.returncode, msg, p.stderr


def nothing_published(store: Path) -> bool:
    return not store.exists() or not [p for p in store.rglob("*") if p.is_file()]


def test_truncated_onnx(tmp_path: Path) -> None:
    src = light_model("squeezenet").read_bytes()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(src[: len(src) // 2])
    _, msg, _ = build(tmp_path, "--model", str(bad), "--gpu", "cpu", "--store", str(tmp_path / "s"))
    assert msg.reason == "InvalidModel" and str(bad) in msg.error and "truncated or corrupt" in msg.error
    assert nothing_published(tmp_path / "s")


def test_corrupt_onnx(tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf of an onnx model\xff\xff\xff" * 10)
    _, msg, _ = build(tmp_path, "--model", str(bad), "--gpu", "cpu", "--store", str(tmp_path / "s"))
    assert msg.reason == "InvalidModel" and "not a valid ONNX file" in msg.error
    assert nothing_published(tmp_path / "s")


def test_wrong_sha256_pin(tmp_path: Path) -> None:
    model = dynamic_cnn()
    wrong = "0" * 64
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(model),
        "--sha256",
        wrong,
        "--gpu",
        "cpu",
        "--profile",
        PROFILE,
        "--store",
        str(tmp_path / "s"),
    )
    assert msg.reason == "ModelIntegrity" and sha256_of(model) in msg.error and f"pins {wrong}" in msg.error
    assert nothing_published(tmp_path / "s")


def test_unknown_input_in_profile(tmp_path: Path) -> None:
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "cpu",
        "--profile",
        "pixels:1x3x16x16:2x3x16x16:4x3x16x16",
        "--store",
        str(tmp_path / "s"),
    )
    assert msg.reason == "InvalidProfile"
    assert "no input named 'pixels'" in msg.error and "'images'" in msg.error
    assert nothing_published(tmp_path / "s")


def test_min_greater_than_max(tmp_path: Path) -> None:
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "cpu",
        "--profile",
        "images:8x3x16x16:4x3x16x16:2x3x16x16",
        "--store",
        str(tmp_path / "s"),
    )
    assert msg.reason == "InvalidProfile" and "min <= opt <= max" in msg.error and "images" in msg.error


def test_dynamic_input_without_profile(tmp_path: Path) -> None:
    _, msg, _ = build(tmp_path, "--model", str(dynamic_cnn()), "--gpu", "cpu", "--store", str(tmp_path / "s"))
    assert msg.reason == "InvalidProfile" and "--profile images:MIN:OPT:MAX" in msg.error


def test_target_gpu_not_the_one_found(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus.json"
    dev = GPUDevice(
        index=0,
        uuid="GPU-h200",
        name="NVIDIA H200",
        memory_mib=143771,
        compute_capability="9.0",
        sm_count=132,
    )
    EmulatedGPUFile(node="n1", devices=[dev]).write(gpus)
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "NVIDIA-H100-80GB-HBM3",
        "--profile",
        PROFILE,
        "--store",
        str(tmp_path / "s"),
        env={"TRTFORGE_GPU_PROBE": f"emulated:{gpus}"},
    )
    assert msg.reason == "GPUMismatch" and msg.exit_code == 82
    assert "NVIDIA-H100-80GB-HBM3" in msg.error and "found is NVIDIA-H200" in msg.error
    assert nothing_published(tmp_path / "s")
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "NVIDIA-H200",
        "--mig",
        "1g.18gb",
        "--profile",
        PROFILE,
        "--store",
        str(tmp_path / "s"),
        env={"TRTFORGE_GPU_PROBE": f"emulated:{gpus}"},
    )
    assert msg.reason == "GPUMismatch" and "NVIDIA-H200/1g.18gb" in msg.error


def test_no_gpu_visible(tmp_path: Path) -> None:
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "NVIDIA-H200",
        "--profile",
        PROFILE,
        "--store",
        str(tmp_path / "s"),
    )
    assert msg.reason == "GPUMismatch" and "no GPU is visible" in msg.error


@pytest.mark.parametrize("kind", ["s3", "pvc"])
def test_unreachable_store(tmp_path: Path, kind: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "TRTFORGE_PVC_ROOT": str(tmp_path / "pvc"),
    }
    store = "s3://engines/prefix" if kind == "s3" else "pvc://missing-claim/engines"
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "cpu",
        "--profile",
        PROFILE,
        "--store",
        store,
        env=env,
    )
    assert msg.reason == "StoreUnavailable" and msg.exit_code == 80 and store.rstrip("/") in msg.error
    assert (f"127.0.0.1:{port}" in msg.error) if kind == "s3" else ("not mounted" in msg.error)


def test_bad_arguments(tmp_path: Path) -> None:
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "cpu",
        "--profile",
        "images:1x3:2y3:4x3",
        "--store",
        str(tmp_path / "s"),
    )
    assert msg.reason == "InvalidArgument" and "'2y3'" in msg.error
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "cpu",
        "--mig",
        "big",
        "--store",
        str(tmp_path / "s"),
    )
    assert msg.reason == "InvalidArgument" and msg.error.startswith("--mig")
    _, msg, _ = build(
        tmp_path, "--model", str(tmp_path / "absent.onnx"), "--gpu", "cpu", "--store", str(tmp_path / "s")
    )
    assert msg.reason == "ModelFetchFailed" and "no such file" in msg.error


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_int8_on_a_model_without_qdq_is_refused_with_how_to_quantize(tmp_path: Path, precision: str) -> None:
    """TensorRT would silently build fp32 (11) or fall back to fp32 (10): refused, on every backend."""
    code, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "cpu",
        "--precision",
        precision,
        "--profile",
        PROFILE,
        "--store",
        str(tmp_path / "s"),
    )
    assert code == 2 and msg.reason == "InvalidArgument" and msg.step == "check-model"
    assert f"precision {precision} needs a quantized model" in msg.error and "no Q/DQ nodes" in msg.error
    assert "modelopt.onnx.quantization" in msg.error and f"--quantize_mode {precision}" in msg.error
    assert nothing_published(tmp_path / "s")


def test_strip_weights_is_refused(tmp_path: Path) -> None:
    _, msg, _ = build(
        tmp_path,
        "--model",
        str(dynamic_cnn()),
        "--gpu",
        "cpu",
        "--strip-weights",
        "--store",
        str(tmp_path / "s"),
    )
    assert msg.reason == "InvalidArgument" and "--strip-weights is refused" in msg.error


def test_result_line_round_trips() -> None:
    line = json.dumps({"error": "x", "reason": "Timeout", "exitCode": 97})
    msg = parse_build_message("some log\n" + line)
    assert isinstance(msg, BuildFailure) and msg.reason == "Timeout" and msg.exit_code == 97
    assert parse_build_message("not json") is None


@pytest.mark.parametrize("quantity", ["4Gi", "1.5Gi", "2G", "1e9", "100m", "1073741825", "0.5Ki"])
def test_workspace_bytes_match_the_operators(quantity: str) -> None:
    """The builder and the operator turn `workspace` into the same bytes, so into the same engine key."""
    from trtforge_builder.request import parse_quantity
    from trtforge_operator.api import TRTEngineSpec

    spec = TRTEngineSpec.model_validate(
        {"model": {"uri": "pvc://m/x.onnx"}, "targets": [{"gpu": "cpu"}], "builder": {"workspace": quantity}}
    )
    assert parse_quantity(quantity) == spec.workspace_bytes()


def test_bad_workspace_names_the_flag(tmp_path: Path) -> None:
    args = ["--model", str(dynamic_cnn()), "--gpu", "cpu", "--workspace", "4GB", "--store", str(tmp_path)]
    _, msg, _ = build(tmp_path, *args)
    assert msg.reason == "InvalidArgument" and msg.error.startswith("--workspace") and "'4GB'" in msg.error
