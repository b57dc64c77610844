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

``pod_status(pod, node, ...)`` says why a pod ended, from its conditions and its node's
state, never from the exit code alone (137 and 143 mean both "reclaimed" and "killed"):

- ``DisruptionTarget=True`` (PreemptionByScheduler, DeletionByTaintManager,
  EvictionByEvictionAPI, DeletionByPodGC, TerminationByKubelet) -> reclaimed;
- graceful node shutdown (phase Failed, reason Terminated / NodeShutdown / Shutdown, a
  message about the node shutting down) -> reclaimed;
- the pod's node carries a notice taint or is cordoned while the step stopped ->
  reclaimed (the in-pod watcher stops the step on that notice);
- pod gone (404): reclaimed if a notice or taint was seen, else an infrastructure loss;
- ``OOMKilled`` or a non-zero exit of the step -> the step's own failure;
- exit 0 -> succeeded.

The result is a ``LeaseStatus``; the controller's one classifier does the rest.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import re
from typing import Any, Mapping, Sequence

from spot_core.attempt_env import AttemptEnv
from spot_core.interruption.kubernetes import (NODE_NAME_ENV, POD_NAME_ENV, POD_NAMESPACE_ENV,
                                               node_notice)
from spot_core.market.kubernetes import (ANY, FLAVOURS, INSTANCE_TYPE_LABELS, REGION_LABEL,
                                         ZONE_LABEL)
from spot_core.model import Pool
from spot_core.providers.base import LaunchSpec, LeaseState, LeaseStatus

LABEL_MANAGED = "spot-pipelines/managed"
LABEL_JOB = "spot-pipelines/job"
LABEL_ATTEMPT = "spot-pipelines/attempt"
ANNOTATION_JOB_ID = "spot-pipelines/job-id"   # the job id verbatim (a label value is limited)
ANNOTATION_POOL = "spot-pipelines/pool"
STEP_CONTAINER = "step"

DISRUPTION_REASONS = frozenset({"PreemptionByScheduler", "DeletionByTaintManager",
                                "EvictionByEvictionAPI", "DeletionByPodGC",
                                "TerminationByKubelet"})
SHUTDOWN_REASONS = frozenset({"Terminated", "NodeShutdown", "Shutdown"})
SHUTDOWN_MESSAGE = re.compile(r"node shutdown|shutting down|shutdown", re.I)
# A container that cannot start for the user's configuration: no pool can fix it.
CONFIG_WAITING_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                                    "CreateContainerConfigError", "CreateContainerError",
                                    "ErrImageNeverPull"})


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
    return f"spot-{job[:63 - 5 - len(tail)].strip('-')}{tail}"


def job_selector(job_id: str | None = None) -> str:
    selector = f"{LABEL_MANAGED}=true"
    return selector if job_id is None else f"{selector},{LABEL_JOB}={label_value(job_id)}"


# -- placement ---------------------------------------------------------------------------------
def placement(pool: Pool, flavours: Sequence[str] = ()) -> tuple[dict, list[dict]]:
    """(required node affinity, tolerations) that put a pod on ``pool`` and nowhere else.

    Spot: one term per spot label (of ``flavours``, or of all), ORed. On-demand: one term
    that excludes every spot label (``NotIn`` also matches nodes without the label)."""
    where = [{"key": key, "operator": "In", "values": [value]}
             for key, value in ((REGION_LABEL, pool.region), (ZONE_LABEL, pool.zone))
             if value != ANY]
    if pool.instance_type != ANY:
        where.append({"key": INSTANCE_TYPE_LABELS[0], "operator": "In",
                      "values": [pool.instance_type]})
    if pool.is_spot:
        chosen = [f for f in FLAVOURS if not flavours or f.name in flavours] or list(FLAVOURS)
        terms = [{"matchExpressions": [{"key": f.label, "operator": "In",
                                        "values": [f.spot_value]}, *where]} for f in chosen]
        tolerations = [{"key": f.spot_taint, "operator": "Exists", "effect": "NoSchedule"}
                       for f in chosen if f.spot_taint]
    else:
        terms = [{"matchExpressions": [*({"key": f.label, "operator": "NotIn",
                                          "values": [f.spot_value]} for f in FLAVOURS), *where]}]
        tolerations = []
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}
    return affinity, tolerations


def _and_terms(ours: list[dict], theirs: list[dict]) -> list[dict]:
    """Node selector terms are ORed; ANDing two sets is their cross product."""
    if not theirs:
        return ours
    return [{key: [*a.get(key, []), *b.get(key, [])]
             for key in ("matchExpressions", "matchFields") if a.get(key) or b.get(key)}
            for a in ours for b in theirs]


# -- the pod -----------------------------------------------------------------------------------
def build_pod(spec: LaunchSpec, pool: Pool, *, name: str, namespace: str, image: str,
              watch_command: Sequence[str] = ("spot-pipelines",),
              pod_template: Mapping[str, Any] | None = None,
              service_account: str | None = None, flavours: Sequence[str] = (),
              watch_poll_interval: float = 1.0) -> dict:
    """The pod of one attempt on ``pool`` (the API's JSON), ``pod_template`` merged under."""
    pod = copy.deepcopy(dict(pod_template or {}))
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    pod["metadata"] = _metadata(pod.get("metadata") or {}, spec, pool, name, namespace)
    pod["spec"] = _pod_spec(pod.get("spec") or {}, spec, pool, image, watch_command,
                            service_account, flavours, watch_poll_interval)
    pod.pop("status", None)
    return pod


def _metadata(theirs: Mapping[str, Any], spec: LaunchSpec, pool: Pool, name: str,
              namespace: str) -> dict:
    meta = {k: v for k, v in theirs.items() if k in ("labels", "annotations")}
    meta["name"], meta["namespace"] = name, namespace
    meta["labels"] = {**(theirs.get("labels") or {}), LABEL_MANAGED: "true",
                      LABEL_JOB: label_value(spec.job_id), LABEL_ATTEMPT: str(spec.attempt)}
    meta["annotations"] = {**(theirs.get("annotations") or {}), ANNOTATION_JOB_ID: spec.job_id,
                           ANNOTATION_POOL: pool.key}
    return meta


def _pod_spec(theirs: Mapping[str, Any], spec: LaunchSpec, pool: Pool, image: str,
              watch_command: Sequence[str], service_account: str | None,
              flavours: Sequence[str], poll: float) -> dict:
    out = copy.deepcopy(dict(theirs))
    affinity, tolerations = placement(pool, flavours)
    user_affinity = copy.deepcopy(out.get("affinity") or {})
    user_node = user_affinity.get("nodeAffinity") or {}
    user_terms = (user_node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}) \
        .get("nodeSelectorTerms") or []
    ours = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    ours["nodeSelectorTerms"] = _and_terms(ours["nodeSelectorTerms"], user_terms)
    user_affinity["nodeAffinity"] = {**user_node, **affinity["nodeAffinity"]}
    out["affinity"] = user_affinity
    out["tolerations"] = [*(out.get("tolerations") or []),
                          *(t for t in tolerations if t not in (out.get("tolerations") or []))]
    out["restartPolicy"] = "Never"  # a relaunch is the controller's call, never the kubelet's
    if service_account:
        out["serviceAccountName"] = service_account
    containers = list(out.get("containers") or [])
    index = next((i for i, c in enumerate(containers) if c.get("name") == STEP_CONTAINER),
                 0 if containers else None)
    base = containers[index] if index is not None else {}
    step = _step_container(base, spec, image, watch_command, poll)
    if index is None:
        containers.append(step)
    else:
        containers[index] = step
    out["containers"] = containers
    return out


def _step_container(theirs: Mapping[str, Any], spec: LaunchSpec, image: str,
                    watch_command: Sequence[str], poll: float) -> dict:
    container = copy.deepcopy(dict(theirs))
    attempt = AttemptEnv(checkpoint_uri=spec.checkpoint_uri, job_id=spec.job_id,
                         attempt=spec.attempt, metadata_endpoint=None, cloud="kubernetes",
                         notice_file=None, heartbeat_timeout=spec.heartbeat_timeout)
    ours = {**spec.env, **attempt.to_environ()}
    env = [e for e in container.get("env") or [] if e.get("name") not in ours
           and e.get("name") not in (NODE_NAME_ENV, POD_NAME_ENV, POD_NAMESPACE_ENV)]
    env += [{"name": k, "value": str(v)} for k, v in ours.items()]
    env += [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for name, path in ((NODE_NAME_ENV, "spec.nodeName"), (POD_NAME_ENV, "metadata.name"),
                               (POD_NAMESPACE_ENV, "metadata.namespace"))]
    container.update(
        name=STEP_CONTAINER, image=spec.image or container.get("image") or image, env=env,
        command=[*watch_command, "watch", "--cloud", "kubernetes", "--report",
                 "--poll-interval", f"{poll:g}", "--", *spec.command],
        terminationMessagePolicy="FallbackToLogsOnError")
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
    step = next((c for c in containers if c.get("name") == STEP_CONTAINER),
                containers[0] if containers else {})
    mounts = [str(m.get("mountPath", "")).rstrip("/") for m in step.get("volumeMounts") or []]
    return any(m and (path == m or path.startswith(m + "/")) for m in mounts)


def template_image(pod_template: Mapping[str, Any] | None) -> str | None:
    """The image of the template's step container (or its first), if it names one."""
    containers = ((pod_template or {}).get("spec") or {}).get("containers") or []
    step = next((c for c in containers if c.get("name") == STEP_CONTAINER),
                containers[0] if containers else {})
    return step.get("image") or None


# -- why a pod ended ---------------------------------------------------------------------------
def disruption(pod: Mapping[str, Any]) -> dict | None:
    """The pod's ``DisruptionTarget=True`` condition with a reclaim reason, if any."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True" \
                and condition.get("reason") in DISRUPTION_REASONS:
            return dict(condition)
    return None


def node_shutdown(pod: Mapping[str, Any]) -> bool:
    """Graceful node shutdown: the kubelet failed the pod because its node shuts down."""
    status = pod.get("status") or {}
    return status.get("phase") == "Failed" and status.get("reason") in SHUTDOWN_REASONS \
        and bool(SHUTDOWN_MESSAGE.search(status.get("message") or ""))


def step_state(pod: Mapping[str, Any]) -> dict:
    """The step container's status (``state``, ``lastState``, ...), or {}."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == STEP_CONTAINER),
                statuses[0] if statuses else {})


def waiting_problem(pod: Mapping[str, Any]) -> str | None:
    """'REASON: message' when the step's container cannot start for its configuration."""
    waiting = (step_state(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in CONFIG_WAITING_REASONS:
        return f"{waiting['reason']}: {waiting.get('message') or 'no message'}"
    return None


def unschedulable_since(pod: Mapping[str, Any]) -> tuple[float, str] | None:
    """(since, message) while the scheduler finds no node for the pod."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                and condition.get("reason") == "Unschedulable":
            return parse_time(condition.get("lastTransitionTime")), condition.get("message") or ""
    return None


def scheduled_at(pod: Mapping[str, Any]) -> float | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return parse_time(condition.get("lastTransitionTime"))
    return None


def node_of(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def parse_time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def pod_notice(pod: Mapping[str, Any], node: Mapping[str, Any] | None,
               now: float) -> tuple[float, str] | None:
    """(when, why) if the pod's capacity is being taken away: a disruption condition on a
    pod that is being deleted or has ended (a condition alone can be withdrawn), a
    graceful node shutdown, or a notice taint or cordon on its node. A node that is simply
    gone is not a notice: without one, that loss is the infrastructure's."""
    condition = disruption(pod)
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    if condition is not None and (deleting or terminal(pod)):
        when = parse_time(condition.get("lastTransitionTime")) or now
        return when, f"pod disrupted ({condition['reason']}: {condition.get('message', '')})"
    if node_shutdown(pod):
        return now, f"graceful node shutdown: {(pod.get('status') or {}).get('message', '')}"
    if node is not None:
        seen = node_notice(node)
        if seen is not None:
            return now, f"node {node_of(pod)}: {seen[1]}"
    return None


def terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_status(pod: Mapping[str, Any] | None, node: Mapping[str, Any] | None = None, *,
               notice_at: float | None = None, notice_why: str = "",
               terminated_by_us: bool = False, now: float) -> LeaseStatus:
    """What became of a lease's pod (``None``: the pod is gone, 404) on ``node`` (None:
    gone or unknown). ``notice_at`` / ``notice_why``: a notice seen earlier (a pod that
    vanished after one was reclaimed). A running pod's status carries the notice it
    shows, if any, in ``message``."""
    if pod is None:
        seen = node_notice(node) if node is not None else None
        if notice_at is None and seen is not None:
            notice_at, notice_why = now, f"node {seen[1]}"  # it went with a node going away
        return _gone(notice_at, notice_why, terminated_by_us, now)
    notice = pod_notice(pod, node, now)
    seen_at = notice_at if notice_at is not None else (notice[0] if notice else None)
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return LeaseStatus(LeaseState.RUNNING, notice_at=seen_at,
                           message=notice[1][:300] if notice else "")
    terminated = (step_state(pod).get("state") or {}).get("terminated") or {}
    code = terminated.get("exitCode")
    ended = parse_time(terminated.get("finishedAt")) or now
    if code == 0 and phase == "Succeeded":
        return LeaseStatus(LeaseState.EXITED, exit_code=0, ended_at=ended)
    if notice is not None:
        return LeaseStatus(LeaseState.RECLAIMED, exit_code=code, notice_at=seen_at,
                           ended_at=ended, message=notice[1][:300])
    if terminated_by_us:
        return LeaseStatus(LeaseState.TERMINATED, exit_code=code, ended_at=ended,
                           message="the pod was deleted by spot-pipelines")
    return _step_end(terminated, status, code, ended, seen_at)


def _step_end(terminated: Mapping[str, Any], status: Mapping[str, Any], code: Any,
              ended: float, notice_at: float | None) -> LeaseStatus:
    reason = terminated.get("reason") or status.get("reason") or ""
    message = (terminated.get("message") or status.get("message") or "").strip()
    if reason == "OOMKilled":
        message = "OOMKilled: the step ran out of memory (raise its memory limit in " \
                  "pod_template)" + (f"; {message}" if message else "")
    elif reason and reason not in ("Error", "Completed"):
        message = f"{reason}: {message}" if message else reason
    if not isinstance(code, int):  # failed without a container verdict: not the step's doing
        return LeaseStatus(LeaseState.EXITED, notice_at=notice_at, ended_at=ended,
                           message=(message or "the pod failed before its step ran")[:300])
    return LeaseStatus(LeaseState.EXITED, exit_code=code, notice_at=notice_at, ended_at=ended,
                       message=message.splitlines()[-1][:300] if message else "")


def _gone(notice_at: float | None, why: str, terminated_by_us: bool, now: float) -> LeaseStatus:
    if terminated_by_us:
        return LeaseStatus(LeaseState.TERMINATED, ended_at=now,
                           message="the pod was deleted by spot-pipelines")
    if notice_at is not None:
        return LeaseStatus(LeaseState.RECLAIMED, notice_at=notice_at, ended_at=now,
                           message=f"the pod is gone after a notice ({why or 'seen by its watcher'})"[:300])
    return LeaseStatus(LeaseState.EXITED, ended_at=now,
                       message="the pod vanished (404) without a notice or node taint: "
                               "an infrastructure loss, not the step's failure")
