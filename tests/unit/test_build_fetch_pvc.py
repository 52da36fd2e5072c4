"""pvc:// model sources stay inside their claim: plain path names, no symlink out of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from trtforge_builder.errors import BuildError
from trtforge_builder.fetch import fetch_model


@pytest.fixture
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "pvc"
    (root / "models" / "sub").mkdir(parents=True)
    (root / "models" / "sub" / "m.onnx").write_bytes(b"model")
    (root / "trtforge-store" / "engines").mkdir(parents=True)
    (root / "trtforge-store" / "engines" / "secret.plan").write_bytes(b"another tenant's engine")
    monkeypatch.setenv("TRTFORGE_PVC_ROOT", str(root))
    return root


def test_a_plain_path_inside_the_claim_is_read(claims: Path, tmp_path: Path) -> None:
    got = fetch_model("pvc://models/sub/m.onnx", tmp_path)
    assert got.size_bytes == 5


@pytest.mark.parametrize(
    "uri",
    ["pvc://models/../trtforge-store/engines/secret.plan", "pvc://models//etc/passwd", "pvc://models/./x"],
)
def test_dot_dot_and_empty_parts_are_refused_with_the_reason(claims: Path, tmp_path: Path, uri: str) -> None:
    with pytest.raises(BuildError) as e:
        fetch_model(uri, tmp_path)
    assert e.value.reason == "InvalidArgument" and "plain names" in str(e.value)


def test_a_symlink_out_of_the_claim_is_refused(claims: Path, tmp_path: Path) -> None:
    (claims / "models" / "link.onnx").symlink_to(claims / "trtforge-store" / "engines" / "secret.plan")
    with pytest.raises(BuildError) as e:
        fetch_model("pvc://models/link.onnx", tmp_path)
    assert e.value.reason == "InvalidArgument" and "outside the claim" in str(e.value)
