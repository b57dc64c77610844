"""Pods for leases, and why a pod ended: the pure half of the kubernetes provider.

``build_pod(spec, pool, ...)`` is the pod of one attempt as the API's JSON (a V1Pod as a
dict): one container running the step under ``spot-pipelines watch --cloud kubernetes``,
the attempt's ``SPOT_*`` environment, the node's name from the downward API, the labels
``spot-pipelines/managed|job|attempt``, and placement on the pool by required node
affinity (one term per flavour's spot label, ORed; on-demand excludes every spot label)
plus tolerations of the spot taints. The user's ``pod_template`` is merged *under* ours:
theirs supplies volumes, resources, node selectors, extra tolerations and affinity
(ANDed with ours), ours wins where both set the same field. The Airflow
SpotKubernetesPodOperator reuses it.

``pod_status(pod, node, ...)`` says why a pod ended as a ``LeaseStatus``: the verdict of
``spot_core.policy.pod_outcomes.classify_pod`` (the rules are there), which decides a disruption
before the exit code and hands the controller its outcome (``LeaseStatus.outcome``).
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spot_core.attempt_env import AttemptEnv, clip
from spot_core.interruption.kubernetes import NODE_NAME_ENV, POD_NAME_ENV, POD_NAMESPACE_ENV
from spot_core.market.kubernetes import (
    ANY,
    FLAVOURS,
    INSTANCE_TYPE_LABELS,
    REGION_LABEL,
    ZONE_LABEL,
)
from spot_core.model import Outcome, Pool
from spot_core.policy.pod_outcomes import (  # noqa: F401 - re-exported
    ANNOTATION_POOL,
    CONFIG_WAITING_REASONS,
    NOTICE_MARGIN_SECONDS,
    STEP_CONTAINER,
    UNKNOWN,
    Disruption,
    PodVerdict,
    as_api,
    classify_pod,
    node_of,
    parse_time,
    step_status,
    terminal,
    waiting_problem,
)
from spot_core.providers.base import LaunchSpec, LeaseState, LeaseStatus

LABEL_MANAGED = "spot-pipelines/managed"
LABEL_JOB = "spot-pipelines/job"
LABEL_ATTEMPT = "spot-pipelines/attempt"
ANNOTATION_JOB_ID = "spot-pipelines/job-id"  # the job id verbatim (a label value is limited)
# Karpenter leaves a node alone while a pod with the first runs (no consolidation, drift
# or emptiness; a spot interruption or expiration still proceeds); the cluster-autoscaler
# does not scale down a node with a pod carrying the second.
DO_NOT_DISRUPT = {
    "karpenter.sh/do-not-disrupt": "true",
    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
}


# -- names -------------------------------------------------------------------------------------
def label_value(text: str) -> str:
    """``text`` as a valid label value (<= 63 of [A-Za-z0-9._-], alphanumeric ends); a
    changed value gets a short hash so two job ids never share one."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63].strip("._-")
    if cleaned == text:
        return cleaned
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{cleaned[:54].strip('._-')}-{digest}".strip("-")


def pod_name(job_id: str, attempt: int, suffix: str) -> str:
    """A DNS-1123 name: ``spot-<job>-<attempt>-<suffix>``, at most 63 characters."""
    job = re.sub(r"[^a-z0-9-]", "-", job_id.lower()).strip("-") or "job"
    tail = f"-{attempt}-{suffix}"
    return f"spot-{job[: 63 - 5 - len(tail)].strip('-')}{tail}"


def job_selector(job_id: str | None = None) -> str:
    selector = f"{LABEL_MANAGED}=true"
    return selector if job_id is None else f"{selector},{LABEL_JOB}={label_value(job_id)}"


# -- placement ---------------------------------------------------------------------------------
def placement(
    pool: Pool, flavours: Sequence[str] = ()
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(required node affinity, tolerations) that put a pod on ``pool`` and nowhere else.

    Spot: one term per spot label (of ``flavours``, or of all), ORed. On-demand: one term
    that excludes every spot label (``NotIn`` also matches nodes without the label)."""
    where = [
        {"key": key, "operator": "In", "values": [value]}
        for key, value in ((REGION_LABEL, pool.region), (ZONE_LABEL, pool.zone))
        if value != ANY
    ]
    if pool.instance_type != ANY:
        where.append(
            {"key": INSTANCE_TYPE_LABELS[0], "operator": "In", "values": [pool.instance_type]}
        )
    if pool.is_spot:
        chosen = [f for f in FLAVOURS if not flavours or f.name in flavours] or list(FLAVOURS)
        terms = [
            {
                "matchExpressions": [
                    {"key": f.label, "operator": "In", "values": [f.spot_value]},
                    *where,
                ]
            }
            for f in chosen
        ]
        tolerations = [
            {"key": f.spot_taint, "operator": "Exists", "effect": "NoSchedule"}
            for f in chosen
            if f.spot_taint
        ]
    else:
        terms = [
            {
                "matchExpressions": [
                    *(
                        {"key": f.label, "operator": "NotIn", "values": [f.spot_value]}
                        for f in FLAVOURS
                    ),
                    *where,
                ]
            }
        ]
        tolerations = []
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    return affinity, tolerations


def _and_terms(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Node selector terms are ORed; ANDing two sets is their cross product."""
    if not theirs:
        return ours
    return [
        {
            key: [*a.get(key, []), *b.get(key, [])]
            for key in ("matchExpressions", "matchFields")
            if a.get(key) or b.get(key)
        }
        for a in ours
        for b in theirs
    ]


# -- the pod -----------------------------------------------------------------------------------
def build_pod(
    spec: LaunchSpec,
    pool: Pool,
    *,
    name: str,
    namespace: str,
    image: str,
    watch_command: Sequence[str] = ("spot-pipelines",),
    pod_template: Mapping[str, Any] | None = None,
    service_account: str | None = None,
    flavours: Sequence[str] = (),
    watch_poll_interval: float = 1.0,
    do_not_disrupt: bool = True,
) -> dict[str, Any]:
    """The pod of one attempt on ``pool`` (the API's JSON), ``pod_template`` merged under.
    ``do_not_disrupt``: annotate it so that Karpenter and the cluster-autoscaler leave its
    node alone while the step runs (``DO_NOT_DISRUPT``)."""
    pod = copy.deepcopy(dict(pod_template or {}))
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    pod["metadata"] = _metadata(
        pod.get("metadata") or {}, spec, pool, name, namespace, do_not_disrupt
    )
    pod["spec"] = _pod_spec(
        pod.get("spec") or {},
        spec,
        pool,
        image,
        watch_command,
        service_account,
        flavours,
        watch_poll_interval,
    )
    pod.pop("status", None)
    return pod


def _metadata(
    theirs: Mapping[str, Any],
    spec: LaunchSpec,
    pool: Pool,
    name: str,
    namespace: str,
    do_not_disrupt: bool,
) -> dict[str, Any]:
    meta = {k: v for k, v in theirs.items() if k in ("labels", "annotations")}
    meta["name"], meta["namespace"] = name, namespace
    meta["labels"] = {
        **(theirs.get("labels") or {}),
        LABEL_MANAGED: "true",
        LABEL_JOB: label_value(spec.job_id),
        LABEL_ATTEMPT: str(spec.attempt),
    }
    meta["annotations"] = {
        **(theirs.get("annotations") or {}),
        **(DO_NOT_DISRUPT if do_not_disrupt else {}),
        ANNOTATION_JOB_ID: spec.job_id,
        ANNOTATION_POOL: pool.key,
    }
    return meta


def _pod_spec(
    theirs: Mapping[str, Any],
    spec: LaunchSpec,
    pool: Pool,
    image: str,
    watch_command: Sequence[str],
    service_account: str | None,
    flavours: Sequence[str],
    poll: float,
) -> dict[str, Any]:
    out = copy.deepcopy(dict(theirs))
    affinity, tolerations = placement(pool, flavours)
    user_affinity = copy.deepcopy(out.get("affinity") or {})
    user_node = user_affinity.get("nodeAffinity") or {}
    user_terms = (user_node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms"
    ) or []
    ours = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    ours["nodeSelectorTerms"] = _and_terms(ours["nodeSelectorTerms"], user_terms)
    user_affinity["nodeAffinity"] = {**user_node, **affinity["nodeAffinity"]}
    out["affinity"] = user_affinity
    out["tolerations"] = [
        *(out.get("tolerations") or []),
        *(t for t in tolerations if t not in (out.get("tolerations") or [])),
    ]
    out["restartPolicy"] = "Never"  # a relaunch is the controller's call, never the kubelet's
    if service_account:
        out["serviceAccountName"] = service_account
    containers = list(out.get("containers") or [])
    index = next(
        (i for i, c in enumerate(containers) if c.get("name") == STEP_CONTAINER),
        0 if containers else None,
    )
    base = containers[index] if index is not None else {}
    step = _step_container(base, spec, image, watch_command, poll)
    if index is None:
        containers.append(step)
    else:
        containers[index] = step
    out["containers"] = containers
    return out


def _step_container(
    theirs: Mapping[str, Any],
    spec: LaunchSpec,
    image: str,
    watch_command: Sequence[str],
    poll: float,
) -> dict[str, Any]:
    container = copy.deepcopy(dict(theirs))
    attempt = AttemptEnv(
        checkpoint_uri=spec.checkpoint_uri,
        job_id=spec.job_id,
        attempt=spec.attempt,
        metadata_endpoint=None,
        cloud="kubernetes",
        notice_file=None,
        heartbeat_timeout=spec.heartbeat_timeout_seconds,
    )
    ours = {**spec.env, **attempt.to_environ()}
    env = [
        e
        for e in container.get("env") or []
        if e.get("name") not in ours
        and e.get("name") not in (NODE_NAME_ENV, POD_NAME_ENV, POD_NAMESPACE_ENV)
    ]
    env += [{"name": k, "value": str(v)} for k, v in ours.items()]
    env += [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in (
            (NODE_NAME_ENV, "spec.nodeName"),
            (POD_NAME_ENV, "metadata.name"),
            (POD_NAMESPACE_ENV, "metadata.namespace"),
        )
    ]
    container.update(
        name=STEP_CONTAINER,
        image=spec.image or container.get("image") or image,
        env=env,
        command=[
            *watch_command,
            "watch",
            "--cloud",
            "kubernetes",
            "--report",
            "--poll-interval",
            f"{poll:g}",
            "--",
            *spec.command,
        ],
        terminationMessagePolicy="FallbackToLogsOnError",
    )
    container.pop("args", None)
    if spec.workdir:
        container["workingDir"] = spec.workdir
    return container


def mounted_store(store_uri: str | None, pod_template: Mapping[str, Any] | None) -> bool:
    """True when every step pod reaches ``store_uri``: ``s3://``, or a ``file://`` path
    under a volume the template mounts in the step container (a PVC, an NFS share)."""
    if not store_uri:
        return False
    if not store_uri.startswith("file://"):
        return True
    from urllib.parse import unquote, urlsplit

    path = unquote(urlsplit(store_uri).path).rstrip("/")
    containers = ((pod_template or {}).get("spec") or {}).get("containers") or []
    step = next(
        (c for c in containers if c.get("name") == STEP_CONTAINER),
        containers[0] if containers else {},
    )
    mounts = [str(m.get("mountPath", "")).rstrip("/") for m in step.get("volumeMounts") or []]
    return any(m and (path == m or path.startswith(m + "/")) for m in mounts)


def template_image(pod_template: Mapping[str, Any] | None) -> str | None:
    """The image of the template's step container (or its first), if it names one."""
    containers = ((pod_template or {}).get("spec") or {}).get("containers") or []
    step = next(
        (c for c in containers if c.get("name") == STEP_CONTAINER),
        containers[0] if containers else {},
    )
    return step.get("image") or None


# -- why a pod ended (policy.pod_outcomes decides; this is the provider's view of it) -------
def unschedulable_since(pod: Mapping[str, Any]) -> tuple[float | None, str] | None:
    """(since, message) while the scheduler finds no node for the pod."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return parse_time(condition.get("lastTransitionTime")), condition.get("message") or ""
    return None


def scheduled_at(pod: Mapping[str, Any]) -> float | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return parse_time(condition.get("lastTransitionTime"))
    return None


def step_state(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The step container's status (``state``, ``lastState``, ...), or {}."""
    return step_status(as_api(pod))


def pod_status(
    pod: Any,
    node: Any = UNKNOWN,
    *,
    notice_at: float | None = None,
    notice_why: str = "",
    terminated_by_us: bool = False,
    now: float,
    events: Sequence[Any] = (),
    spot: bool | None = None,
    completed: bool | Callable[[], bool] = False,
    earlier: Sequence[Disruption] = (),
    margin_seconds: float = NOTICE_MARGIN_SECONDS,
) -> LeaseStatus:
    """What became of a lease's pod (``None``: the pod is gone, 404) on ``node`` (None:
    gone; ``UNKNOWN``: not looked at), as a ``LeaseStatus`` carrying the classifier's
    verdict (``spot_core.policy.pod_outcomes.classify_pod``; the pod may be the API's JSON, a
    kubernetes-client ``V1Pod`` or its ``to_dict()``). ``notice_at`` / ``notice_why``: a
    notice seen earlier (the pod's watcher reported one). A running pod's status carries
    the notice it shows, if any, in ``message``."""
    if notice_at is not None:
        earlier = [
            *earlier,
            Disruption("notice", notice_why or "a notice seen by the pod's watcher", at=notice_at),
        ]
    verdict = classify_pod(
        pod,
        node,
        events=events,
        spot=spot,
        completed=completed,
        terminated_by_us=terminated_by_us,
        earlier=earlier,
        now=now,
        margin_seconds=margin_seconds,
    )
    return lease_status(verdict)


def lease_status(verdict: PodVerdict) -> LeaseStatus:
    """The verdict as the controller reads a lease: its state, exit code, notice and the
    outcome itself (``LeaseStatus.outcome``), except for a pod spot-pipelines deleted,
    whose end the controller names (drained, stopped at a limit)."""
    message = clip(verdict.reason, 300)
    if not verdict.ended:
        return LeaseStatus(
            LeaseState.RUNNING,
            notice_at=verdict.notice_at,
            message=message if verdict.notice_at is not None else "",
            reclaim_at=verdict.deadline if verdict.notice_at is not None else None,
        )
    if verdict.ours:
        return LeaseStatus(
            LeaseState.TERMINATED,
            exit_code=verdict.exit_code,
            ended_at=verdict.ended_at,
            message="the pod was deleted by spot-pipelines",
        )
    outcome = Outcome(verdict.outcome)
    state = (
        LeaseState.RECLAIMED
        if outcome in (Outcome.PREEMPTED, Outcome.DISRUPTED)
        else LeaseState.EXITED
    )
    notice_at = verdict.notice_at
    if state is LeaseState.RECLAIMED and notice_at is None:
        notice_at = verdict.ended_at
    return LeaseStatus(
        state,
        exit_code=verdict.exit_code,
        notice_at=notice_at,
        ended_at=verdict.ended_at,
        message=message,
        outcome=outcome.value,
    )
