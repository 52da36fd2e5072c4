"""InferenceDeployment planning: observed state in, desired Deployments/Service/pod moves/rebuilds out.

One Deployment per served target whose engine is Ready (pinned to that GPU type, requesting its GPU
or MIG resource), one Service over all of them. The pod template carries the engine key and the
manifest sha256, so a new engine (or a rebuilt artifact under the same key) rolls out; with
maxUnavailable 0 the old pods keep serving until new ones pass their canary. While a target's
engine is being (re)built, its existing Deployment is left as it is.

``spec.replicas`` is split over the served targets by their shares. A target with autoscaling gets an
autoscaler of its own, a HorizontalPodAutoscaler or (``provider: KEDA``) a KEDA ScaledObject, owned by
the InferenceDeployment (so deleted with it); switching provider deletes the other one. The
Deployment's replicas belong to that autoscaler: the operator writes them only when it creates the
Deployment, and a replace (a new engine, a changed template) keeps the Deployment's own count
(planning/autoscaling.py). An autoscaler that cannot be made (KEDA not installed, no HPA API) is
made in no other form: the Autoscaling condition says what is missing. No I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtforge.contract.gpu import GPUTarget, MigStrategy
from trtforge_operator.api import (
    CUSTOM_METRIC_NAMES,
    Autoscaling,
    Condition,
    DeploymentTargetStatus,
    FaultRecord,
    GroupBackend,
    InferenceDeployment,
    InferenceDeploymentStatus,
    LLMServer,
    LLMServing,
    TargetStatus,
    ready_text,
    set_condition,
)
from trtforge_operator.apply import children, front_proxy, llm_children, lws
from trtforge_operator.apply.llm_children import LLMRuntime
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import (
    ANNOTATION_ENGINE_KEY,
    ANNOTATION_ENGINE_SHA256,
    ANNOTATION_SPEC_HASH,
    LABEL_TARGET,
)
from trtforge_operator.observe.keys import key_inputs
from trtforge_operator.observe.views import (
    DeploymentChildren,
    DeploymentObserved,
    DeploymentView,
    JobView,
    PodView,
    UnreadableDeployment,
    utc,
)
from trtforge_operator.planning import deployment_groups, fault_trust, faults, groups, host_cache, rebuild
from trtforge_operator.planning.autoscaling import (
    AutoscalerKind,
    AutoscalingProblem,
    autoscaler_choice,
    keda_query,
    keda_threshold,
    problem_message,
    replicas_decision,
)
from trtforge_operator.planning.deployment_actions import (
    Action,
    ApplyAutoscaler,
    ApplyConfigMap,
    ApplyDeployment,
    ApplyLeaderWorkerSet,
    ApplyNetworkPolicy,
    ApplyRankExecAccess,
    ApplyService,
    ChildKind,
    CreatePod,
    DeleteChild,
    Emit,
    LabelPod,
    PatchEngineAnnotations,
    WriteStatus,
    cleanup_actions,
    owned_autoscalers,
)
from trtforge_operator.planning.deployment_policies import (
    FaultRecovery,
    Health,
    Serving,
    TargetRollout,
    degradation,
    readiness,
    recovery_wait,
    target_message,
)
from trtforge_operator.planning.events import Event
from trtforge_operator.planning.group_plan import GroupsPlan, GroupTarget, plan_groups
from trtforge_operator.planning.groups import LABEL_GROUP
from trtforge_operator.planning.llm_serving import (
    LLMEngineFacts,
    LLMProblem,
    llm_engine_facts,
    llm_problem_message,
    llm_runtime,
)
from trtforge_operator.planning.pruned import pruned_condition, pruned_fields, spec_schema
from trtforge_operator.planning.rebuild import RebuildRequest, legacy_cleanup_patch
from trtforge_operator.planning.text import one_line, timestamp


@dataclass(frozen=True, order=True)
class AutoscalerRef:
    """One autoscaler the operator owns: its kind and name (an HPA and a ScaledObject may share one)."""

    kind: AutoscalerKind
    name: str


@dataclass(frozen=True)
class DeploymentPlan:
    """One pass's decisions: the new status, the actions that carry them out (in order, by the one
    applier, apply/deployment.py), and the rebuilds asked of the TRTEngine."""

    status: InferenceDeploymentStatus
    actions: tuple[Action, ...] = ()
    # Rebuilds this deployment asks its TRTEngine for (the engine creates the Jobs; docs/design.md
    # §"Scale" and planning/rebuild.py). Level-based: the full set still wanted, not a delta. The
    # TRTEngine reads them from the status written here: no action of this plan.
    rebuild_requests: list[RebuildRequest] = field(default_factory=list)
    recheck_in: float | None = None  # seconds until the next pass is due (a group's held teardown)

    # Views of the actions, by what they do.
    @property
    def apply(self) -> list[Mapping[str, Any]]:
        """Deployments and the Service to create, or replace on hash."""
        return [a.manifest for a in self.actions if isinstance(a, ApplyDeployment | ApplyService)]

    @property
    def hpa_owned(self) -> set[str]:
        """Deployments applied whose replicas an autoscaler sets (a replace keeps their count)."""
        return {a.name for a in self.actions if isinstance(a, ApplyDeployment) and a.keep_replicas}

    @property
    def apply_autoscalers(self) -> list[Mapping[str, Any]]:
        return [a.manifest for a in self.actions if isinstance(a, ApplyAutoscaler)]

    def _deleted(self, *kinds: ChildKind) -> list[DeleteChild]:
        return [a for a in self.actions if isinstance(a, DeleteChild) and a.kind in kinds]

    @property
    def delete_autoscalers(self) -> list[AutoscalerRef]:
        return [
            AutoscalerRef(AutoscalerKind(a.kind.value), a.name)
            for a in self._deleted(ChildKind.HPA, ChildKind.SCALED_OBJECT)
        ]

    @property
    def delete_deployments(self) -> list[str]:
        return [a.name for a in self._deleted(ChildKind.DEPLOYMENT)]

    @property
    def delete_pods(self) -> list[str]:
        return [a.name for a in self._deleted(ChildKind.POD)]

    @property
    def events(self) -> list[Event]:
        return [a.event for a in self.actions if isinstance(a, Emit)]


@dataclass
class _Draft:
    """What a pass decides, gathered while planning; :meth:`plan` orders it into actions."""

    deployments: list[ApplyDeployment] = field(default_factory=list)
    config_maps: list[ApplyConfigMap] = field(default_factory=list)  # before the Deployments that mount them
    service: ApplyService | None = None
    delete_deployments: list[str] = field(default_factory=list)
    delete_config_maps: list[str] = field(default_factory=list)  # the front proxy's, with their Deployments
    apply_autoscalers: list[dict[str, Any]] = field(default_factory=list)
    delete_autoscalers: list[AutoscalerRef] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    rebuild_requests: list[RebuildRequest] = field(default_factory=list)
    groups: list[GroupsPlan] = field(default_factory=list)  # the native backend's, per grouped target
    leader_worker_sets: list[dict[str, Any]] = field(default_factory=list)  # the lws backend's

    def plan(
        self,
        status: InferenceDeploymentStatus,
        old_status: Mapping[str, Any],
        events: Sequence[Event],
        engine_patch: PatchEngineAnnotations | None,
    ) -> DeploymentPlan:
        """In the order they are carried out: the status first (faults recorded before they are acted
        on), the autoscalers that go before the ones that come (KEDA refuses a Deployment an HPA
        already scales), Deployments and the Service before their autoscalers, then deletions,
        the TRTEngine's old annotations, and Events last."""
        actions: list[Action] = [WriteStatus(status.to_wire(), old_status)]
        actions += [DeleteChild(ChildKind(r.kind.value), r.name) for r in self.delete_autoscalers]
        actions += self.config_maps
        actions += self.deployments
        if self.service is not None:
            actions.append(self.service)
        actions += [ApplyLeaderWorkerSet(m) for m in self.leader_worker_sets]
        for g in self.groups:  # the leader out of the Service before any rank pod goes
            actions += [ApplyService(m) for m in g.services]
            actions += [ApplyNetworkPolicy(m) for m in g.policies]
            actions += [ApplyRankExecAccess(m) for m in g.access]  # before the leader runs as it
            actions += [LabelPod(name, labels) for name, labels in g.label_pods]
            actions += [CreatePod(m) for m in g.create_pods]
        actions += [ApplyAutoscaler(a) for a in self.apply_autoscalers]
        actions += [DeleteChild(ChildKind.DEPLOYMENT, d) for d in self.delete_deployments]
        actions += [DeleteChild(ChildKind.CONFIG_MAP, c) for c in self.delete_config_maps]
        actions += [DeleteChild(ChildKind.POD, p) for p in self.delete_pods]
        for g in self.groups:
            actions += [DeleteChild(ChildKind.POD, p) for p in g.delete_pods]
            actions += [DeleteChild(ChildKind.SERVICE, n) for n in g.delete_services]
            actions += [DeleteChild(ChildKind.NETWORK_POLICY, n) for n in g.delete_policies]
            actions += [DeleteChild(ChildKind.RANK_EXEC_ACCESS, n) for n in g.delete_access]
        if engine_patch is not None:
            actions.append(engine_patch)
        actions += [Emit(e) for e in events]
        due = [g.recheck_in for g in self.groups if g.recheck_in is not None]
        return DeploymentPlan(status, tuple(actions), list(self.rebuild_requests), min(due, default=None))


def _gpu_faulted(pod: PodView) -> bool:
    """The pod's own container reported a GPU fault (its device is bad for the rest of its life)."""
    return any(
        t.exit_code == faults.EXIT_GPU_FAULT or t.trtforge_reason() == faults.GPU_FAULT
        for t in pod.terminations()
    )


def plan_deployment_pass(
    obs: DeploymentObserved | UnreadableDeployment, cfg: OperatorConfig
) -> DeploymentPlan:
    """The whole pass: a spec the models refuse stalls the InferenceDeployment and says why (its
    targets kept); anything else is planned by :func:`plan_deployment`."""
    if isinstance(obs, UnreadableDeployment):
        message = f"invalid spec: {obs.error}"
        status = invalid_deployment_status(obs.status, obs.generation, message, obs.now)
        return DeploymentPlan(status, (WriteStatus(status.to_wire(), obs.status_wire),))
    return plan_deployment(obs, cfg)


def plan_deployment_release(children_: DeploymentChildren) -> list[DeleteChild]:
    """On deletion: the autoscalers, runtime Deployments and the Service go (ownerRefs would too,
    eventually): :func:`cleanup_actions`."""
    return cleanup_actions(
        children_.deployments, children_.autoscalers, children.service_name(children_.name)
    )


def plan_deployment(obs: DeploymentObserved, cfg: OperatorConfig) -> DeploymentPlan:
    """Desired children and status of one InferenceDeployment."""
    spec, now = obs.spec, obs.now
    ttl = cfg.faults.suspect_node_ttl_seconds
    policy = spec.fault_policy
    engine_targets: dict[str, TargetStatus] = {}
    if obs.engine is not None:
        engine_targets = {t.name: t for t in obs.engine.status.targets}
    all_targets = [t.target() for t in engine_targets.values()]
    wanted = spec.replicas_by_target(all_targets)
    # A group's rank pods are the group backend's (planning/group_plan.py); the rest are Deployments'.
    rank_pods = [p for p in obs.pods if LABEL_GROUP in p.labels]
    our_pods = [p for p in obs.pods if LABEL_GROUP not in p.labels]
    dep_names = {t.name: children.deployment_name(obs.name, t) for t in wanted}
    jobs_by_name = {j.name: j for j in obs.jobs}
    events: list[Event] = []
    plan = _Draft()

    # --- faults: only the operator's own pods' reports, about their own GPUs (planning/fault_trust.py)
    names = {children.deployment_name(obs.name, t.target()) for t in engine_targets.values()}
    dep_uids = fault_trust.operator_deployment_uids(obs.deployments, obs.uid, names | set(dep_names.values()))
    believed, ignored = fault_trust.split_pods(our_pods, dep_uids, obs.replica_sets)
    events += [Event("Warning", "FaultIgnored", i.message) for i in ignored]
    # --- faults: detect, record once, decide the action
    records = faults.enrich_from_pods(list(obs.status.faults), believed)
    new = faults.detect_pod_faults(believed, records, now)
    new += faults.detect_node_faults(believed, obs.nodes, [*records, *(d.record for d in new)], now, ttl)

    def record_fault(d: faults.DetectedFault) -> None:
        """Record a new fault once, with its action (the rebuild under the hourly limit), and say so."""
        rec = d.record
        t = engine_targets.get(rec.target or "")
        action = faults.fault_action(
            node_suspect=d.node_suspect,
            rebuild_enabled=policy.rebuild_on_gpu_fault,
            has_engine=t is not None and t.engine_key is not None and obs.engine is not None,
            rate_limited=faults.rebuilds_in_last_hour(records, rec.target or "", now)
            >= policy.max_rebuilds_per_hour,
        )
        rec = rec.model_copy(update={"action": action.value})
        records.append(rec)
        what = f"Xid {rec.xid}" if rec.xid is not None else (rec.reason or "fault")
        events.append(
            Event(
                "Warning",
                "GPUFault",
                f"pod {rec.pod} on node {rec.node} ({rec.target}): {what}; action {action}",
            )
        )

    for d in new:
        record_fault(d)
    avoid = faults.avoid_nodes(records, obs.nodes, now, ttl)
    node_by_name = {n.name: n for n in obs.nodes}

    def avoid_for(target: GPUTarget) -> set[str]:
        """Only nodes that could host this target: other targets' templates must not change (and roll)."""
        return {n for n in avoid if n in node_by_name and node_by_name[n].hosts(target)}

    # --- pods on a faulty GPU go now (their replacements keep off the node through the template's
    # affinity). Ready pods on a suspect node are left to the rollout that the template change starts:
    # with maxUnavailable 0 they serve until their replacements are Ready, and deleting them would
    # only make the old ReplicaSet recreate them (a fight with the Deployment controller).
    faulted = {d.record.pod for d in new} | {r.pod for r in records if r.recovered_seconds is None}
    plan.delete_pods = sorted(
        p.name
        for p in our_pods
        if p.node in avoid and not p.deleting and (not p.ready or (p.name in faulted and _gpu_faulted(p)))
    )

    # --- rebuilds for unrecovered faults that asked for one: the TRTEngine derives the same from this
    # status (the operator's record of the faults) and creates the Jobs (planning/rebuild.py)
    plan.rebuild_requests = rebuild.fault_rebuilds(
        f"{obs.namespace}/{obs.name}", records, list(engine_targets.values()), obs.nodes, now, ttl
    )
    pending_rebuild = {r.target: r.job_name for r in plan.rebuild_requests}  # target -> rebuild Job

    # --- Deployments and the Service
    existing = {d.name: d for d in obs.deployments}
    autoscalers = {
        AutoscalerRef(AutoscalerKind(a.kind), a.name): a for a in owned_autoscalers(obs.autoscalers)
    }
    keda_prometheus = cfg.autoscaling.keda_prometheus_address
    problems: dict[str, AutoscalingProblem] = {}  # target -> why it has no autoscaler
    autoscaled: dict[str, AutoscalerRef] = {}  # target -> its autoscaler
    autoscaling = spec.autoscaling_by_target(wanted)
    counts: dict[GPUTarget, int] = {}  # replicas wanted per target now (the HPA's where it owns them)
    keep: set[str] = set()
    keep_autoscalers: set[AutoscalerRef] = set()
    target_statuses: list[DeploymentTargetStatus] = []
    rollout_done: dict[str, bool] = {}
    engine_not_ready: set[str] = set()  # targets whose engine is not Ready (typed, not read from text)
    runtime = spec.runtime
    # The image that loads this engine: slim only for version-compatible ones (docs/design.md
    # §"Runtime image per engine").
    version_compatible = bool(obs.engine and obs.engine.spec.builder.version_compatible)
    image = runtime.image or cfg.runtime_image_for(version_compatible)
    llm_facts = llm_engine_facts(obs.engine) if obs.engine is not None else None
    llm_problems: dict[str, LLMProblem] = {}
    group_states: dict[str, deployment_groups.GroupState] = {}  # grouped targets' groups
    for target, split in wanted.items():
        ts = engine_targets[target.name]
        dname = children.deployment_name(obs.name, target)
        llm = llm_runtime(spec.llm, llm_facts, target)
        shape, shape_problem = deployment_groups.group_shape(obs, llm, target)
        grouped = shape is not None and shape.is_group
        if not (grouped or shape_problem):  # a grouped target runs no Deployment (one from before goes)
            keep.add(dname)
        cur = None if grouped or shape_problem else existing.get(dname)
        auto = autoscaling[target]
        choice = autoscaler_choice(auto, obs.apis, keda_prometheus)
        decision = replicas_decision(split, auto, cur.spec_replicas if cur is not None else None, choice.kind)
        replicas = counts[target] = decision.replicas
        st = DeploymentTargetStatus(
            name=target.name, gpu=target.gpu, mig=target.mig, deployment_name=dname, replicas=replicas
        )
        desired_hash = None
        gplan: GroupsPlan | None = None
        rendered: dict[str, Any] = {}  # a grouped target's Deployment as it would be: its pods' template
        lws_state: lws.Readiness | None = None
        if isinstance(llm, LLMProblem):
            llm_problems[target.name] = llm
        # An ONNX target serves its engine key; an LLM target its checkpoint (and tuning record).
        serve_key = llm.checkpoint_key if isinstance(llm, LLMRuntime) else ts.engine_key
        if (
            ts.phase == "Ready"
            and serve_key
            and (ts.sha256 or isinstance(llm, LLMRuntime))
            and _llm_ok(llm)
            and not shape_problem
        ):
            try:
                ki = key_inputs(obs.engine.spec, target, obs.nodes, cfg) if obs.engine else None
            except ValueError:
                ki = None
            selector = ki.node_selector if ki else target.node_selector()
            resources = runtime.resources.to_wire()
            if isinstance(llm, LLMRuntime):  # GH200: the KV cache's host tier in Grace memory
                tier = host_cache.target_host_cache(
                    llm.server,
                    target,
                    obs.nodes,
                    shape.gpus_per_rank if shape is not None else 1,
                    resources,
                    ts.weights_overflow_mib,
                )
                llm = dataclasses.replace(llm, supervisor_args=tier.arguments)
                resources = tier.resources
            rreq = children.RuntimeRequest(
                namespace=obs.namespace,
                infd=obs.name,
                infd_uid=obs.uid,
                target=target,
                engine_key=serve_key,
                engine_sha256=ts.sha256 or "",
                replicas=replicas,
                node_selector=selector,
                image=image,
                image_pull_policy=runtime.image_pull_policy or cfg.image_pull_policy,
                port=runtime.port,
                grpc_port=runtime.grpc_port,
                max_batch_size=runtime.batching.max_batch_size,
                max_queue_delay_us=runtime.batching.max_queue_delay_microseconds,
                instances=runtime.instances,
                workers=runtime.workers,
                resources=resources,
                env=tuple(e.to_wire() for e in runtime.env),
                tolerations=tuple(t.to_wire() for t in runtime.tolerations),
                mig_strategy=ki.mig_strategy if ki else MigStrategy.MIXED,
                max_surge=spec.rollout.max_surge,
                max_unavailable=spec.rollout.max_unavailable,
                progress_deadline_seconds=spec.rollout.progress_deadline_seconds,
                avoid_nodes=tuple(sorted(avoid_for(target))),
                hpa_owned=decision.hpa_owned,
                gpus=shape.gpus_per_rank if shape is not None and not grouped else 1,
            )
            if isinstance(llm, LLMRuntime):  # the server's own port, no front proxy on the token path
                dep = llm_children.llm_runtime_deployment(rreq, llm, cfg)
            else:
                dep = children.runtime_deployment(rreq, cfg)
            if cfg.front_proxy.enabled and not isinstance(llm, LLMRuntime):  # its applier writes a difference
                cm = front_proxy.front_proxy_configmap(
                    dep, cfg.front_proxy, http_port=runtime.port, grpc_port=runtime.grpc_port
                )
                plan.config_maps.append(ApplyConfigMap(cm))
            desired_hash = dep["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
            if grouped:
                rendered = dep
            elif cur is None or cur.annotations.get(ANNOTATION_SPEC_HASH) != desired_hash:
                plan.deployments.append(ApplyDeployment(dep, keep_replicas=decision.hpa_owned))
        if grouped and isinstance(llm, LLMRuntime) and shape is not None:
            # Not rendered (its engine being re-tuned): the groups are held, broken ones still torn down.
            gt = GroupTarget(
                namespace=obs.namespace,
                infd=obs.name,
                infd_uid=obs.uid,
                shape=shape,
                groups=replicas,
                deployment=rendered,
                gpu_resource=target.resource_name(),
                probe_port=runtime.port,
                openai_port=llm.openai_port,
                pods=[p for p in rank_pods if p.labels.get(LABEL_TARGET) == target.name],
                avoid_nodes=frozenset(avoid_for(target)),
                node_labels=[n.labels for n in obs.nodes if n.hosts(target)],
                now=now,
                trtllm=(
                    obs.engine.spec.parallelism_of(target)
                    if llm.server is LLMServer.TRTLLM_SERVE and obs.engine is not None
                    else None
                ),
            )
            refusal = deployment_groups.rank_exec_refusal(gt, cfg.groups.rank_exec)
            if (spec.llm or LLMServing()).group_backend is GroupBackend.LWS:
                unsupported = deployment_groups.lws_trtllm_refusal(gt)
                if unsupported is not None:
                    lws_state = unsupported
                elif rendered:
                    lws_state = deployment_groups.leader_worker_set(obs, gt, dname, plan.leader_worker_sets)
                if gt.pods:  # groups the native backend made before: they go whole
                    plan.groups.append(plan_groups(dataclasses.replace(gt, groups=0)))
            elif refusal is not None:  # nothing made; groups made before the grant went go whole
                lws_state = refusal
                if gt.pods:  # their leaders' access stays for the owner's deletion: not ours to delete now
                    plan.groups.append(plan_groups(dataclasses.replace(gt, groups=0, trtllm=None)))
            else:
                records[:] = deployment_groups.enriched(records, gt)
                gplan, group_faults, group_events = deployment_groups.native_groups(
                    gt, records, obs.nodes, ttl
                )
                for d in group_faults:
                    record_fault(d)
                events += group_events
                plan.groups.append(gplan)
        if grouped:
            group_states[target.name] = gplan if gplan is not None else lws_state
        if shape_problem:
            group_states[target.name] = lws.Readiness(
                False, deployment_groups.GROUP_SHAPE_INVALID, shape_problem
            )
        if decision.hpa_owned and auto is not None and choice.kind is not None:
            # Made once the target has a Deployment to scale (or one is being made now).
            ref = AutoscalerRef(choice.kind, children.autoscaler_name(obs.name, target))
            if cur is not None or desired_hash is not None or ref in autoscalers:
                keep_autoscalers.add(ref)
                autoscaled[target.name] = ref
                obj = _autoscaler(obs, cfg, target, auto, choice.kind, dname, grouped=grouped)
                have = autoscalers.get(ref)
                if (
                    have is None
                    or have.annotations.get(ANNOTATION_SPEC_HASH)
                    != (obj["metadata"]["annotations"][ANNOTATION_SPEC_HASH])
                ):
                    plan.apply_autoscalers.append(obj)
                st.autoscaler, st.autoscaler_kind = ref.name, ref.kind.value
        if choice.problem is not None:
            problems[target.name] = choice.problem
        if cur is not None:
            st.engine_key = cur.template_annotations.get(ANNOTATION_ENGINE_KEY)
            st.current_replicas = cur.replicas
            st.ready_replicas = cur.ready_replicas
            st.updated_replicas = cur.updated_replicas
        up_to_date = (
            cur is not None
            and desired_hash is not None
            and cur.annotations.get(ANNOTATION_SPEC_HASH) == desired_hash
        )
        done = (
            up_to_date
            and cur is not None
            and cur.rolled_out()
            and not any(
                p.node in avoid
                for p in our_pods
                if p.labels.get(LABEL_TARGET) == target.name and not p.deleting
            )
        )
        if gplan is not None:
            st.current_replicas, st.ready_replicas = gplan.current, gplan.whole
            st.updated_replicas, done = gplan.updated, gplan.rolled_out
        elif lws_state is not None:
            done = lws_state.ready
            st.ready_replicas = replicas if done else 0
        if grouped or shape_problem:
            st.deployment_name = None
        rollout_done[target.name] = done
        if ts.phase != "Ready":
            engine_not_ready.add(target.name)
        st.message = target_message(
            TargetRollout(
                engine_phase=ts.phase,
                engine_detail=ts.message or ts.reason or "",
                engine_key=ts.engine_key,
                rollout_stuck=cur is not None and cur.progress_deadline_exceeded,
                rolled_out=done,
            )
        )
        if choice.problem is not None:
            st.message += "; " + problem_message(choice.problem)
        if target.name in llm_problems:
            st.message += "; " + llm_problem_message(llm_problems[target.name], target, spec.engine_ref.name)
        if shape_problem:
            st.message += "; " + shape_problem
        target_statuses.append(st)
    plan.delete_deployments = sorted(n for n in existing if n not in keep)
    if cfg.front_proxy.enabled:
        plan.delete_config_maps = [front_proxy.configmap_name(n) for n in plan.delete_deployments]
    plan.delete_autoscalers = sorted(r for r in autoscalers if r not in keep_autoscalers)
    llm_port = (spec.llm or LLMServing()).port if llm_facts is not None else None
    leaders = deployment_groups.leader_selector(obs, group_states)
    if wanted:
        plan.service = ApplyService(
            llm_children.llm_service(obs.namespace, obs.name, obs.uid, runtime.port, llm_port, leaders)
            if llm_port is not None
            else children.runtime_service(obs.namespace, obs.name, obs.uid, runtime.port, runtime.grpc_port)
        )

    # --- recovery of recorded faults
    served = {name: existing.get(dname) for name, dname in dep_names.items()}
    rebuilds = {name: jobs_by_name.get(job) for name, job in pending_rebuild.items()}
    records, recovered = _recover(records, served, rollout_done, rebuilds, now)
    events += recovered

    # --- status
    total = sum(counts.values())
    ready_total = sum(min(s.ready_replicas, s.replicas) for s in target_statuses)
    svc = children.service_name(obs.name)
    status = InferenceDeploymentStatus(
        observed_generation=obs.generation,
        conditions=_autoscaling_condition(
            _conditions(obs, counts, target_statuses, rollout_done, records, existing, engine_not_ready),
            obs,
            any(a is not None for a in autoscaling.values()),
            autoscaled,
            problems,
        ),
        targets=target_statuses,
        replicas=sum(s.current_replicas for s in target_statuses),
        desired_replicas=total,
        ready_replicas=ready_total,
        selector=children.selector_text(obs.name)
        if leaders is None
        else groups.scale_selector(children.selector_labels(obs.name)),
        ready=ready_text(ready_total, total),
        endpoint=(
            None
            if not wanted
            else llm_children.openai_endpoint(obs.name, obs.namespace, llm_port)
            if llm_port is not None
            else f"http://{svc}.{obs.namespace}.svc:{runtime.port}"
        ),
        server=_server(spec.llm, llm_facts, list(wanted)),
        faults=records[-cfg.faults.history :],
    )
    status.conditions = deployment_groups.groups_condition(status.conditions, obs, group_states)
    status.conditions = pruned_condition(  # docs/design.md §"What a tenant can forge"
        status.conditions,
        pruned_fields(obs.annotations, spec_schema(InferenceDeployment)),
        obs.generation,
        timestamp(now),
    )
    engine_patch = None
    if obs.engine is not None:
        # The TRTEngine creates the rebuilds from this status (planning/rebuild.py); requests an
        # earlier version recorded on it as annotations go.
        patch = legacy_cleanup_patch(f"{obs.namespace}/{obs.name}", obs.engine.metadata.annotations)
        if patch:
            engine_patch = PatchEngineAnnotations(obs.spec.engine_ref.name, patch)
    old_status = obs.status.to_wire() if obs.status_wire else {}  # the patch base, normalised
    return plan.plan(status, old_status, events, engine_patch)


def _llm_ok(llm: LLMRuntime | LLMProblem | None) -> bool:
    """An ONNX target (None) or an LLM target ready to serve; not one with a problem."""
    return not isinstance(llm, LLMProblem)


def _server(
    serving: LLMServing | None, facts: LLMEngineFacts | None, targets: list[GPUTarget]
) -> LLMServer | None:
    """The LLM server the pods run (the first target's), for ``kubectl get``; None for ONNX."""
    if facts is None or not targets:
        return None
    return (serving.server if serving is not None else None) or llm_children.default_server(targets[0])


def _recover(
    records: list[FaultRecord],
    served: Mapping[str, DeploymentView | None],
    rollout_done: Mapping[str, bool],
    rebuilds: Mapping[str, JobView | None],
    now: float,
) -> tuple[list[FaultRecord], list[Event]]:
    """The recorded faults, those that recover now (:func:`recovery_wait` says none is left to wait
    for) with their recovery time, and an Event for each. `served`: target -> its Deployment;
    `rebuilds`: target -> the rebuild Job it still asks for."""
    out, events = list(records), []
    for i, rec in enumerate(records):
        tname = rec.target or ""
        serving = served.get(tname)
        recovery = FaultRecovery(
            record=rec,
            rolled_out=rollout_done.get(tname, False),
            rebuild=rebuilds.get(tname),
            served_sha256=serving.template_annotations.get(ANNOTATION_ENGINE_SHA256) if serving else None,
        )
        if recovery_wait(recovery) is not None:
            continue
        secs = round(max(0.0, now - rec.time.timestamp()), 1)
        out[i] = rec.model_copy(update={"recovered_seconds": secs})
        events.append(
            Event("Normal", "Recovered", f"{tname}: serving again {secs}s after the fault on {rec.node}")
        )
    return out, events


def _autoscaler(
    obs: DeploymentObserved,
    cfg: OperatorConfig,
    target: GPUTarget,
    auto: Autoscaling,
    kind: AutoscalerKind,
    deployment: str,
    *,
    grouped: bool = False,
) -> dict[str, Any]:
    """The HPA or ScaledObject of one target Deployment; of a grouped target, the InferenceDeployment's
    scale subresource (its replicas count groups; its selector names their leaders)."""
    scale_target = children.infd_scale_ref(obs.name) if grouped else None
    leaders = f"{groups.group_name(obs.name, 0)[:-1]}[0-9]+-0" if grouped else None
    if kind == AutoscalerKind.SCALED_OBJECT:
        return children.runtime_scaled_object(
            children.ScaledObjectRequest(
                namespace=obs.namespace,
                infd=obs.name,
                infd_uid=obs.uid,
                target=target,
                min_replicas=auto.min_replicas,
                max_replicas=auto.max_replicas,
                server_address=cfg.autoscaling.keda_prometheus_address or "",
                query=keda_query(
                    auto.metric, obs.namespace, deployment, cfg.autoscaling.rate_window, leaders
                ),
                threshold=keda_threshold(auto.target_value),
                scale_target=scale_target,
            )
        )
    assert obs.apis.hpa is not None  # autoscaler_choice gives HPA only with an HPA API
    return children.runtime_autoscaler(
        children.AutoscalerRequest(
            namespace=obs.namespace,
            infd=obs.name,
            infd_uid=obs.uid,
            target=target,
            api_version=obs.apis.hpa.value,
            min_replicas=auto.min_replicas,
            max_replicas=auto.max_replicas,
            metric=CUSTOM_METRIC_NAMES[auto.metric],
            target_value=str(auto.target_value),
            scale_target=scale_target,
        )
    )


AUTOSCALING = "Autoscaling"  # the condition type
AUTOSCALED = "AutoscalersInPlace"  # its reason when every autoscaled target has its autoscaler


def _autoscaling_condition(
    conds: list[Condition],
    obs: DeploymentObserved,
    requested: bool,
    autoscaled: dict[str, AutoscalerRef],
    problems: dict[str, AutoscalingProblem],
) -> list[Condition]:
    """The Autoscaling condition: False naming what is missing (typed reason) while a target asked to
    autoscale has no autoscaler; True once each has one; absent without autoscaling."""
    if not requested:
        return [c for c in conds if c.type != AUTOSCALING]
    gen, at = obs.generation, utc(obs.now)
    if problems:
        first = sorted(problems)[0]
        reason = problems[first]
        names = ", ".join(sorted(t for t, p in problems.items() if p == reason))
        msg = one_line(f"{names}: {problem_message(reason)}", 1000)
        return set_condition(conds, AUTOSCALING, "False", reason.value, msg, observed_generation=gen, at=at)
    msg = one_line(
        "; ".join(f"{t}: {r.kind.value} {r.name}" for t, r in sorted(autoscaled.items()))
        or "no target has a Deployment yet",
        1000,
    )
    return set_condition(conds, AUTOSCALING, "True", AUTOSCALED, msg, observed_generation=gen, at=at)


def _conditions(
    obs: DeploymentObserved,
    wanted: dict[GPUTarget, int],
    targets: list[DeploymentTargetStatus],
    done: dict[str, bool],
    records: list[FaultRecord],
    existing: dict[str, DeploymentView],
    engine_not_ready: set[str],
) -> list[Condition]:
    """Ready, Progressing and Degraded, from their policies (planning/deployment_policies.py)."""
    gen, at = obs.generation, utc(obs.now)
    not_done = [t for t in targets if not done.get(t.name)]
    r = readiness(
        Serving(
            engine_found=obs.engine is not None,
            engine_problem=obs.engine_problem
            or f"TRTEngine {obs.spec.engine_ref.name} not found in {obs.namespace}",
            engine_has_targets=bool(obs.engine.status.targets) if obs.engine is not None else False,
            replicas=sum(wanted.values()),
            targets=len(wanted),
            not_done=[(t.name, t.message or "") for t in not_done],
            waiting_for_engine=any(t.name in engine_not_ready for t in not_done),
        )
    )
    d = degradation(
        Health(
            open_faults=[f for f in records if f.recovered_seconds is None],
            stuck=[dep.name for dep in existing.values() if dep.progress_deadline_exceeded],
        )
    )
    progressing = r.message if r.progressing_message is None else r.progressing_message
    conds = list(obs.status.conditions)
    conds = set_condition(conds, "Ready", r.ready, r.ready_reason, r.message, observed_generation=gen, at=at)
    conds = set_condition(
        conds, "Progressing", r.progressing, r.progressing_reason, progressing, observed_generation=gen, at=at
    )
    return set_condition(conds, "Degraded", d.status, d.reason, d.message, observed_generation=gen, at=at)


def invalid_deployment_status(
    old: InferenceDeploymentStatus, generation: int, message: str, now: float
) -> InferenceDeploymentStatus:
    """Status of an InferenceDeployment whose spec the models refuse: Ready=False naming the field
    (the CRD of an old cluster, without its CEL rules, lets such a spec in). Targets are kept."""
    at = utc(now)
    msg = one_line(message, 1000)
    conds = set_condition(
        list(old.conditions), "Ready", "False", "InvalidSpec", msg, observed_generation=generation, at=at
    )
    conds = set_condition(
        conds, "Progressing", "False", "InvalidSpec", msg, observed_generation=generation, at=at
    )
    return old.model_copy(update={"observed_generation": generation, "conditions": conds})
