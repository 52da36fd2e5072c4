"""Operator configuration: file + environment, clear errors, backends per kind of target."""

from __future__ import annotations

from pathlib import Path

import pytest
from trtforge_operator.config import ConfigError, load_config


def test_defaults_file_and_env(tmp_path: Path) -> None:
    f = tmp_path / "op.yaml"
    f.write_text(
        "build_namespace: builds\nbuild:\n  max_concurrent: 2\nbackends:\n  gpu: local-onnxruntime\n"
    )
    cfg = load_config(
        f, env={"TRTFORGE_OPERATOR_STORE_URI": "s3://bucket/engines", "TRTFORGE_OPERATOR_NAMESPACES": "a, b"}
    )
    assert cfg.build_namespace == "builds" and cfg.build.max_concurrent == 2
    assert cfg.store_uri == "s3://bucket/engines" and cfg.namespaces == ["a", "b"]
    assert cfg.backend_for("NVIDIA-H100-80GB-HBM3") == "onnxruntime"
    assert cfg.engine_source() == "http://trtforge-broker.trtforge-system.svc:8081"


def test_production_backend_is_tensorrt_and_names_no_version() -> None:
    cfg = load_config(None, env={})
    assert cfg.backend_for("NVIDIA-B200") == "tensorrt"
    assert cfg.backend_for("cpu") == "onnxruntime"


def test_a_backend_version_in_the_config_is_refused_with_why(tmp_path: Path) -> None:
    """The operator never guesses TensorRT/CUDA versions: the builder reports what it has."""
    f = tmp_path / "op.yaml"
    f.write_text('backends:\n  gpu: {backend: tensorrt, version: "10.13.0", cuda: "12.9"}\n')
    with pytest.raises(ConfigError, match=r"backends\.gpu.*cuda, version.*builder reports"):
        load_config(f, env={})
    f.write_text("backends:\n  gpu: {backend: tensorrt}\n")
    assert load_config(f, env={}).backend_for("NVIDIA-H200") == "tensorrt"


@pytest.mark.parametrize(
    "text,field",
    [
        ("build:\n  max_concurrent: 0\n", "build.max_concurrent"),
        ("no_such_field: 1\n", "no_such_field"),
        ("build:\n  cpu: two\n", "build.cpu.*not a Kubernetes quantity"),
        ("build:\n  memory: '0'\n", "build.memory.*more than 0"),
        ("- a list\n", "mapping"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "op.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace(r"\.*", ".*")):
        load_config(f, env={})


def test_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml", env={})


def test_the_broker_listens_on_the_bind_address_unless_told_otherwise(tmp_path: Path) -> None:
    """`trtforge broker` and `trtforge operator` both: a pod IP in $TRTFORGE_OPERATOR_BIND_ADDRESS
    moves the broker off every address; an explicit broker.host wins."""
    from trtforge_operator.config import OperatorConfig

    assert OperatorConfig().with_broker_on_bind_address().broker.host == "0.0.0.0"
    pod = OperatorConfig(bind_address="127.3.0.7").with_broker_on_bind_address()
    assert pod.broker.host == "127.3.0.7"
    explicit = OperatorConfig.model_validate({"bind_address": "127.3.0.7", "broker": {"host": "127.0.0.1"}})
    assert explicit.with_broker_on_bind_address().broker.host == "127.0.0.1"


def test_metrics_listen_where_told_or_where_healthz_does() -> None:
    """`metrics_bind_address` 0.0.0.0 follows bind_address (a pod IP where pods share one network); one
    address, such as the chart's default 127.0.0.1, is used as is, from the file or the environment."""
    from trtforge_operator.config import OperatorConfig

    assert OperatorConfig().metrics_address() == "0.0.0.0"
    assert OperatorConfig(bind_address="127.3.0.7").metrics_address() == "127.3.0.7"
    local = OperatorConfig(bind_address="127.3.0.7", metrics_bind_address="127.0.0.1")
    assert local.metrics_address() == "127.0.0.1"
    env = {"TRTFORGE_OPERATOR_METRICS_BIND_ADDRESS": "127.3.0.9"}
    assert load_config(None, env=env).metrics_address() == "127.3.0.9"


def test_watched_namespaces_add_the_build_namespace_or_are_every_namespace() -> None:
    """What kopf watches, and where the chart binds the operator's namespaced rights."""
    from trtforge_operator.config import OperatorConfig

    assert OperatorConfig().watched_namespaces() == []
    cfg = OperatorConfig(namespaces=["team-b", "team-a"], build_namespace="trtforge-system")
    assert cfg.watched_namespaces() == ["team-a", "team-b", "trtforge-system"]
