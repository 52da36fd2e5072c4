"""The observer reads, once per pass, everything the planner then looks up (observe/engine.py).

A real store on disk (the operator's StoreReader over a local path) and kopf-shaped indices (key ->
the objects under it); the observation goes through the pure planner, whose verdict shows whether
the store reads covered the keys it needed: a target whose engine the observer did not read would
build again instead of being Ready.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry
from trtforge_operator.kube import Kube
from trtforge_operator.metrics import Metrics
from trtforge_operator.observe.engine import observe_engine
from trtforge_operator.observe.views import EngineObserved, JobView, NodeView, PodView
from trtforge_operator.planning.engine import plan_engine_pass
from trtforge_operator.planning.engine_actions import CreateJob, RecordResult
from trtforge_operator.state import State
from trtforge_operator.store_reader import StoreReader

from tests.fakes import default_nodes, job
from tests.unit.test_planning_engine import CFG, H100, NOW, built, engine, key_of, manifest_for, rkey_of
from tests.unit.test_planning_engine import observe as literal_observation
from trtforge.contract.engine_key import RequestRecord
from trtforge.contract.layout import manifest_path, request_path
from trtforge.contract.possession import PossessionRecord, possession_path, source_fingerprint


def world(
    tmp_path: Path, jobs: Sequence[dict[str, Any]] = (), pods: dict[str, list[dict[str, Any]]] | None = None
) -> tuple[Any, State, StoreReader, dict[str, Any], dict[str, Any]]:
    e = engine([{"gpu": H100.gpu}])
    reader = StoreReader(str(tmp_path))
    m = e.spec.model
    fp = source_fingerprint(m.uri, None, m.sha256)
    proof = PossessionRecord(
        namespace="team-a", fingerprint=fp, sha256=m.sha256 or "", size_bytes=10, uri=m.uri, verified_at=NOW
    )
    reader.store.put_bytes(possession_path("team-a", fp), proof.to_json().encode())
    cfg = CFG.model_copy(update={"store_uri": str(tmp_path)})
    state = State(cfg=cfg, kube=Kube(client.ApiClient()), store=reader, metrics=Metrics(CollectorRegistry()))
    views = [JobView.from_k8s(j) for j in jobs]
    indices: dict[str, Any] = {
        "jobs_idx": {v.build_id: [v] for v in views},
        "bpods_idx": {name: [PodView.from_build_pod(p) for p in ps] for name, ps in (pods or {}).items()},
        "vjobs_idx": {},
        "vpods_idx": {},
        "ns_idx": {"team-a": [{}]},
        "nodes_idx": {n["metadata"]["name"]: [NodeView.from_k8s(n)] for n in default_nodes()},
        "infd_faults_idx": {},
    }
    body = e.model_dump(mode="json", by_alias=True, exclude_none=True)
    return e, state, reader, indices, body


def observe(state: State, body: dict[str, Any], indices: dict[str, Any]) -> EngineObserved:
    obs = asyncio.run(observe_engine(state, body, indices))
    assert isinstance(obs, EngineObserved)
    return obs


def test_an_engine_the_request_index_names_is_read_and_ready_without_a_job(tmp_path: Path) -> None:
    e, state, reader, indices, body = world(tmp_path)
    key, rk = key_of(e, H100), rkey_of(e, H100)
    record = RequestRecord(
        request_key=rk, engine_key=key, backend="onnxruntime", backend_version="1.22.0", cuda="none", recipe=2
    )
    reader.store.put_bytes(request_path(rk), record.to_json().encode())
    reader.store.put_bytes(manifest_path(key), manifest_for(key, H100).to_json().encode())
    obs = observe(state, body, indices)
    assert set(obs.requests) == {rk} and set(obs.manifests) == {key}
    plan = plan_engine_pass(obs, state.cfg)
    assert plan.of(CreateJob) == [] and plan.status.targets[0].phase == "Ready"


def test_nothing_stored_means_a_build(tmp_path: Path) -> None:
    _, state, _, indices, body = world(tmp_path)
    obs = observe(state, body, indices)
    assert obs.requests == {} and obs.manifests == {}
    assert len(plan_engine_pass(obs, state.cfg).of(CreateJob)) == 1


def test_a_finished_pods_result_is_read_from_the_pod_and_its_engine_from_the_store(tmp_path: Path) -> None:
    e = engine([{"gpu": H100.gpu}])
    (created,) = plan_engine_pass(literal_observation(e), CFG).jobs_to_create
    done = job(dict(created), state="complete", at=NOW - 30)
    key = key_of(e, H100)
    pod = {
        "metadata": {
            "name": "p",
            "namespace": CFG.build_namespace,
            "labels": {"job-name": created["metadata"]["name"]},
        },
        "status": {
            "containerStatuses": [
                {"name": "build", "state": {"terminated": {"exitCode": 0, "message": json.dumps(built(key))}}}
            ]
        },
    }
    _, state, reader, indices, body = world(tmp_path, [done], {created["metadata"]["name"]: [pod]})
    reader.store.put_bytes(manifest_path(key), manifest_for(key, H100).to_json().encode())
    obs = observe(state, body, indices)
    assert key in obs.manifests, "the engine the pod reported is read in the same pass"
    plan = plan_engine_pass(obs, state.cfg)
    (rec,) = plan.of(RecordResult)
    assert rec.job == created["metadata"]["name"] and plan.status.targets[0].phase == "Ready"
