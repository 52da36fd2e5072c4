"""An LLM runtime supervisor reads its checkpoint and tuning cache through the engine broker (issue 66),
as engine pods read engines: a real `trtforge broker` process checks the pod's real TokenReview on the
test bed's apiserver, finds the namespace's InferenceDeployment and the TRTEngine status that names
both keys, and the possession record of the engine's `spec.llm.source`; `trtforge serve-llm` streams
every file into its cache, verifies it against the manifest and serves with a real llama.cpp. A token
of a namespace that references nothing is refused, and a tampered file in the store is refused by
name. No operator runs: the test writes the objects and the store records the operator and the
quantize and verify steps would."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from trtforge_dev import localdev
from trtforge_dev.testbed.wait import wait_for
from trtforge_runtime.llm.artefacts import server_version

from tests.integration.llm_bed import Supervised, golden_tokens, llama_server, smollm2_gguf
from tests.integration.test_llm_serve_store import CKPT, TUNING, publish_checkpoint, publish_tuning, record
from trtforge.contract.llm import ArtefactKind, file_path
from trtforge.contract.possession import PossessionRecord, possession_path, source_fingerprint
from trtforge.store import open_store
from trtforge.store.artefacts import read_manifest
from trtforge.store.http import BrokerDenied, BrokerStore

pytestmark = pytest.mark.integration

SOURCE_URI = "pvc://models/smollm2.gguf"
SOURCE_SHA = "d" * 64  # the digest publish_checkpoint records as the checkpoint's source
AUDIENCE = "trtforge-broker"


class Bed:
    """The store, the namespace's objects and a `trtforge broker` process on loopback."""

    def __init__(self, tb: Any, ns: str, tmp: Path) -> None:
        self.tb, self.ns, self.tmp = tb, ns, tmp
        self.root = tmp / "store"
        self.server, gguf = llama_server(), smollm2_gguf()
        self.gguf = gguf
        (tmp / "golden").mkdir()
        self.golden = golden_tokens(self.server, gguf, tmp / "golden")
        self.manifest = publish_checkpoint(self.root, gguf, self.golden)
        publish_tuning(self.root, record(server_version(str(self.server))))
        fp = source_fingerprint(SOURCE_URI, None, SOURCE_SHA)
        proof = PossessionRecord(
            namespace=ns, fingerprint=fp, sha256=SOURCE_SHA, size_bytes=1, uri=SOURCE_URI
        )
        open_store(str(self.root)).put_bytes(possession_path(ns, fp), proof.to_json().encode())
        self.cfg = localdev.write_config(
            tmp / "broker.yaml", build_ns="trtforge-system", namespaces=[ns], store_dir=self.root
        )
        self.url = str(self.cfg["broker"]["url"])
        self.broker = localdev.OperatorProcess(
            tmp / "broker.yaml",
            tb.kubeconfig,
            tmp / "broker.log",
            command=("broker", "--port", str(self.cfg["broker"]["port"])),
        )

    def token_file(self, ns: str, name: str) -> Path:
        with self.tb.api_client() as api:
            core: Any = client.CoreV1Api(api)
            tok = core.create_namespaced_service_account_token(
                "default", ns, {"spec": {"audiences": [AUDIENCE], "expirationSeconds": 600}}
            )
        path = self.tmp / name
        path.write_text(tok.status.token)
        return path

    def serve(self, token: Path, cache: str) -> Supervised:
        return Supervised(
            self.tmp,
            [
                "--checkpoint", CKPT, "--tuning", TUNING, "--store", self.url,
                "--cache-dir", str(self.tmp / cache), "--model-name", "smollm2",
                "--server-binary", str(self.server),
            ],
            env={"TRTFORGE_BROKER_TOKEN_FILE": str(token)},
        )  # fmt: skip

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False


def _objects(tb: Any, ns: str) -> None:
    """A TRTEngine of the LLM whose status names the checkpoint and the cpu target's tuning cache, and
    an InferenceDeployment that references it (what the operator and its Jobs would leave)."""
    localdev.install_crds(tb)
    engine = {
        "apiVersion": "trtforge.io/v1alpha1",
        "kind": "TRTEngine",
        "metadata": {"name": "smollm2"},
        "spec": {
            "llm": {"source": {"uri": SOURCE_URI, "sha256": SOURCE_SHA, "format": "gguf"}, "recipe": "bf16"},
            "targets": [{"gpu": "cpu"}],
        },
    }
    status = {
        "checkpoint": {"phase": "Ready", "checkpointKey": CKPT, "recipe": "bf16"},
        "targets": [{"name": "cpu", "gpu": "cpu", "phase": "Ready", "engineKey": CKPT, "tuningKey": TUNING}],
    }
    with tb.api_client() as api:
        co: Any = client.CustomObjectsApi(api)
        co.create_namespaced_custom_object("trtforge.io", "v1alpha1", ns, "trtengines", engine)
        co.patch_namespaced_custom_object_status(
            "trtforge.io", "v1alpha1", ns, "trtengines", "smollm2", {"status": status}
        )
        infd = localdev.deployment_manifest("chat", "smollm2")
        co.create_namespaced_custom_object("trtforge.io", "v1alpha1", ns, "inferencedeployments", infd)


@pytest.fixture
def bed(testbed: Any, namespace: str, tmp_path: Path) -> Iterator[Bed]:
    _objects(testbed, namespace)
    b = Bed(testbed, namespace, tmp_path)
    b.broker.start()
    try:
        wait_for(b.up, timeout=60, desc=f"the broker on {b.url}")
        yield b
    finally:
        b.broker.stop()


def test_serve_llm_fetches_verifies_and_serves_through_the_broker_and_refuses_the_rest(bed: Bed) -> None:
    token = bed.token_file(bed.ns, "token")
    s = bed.serve(token, "cache")
    try:
        ready = s.wait_probe("/v2/health/ready", 200)
        assert "equal the golden tokens" in ready["canary"]
        argv = Path(f"/proc/{s.server_pid()}/cmdline").read_bytes().split(b"\0")
        served = Path(argv[argv.index(b"-m") + 1].decode())  # a verified copy, not the store's file
        assert bed.tmp / "cache" in served.parents and served.read_bytes() == bed.gguf.read_bytes()
        assert argv[argv.index(b"--threads") + 1] == b"1"  # the tuning record came through too
    finally:
        s.stop()
    assert "broker served checkpoints/" in bed.broker.tail(200)

    # A namespace with no InferenceDeployment referencing the engine is refused with 403.
    other = bed.token_file("default", "other-token")
    with pytest.raises(BrokerDenied, match="403"):
        read_manifest(
            BrokerStore(bed.url, token_file=str(other), retry_rounds=1), ArtefactKind.CHECKPOINT, CKPT
        )

    # A file changed in the store after publishing is refused by name; nothing is served from it.
    stored = bed.root / file_path(ArtefactKind.CHECKPOINT, CKPT, bed.manifest.upload, bed.gguf.name)
    data = bytearray(stored.read_bytes())
    stored.unlink()
    data[4096] ^= 0xFF
    stored.write_bytes(bytes(data))
    t = bed.serve(token, "cache-2")
    try:
        assert t.wait_exit() == 81
        msg = t.termination()
        assert msg["reason"] == "EngineIntegrity" and bed.gguf.name in msg["message"], msg
        assert not (bed.tmp / "cache-2" / "checkpoint" / CKPT).exists()
    finally:
        t.stop()
