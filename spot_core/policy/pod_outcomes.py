"""Why a pod ended, as Kubernetes reports it: the kubernetes provider's one classifier.

``classify_pod(pod, node, events=..., now=...)`` reads a pod (the API's JSON, a
kubernetes-client ``V1Pod``, or its snake_case ``to_dict()``), its node and their events,
and answers a ``PodVerdict``: a JobRecord outcome (or ``running`` / ``pending``), the
reason in words, and when a pod still running under a notice must have ended. The
provider and ``spot-pipelines classify-pod`` call it alike.

The rules, by principle rather than by list (docs/kubernetes.md has the table of every
status it knows, with its source):

1. **A disruption is decided before the exit code.** Evidence that something outside the
   step stopped it: any ``DisruptionTarget=True`` condition, whatever its reason (the
   reason only refines it); graceful node shutdown, by its reasons (``Shutdown`` of 1.20
   and 1.21, ``Terminated``, ``NodeShutdown``) or its messages, in any phase (1.22 left
   such pods ``Running``, 1.27 made them ``Succeeded`` when the container exits 0); a
   kubelet eviction (``reason: Evicted``); ``NodeLost`` / phase ``Unknown``; a deletion
   nobody in spot-pipelines asked for; the node's notice taints, cordon, ``NotReady`` or
   absence. A disrupted pod is never ``succeeded`` because its container exited 0 on the
   SIGTERM: only the step's own report of completion (its final checkpoint or result in
   the store, ``completed``) makes it a success. It is never ``user_failed`` either.
2. **Which disruption.** Node-pressure eviction ("The node was low on resource") is the
   infrastructure's (``infrastructure_failed``); an eviction for exceeding the pod's own
   ephemeral-storage limits, which Kubernetes gives no ``DisruptionTarget`` because it
   would recur, is the step's (``user_failed``, like an OOM kill). Voluntary disruptions
   (Karpenter consolidation, drift, expiration; a cluster-autoscaler scale-down; a drain
   of an on-demand node) are ``disrupted``; the rest (a spot reclaim, preemption by
   priority, a node shut down, lost or gone) ``preempted``. An eviction through the
   Eviction API is voluntary unless its node is spot and nothing says otherwise: Karpenter's
   interruption handler and EKS managed node groups drain a spot node the same way.
3. **Bounded after a notice.** A pod under notice that has not ended (its node
   ``NotReady`` or gone, phase ``Unknown``, stuck ``Terminating``) ends at the notice plus
   its grace period plus ``margin``: the verdict then says so (``forced``), and
   ``force_delete`` when its node is gone (no kubelet will ever confirm the deletion).
4. **Otherwise the step's own verdict:** ``OOMKilled`` (in ``state`` or ``lastState``) or a
   non-zero exit is the step's failure, exit 0 its success; a pod that failed before its
   step ran (kubelet admission: ``OutOfcpu``, ``NodeAffinity``, ...) is the infrastructure's.

Pure: no I/O and no clock (``now`` comes in).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from spot_core.attempt_env import clip
from spot_core.interruption.kubernetes import NOTICE_TAINTS
from spot_core.market.kubernetes import FLAVOURS
from spot_core.model import Outcome

RUNNING, PENDING = "running", "pending"
STEP_CONTAINER = "step"
ANNOTATION_POOL = "spot-pipelines/pool"
DEFAULT_GRACE_SECONDS = 30.0  # the API server's terminationGracePeriodSeconds default
NOTICE_MARGIN_SECONDS = 30.0
# KEP-3329: a DisruptionTarget not followed by a deletion is cleared after about 2 minutes.
CONDITION_CLEARED_SECONDS = 120.0
UNKNOWN = object()  # the node was not given (as opposed to None: it is gone)

SHUTDOWN_REASONS = frozenset({"Shutdown", "Terminated", "NodeShutdown"})
SHUTDOWN_MESSAGES = re.compile(
    r"node is shutting, evicting pods"  # 1.20, 1.21 (reason Shutdown)
    r"|node is in progress of shutting down"  # 1.20 admission
    r"|terminated in response to imminent node shutdown"  # 1.22+ (reason Terminated)
    r"|rejected as the node is shutting down",
    re.I,
)  # 1.21+ admission (NodeShutdown)
NODE_PRESSURE = re.compile(r"the node was low on resource|the node had condition", re.I)
OWN_LIMIT = re.compile(
    r"exceeds the total limit of containers|exceeded its local ephemeral "
    r"storage limit|usage of emptydir volume .* exceeds the limit",
    re.I,
)
KUBELET_CRITICAL_PREEMPTION = re.compile(
    r"preempted in order to admit critical pod"
    r"|preempted by kubelet to accommodate a critical pod",
    re.I,
)
# Karpenter's event messages ("Evicted pod: Underutilized", "Disrupting Node: Drifted/Replace").
KARPENTER_VOLUNTARY = re.compile(r"underutili[sz]ed|empty|drift|expir|consolidat", re.I)
KARPENTER_INVOLUNTARY = re.compile(r"interrupt|spot|unhealthy|repair|stopping|terminating", re.I)
INVOLUNTARY_EVENT_REASONS = frozenset(
    {
        "SpotInterrupted",
        "TerminatingOnInterruption",
        "InstanceSpotInterrupted",
        "InstanceStopping",
        "InstanceTerminating",
        "Preempted",
    }
)
UNREACHABLE_TAINTS = frozenset(
    {
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/out-of-service",
    }
)
CONFIG_WAITING_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "ErrImageNeverPull",
    }
)


@dataclass(frozen=True)
class Disruption:
    """One piece of evidence that something outside the step stopped (or will stop) it.

    ``kind``: preemption, eviction, taint-eviction, node-gone, node-shutdown,
    node-pressure, own-limit, node-lost, node-notice, deleted, disruption (a
    ``DisruptionTarget`` reason this module does not know). ``voluntary``: True for the
    cluster's own choice, False for the cloud's or the node's, None when context decides.
    ``stopped``: the evidence itself says the containers were stopped (a kubelet wrote it
    while killing them), whatever the phase says."""

    kind: str
    why: str
    at: float | None = None
    voluntary: bool | None = None
    stopped: bool = False
    grace_seconds: float | None = None


@dataclass(frozen=True)
class PodVerdict:
    """What became of a pod: ``outcome`` is an ``Outcome`` value or running / pending."""

    outcome: str
    reason: str
    disruption: Disruption | None = None
    notice_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    deadline: float | None = None  # a running pod under notice must have ended by then
    forced: bool = False  # ended by that deadline, not by Kubernetes
    force_delete: bool = False  # its node is gone: delete it with grace 0
    ours: bool = False  # spot-pipelines deleted it (a drain, a time limit, a stop)
    evidence: tuple[Disruption, ...] = ()  # everything that showed a disruption

    @property
    def ended(self) -> bool:
        return self.outcome not in (RUNNING, PENDING)


# -- reading what the API (or a client) hands us ----------------------------------------------
_CAMEL_EXCEPTIONS = {
    "pod_ip": "podIP",
    "pod_i_ps": "podIPs",
    "host_ip": "hostIP",
    "host_i_ps": "hostIPs",
    "container_id": "containerID",
    "image_id": "imageID",
    "provider_id": "providerID",
    "pod_cidr": "podCIDR",
    "pod_cid_rs": "podCIDRs",
    "machine_id": "machineID",
    "system_uuid": "systemUUID",
    "boot_id": "bootID",
}
# Maps whose keys are data (label keys, resource names), never field names.
_DATA_MAPS = frozenset(
    {
        "labels",
        "annotations",
        "nodeSelector",
        "limits",
        "requests",
        "capacity",
        "allocatable",
        "data",
        "stringData",
        "matchLabels",
    }
)


def as_api(obj: Any) -> Any:
    """The object as the API's camelCase JSON: a kubernetes-client model (``V1Pod``), its
    snake_case ``to_dict()``, or the API's JSON as is; times become RFC 3339 text."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, (dt.datetime, dt.date)):
        return _rfc3339(obj)
    if hasattr(obj, "openapi_types") and hasattr(obj, "attribute_map"):
        return {
            obj.attribute_map[name]: as_api(getattr(obj, name))
            for name in obj.openapi_types
            if getattr(obj, name) is not None
        }
    if isinstance(obj, Mapping):
        return {
            _camel(k): (
                dict(v) if _camel(k) in _DATA_MAPS and isinstance(v, Mapping) else as_api(v)
            )
            for k, v in obj.items()
            if v is not None
        }
    if isinstance(obj, (list, tuple)):
        return [as_api(v) for v in obj]
    return obj


def _camel(key: Any) -> Any:
    if not isinstance(key, str) or "_" not in key or key.startswith("_"):
        return key
    if key in _CAMEL_EXCEPTIONS:
        return _CAMEL_EXCEPTIONS[key]
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _rfc3339(when: dt.date) -> str:
    if not isinstance(when, dt.datetime):
        return when.isoformat()
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> float | None:
    """POSIX seconds from RFC 3339 text (or a ``str(datetime)``); None if absent or bad."""
    if isinstance(text, dt.datetime):
        text = _rfc3339(text)
    if not isinstance(text, str) or not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


# -- small readers ------------------------------------------------------------------------------
def _status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("status") or {}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def conditions(obj: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    return [c for c in _status(obj).get("conditions") or [] if c.get("type") == kind]


def step_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The step's container status: the one named ``step``; else, for any other pod, the
    first that failed, else the first."""
    statuses: list[Mapping[str, Any]] = _status(pod).get("containerStatuses") or []
    named = [s for s in statuses if s.get("name") == STEP_CONTAINER]
    if named:
        return named[0]
    failed = [s for s in statuses if (_terminated(s) or {}).get("exitCode") not in (None, 0)]
    return (failed or statuses or [{}])[0]


def _terminated(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's last termination: ``state.terminated``, else ``lastState`` (a
    container the kubelet restarted, or a status reset after a node reboot)."""
    for key in ("state", "lastState"):
        terminated: Mapping[str, Any] | None = (status.get(key) or {}).get("terminated")
        if terminated:
            return terminated
    return None


def terminal(pod: Mapping[str, Any]) -> bool:
    return _status(pod).get("phase") in ("Succeeded", "Failed")


def node_of(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def pod_name(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    name = meta.get("name") or meta.get("generateName") or "?"
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


def waiting_problem(pod: Mapping[str, Any]) -> str | None:
    """'REASON: message' when the step's container cannot start for its configuration."""
    waiting = (step_status(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in CONFIG_WAITING_REASONS:
        return f"{waiting['reason']}: {waiting.get('message') or 'no message'}"
    return None


def grace_seconds(pod: Mapping[str, Any]) -> float:
    """The pod's grace period: the deletion's, else the spec's, else the API default."""
    for value in (
        _meta(pod).get("deletionGracePeriodSeconds"),
        (pod.get("spec") or {}).get("terminationGracePeriodSeconds"),
    ):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
    return DEFAULT_GRACE_SECONDS


# -- evidence of a disruption -------------------------------------------------------------------
def disruptions(
    pod: Mapping[str, Any], node: Any = UNKNOWN, *, terminated_by_us: bool = False
) -> list[Disruption]:
    """Every piece of evidence the pod and its node show, most decisive first."""
    found = [*_condition_evidence(pod), *_status_evidence(pod)]
    if not terminated_by_us and _meta(pod).get("deletionTimestamp") and not found:
        found.append(_deleted(pod))
    if node is not UNKNOWN and node_of(pod):
        # A pod that has ended says how by itself; its node lost or gone afterwards is no
        # evidence (a node is often removed once its pods finished). A notice taint is.
        found.extend(
            d for d in _node_evidence(pod, node) if not terminal(pod) or d.kind == "node-notice"
        )
    return found


def _condition_evidence(pod: Mapping[str, Any]) -> list[Disruption]:
    """``DisruptionTarget=True`` (1.25+) and the kubelet's ``PendingTermination`` (its
    evictions for a pod's own limits and critical-pod preemption, which get no
    ``DisruptionTarget``)."""
    out = []
    for condition in conditions(pod, "PendingTermination"):
        if condition.get("status") == "True":
            message = condition.get("message") or ""
            kind = (
                "own-limit"
                if OWN_LIMIT.search(message)
                else "preemption"
                if KUBELET_CRITICAL_PREEMPTION.search(message)
                else "node-pressure"
            )
            out.append(
                Disruption(
                    kind,
                    f"PendingTermination {condition.get('reason')}: {message}",
                    at=parse_time(condition.get("lastTransitionTime")),
                    voluntary=None if kind == "own-limit" else False,
                )
            )
    for condition in conditions(pod, "DisruptionTarget"):
        if condition.get("status") != "True":
            continue
        reason, message = condition.get("reason") or "", condition.get("message") or ""
        at = parse_time(condition.get("lastTransitionTime"))
        out.append(
            replace(
                _by_reason(reason, message),
                why=f"DisruptionTarget {reason or '(no reason)'}: {message}".strip(),
                at=at,
            )
        )
    return out


def _by_reason(reason: str, message: str) -> Disruption:
    """What one ``DisruptionTarget`` reason says; an unknown reason is still a disruption."""
    if reason in ("PreemptionByScheduler", "PreemptionByKubeScheduler"):
        return Disruption("preemption", "", voluntary=False)
    if reason == "EvictionByEvictionAPI":
        return Disruption("eviction", "")
    if reason in ("DeletionByTaintManager", "DeletionByDeviceTaintManager"):
        return Disruption("taint-eviction", "", voluntary=False)
    if reason == "DeletionByPodGC":
        return Disruption("node-gone", "", voluntary=False)
    if reason == "TerminationByKubelet":
        if NODE_PRESSURE.search(message):
            return Disruption("node-pressure", "", voluntary=False)
        if KUBELET_CRITICAL_PREEMPTION.search(message):
            return Disruption("preemption", "", voluntary=False)
        # Added when the shutdown starts, while the containers still stop (the kubelet
        # writes the phase, reason and message only once they have): a notice until then.
        return Disruption("node-shutdown", "", voluntary=False)
    return Disruption("disruption", "", voluntary=False)


def _status_evidence(pod: Mapping[str, Any]) -> list[Disruption]:
    status = _status(pod)
    reason, message = status.get("reason") or "", status.get("message") or ""
    said = f"status.reason {reason}: {message}".strip() if reason else f"status: {message}"
    if reason in SHUTDOWN_REASONS or SHUTDOWN_MESSAGES.search(message):
        return [
            Disruption(
                "node-shutdown", f"graceful node shutdown ({said})", voluntary=False, stopped=True
            )
        ]
    if reason == "Evicted":
        if OWN_LIMIT.search(message):
            return [Disruption("own-limit", said, stopped=True)]
        if NODE_PRESSURE.search(message):
            return [Disruption("node-pressure", said, voluntary=False, stopped=True)]
        return [
            Disruption(
                "node-pressure", f"evicted by the kubelet ({said})", voluntary=False, stopped=True
            )
        ]
    if reason == "Preempting" or KUBELET_CRITICAL_PREEMPTION.search(message):
        return [
            Disruption(
                "preemption",
                f"preempted by its kubelet for a critical pod ({said})",
                voluntary=False,
                stopped=True,
            )
        ]
    if reason == "NodeLost" or status.get("phase") == "Unknown":
        return [Disruption("node-lost", f"its node stopped reporting ({said})", voluntary=False)]
    return []


def _deleted(pod: Mapping[str, Any]) -> Disruption:
    meta = _meta(pod)
    grace = grace_seconds(pod)
    deadline = parse_time(meta.get("deletionTimestamp"))
    return Disruption(
        "deleted",
        "deleted by someone else (deletionTimestamp "
        f"{meta.get('deletionTimestamp')}, no DisruptionTarget reason)",
        at=None if deadline is None else deadline - grace,
        grace_seconds=grace,
    )


def _node_evidence(pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> list[Disruption]:
    name = node_of(pod)
    if node is None:
        return [Disruption("node-gone", f"its node {name} is gone", voluntary=False)]
    out = [
        _taint_evidence(name, taint)
        for taint in (node.get("spec") or {}).get("taints") or []
        if taint.get("key") in NOTICE_TAINTS
    ]
    if (node.get("spec") or {}).get("unschedulable") and not any(
        d.why.startswith(f"node {name}: taint node.kubernetes.io/unschedulable") for d in out
    ):
        out.append(Disruption("node-notice", f"node {name} is cordoned (spec.unschedulable)"))
    ready = next(iter(conditions(node, "Ready")), None)
    if ready is not None and ready.get("status") != "True":
        out.append(
            Disruption(
                "node-lost",
                f"node {name} is NotReady ({ready.get('reason')}: "
                f"{ready.get('message', '')})".strip(),
                at=parse_time(ready.get("lastTransitionTime")),
                voluntary=False,
            )
        )
    return out


def _taint_evidence(node: str | None, taint: Mapping[str, Any]) -> Disruption:
    key = taint.get("key", "")
    why = f"node {node}: taint {key}:{taint.get('effect', '')}"
    voluntary = {"autoscaler-scale-down": True, "gke-termination": False}.get(NOTICE_TAINTS[key])
    return Disruption(
        "node-notice", why, at=parse_time(taint.get("timeAdded")), voluntary=voluntary
    )


def event_evidence(events: Iterable[Mapping[str, Any]]) -> list[Disruption]:
    """What the pod's and its node's events say about the cause: the cluster-autoscaler's
    ``ScaleDown``, Karpenter's ``Evicted`` / ``DisruptionTerminating`` reasons (voluntary),
    a spot interruption (involuntary)."""
    out = []
    for event in events:
        reason, message = event.get("reason") or "", event.get("message") or ""
        source = " ".join(
            str(s)
            for s in ((event.get("source") or {}).get("component"), event.get("reportingComponent"))
            if s
        )
        said = f"event {reason} from {source or 'unknown'}: {message}"
        if reason == "Evicted" and "kubelet" in source:
            if OWN_LIMIT.search(message):
                out.append(Disruption("own-limit", said, stopped=True))
            elif NODE_PRESSURE.search(message):
                out.append(Disruption("node-pressure", said, voluntary=False, stopped=True))
        elif reason in INVOLUNTARY_EVENT_REASONS:
            out.append(Disruption("event", said, voluntary=False))
        elif reason == "ScaleDown" and ("autoscaler" in source or "scale down" in message):
            out.append(Disruption("event", said, voluntary=True))
        elif reason in ("Evicted", "DisruptionTerminating", "Disrupted") and "karpenter" in source:
            if KARPENTER_INVOLUNTARY.search(message):
                out.append(Disruption("event", said, voluntary=False))
            elif KARPENTER_VOLUNTARY.search(message) or "terminationTime" in message:
                out.append(Disruption("event", said, voluntary=True))
    return out


# -- spot or not --------------------------------------------------------------------------------
def spot_of(pod: Mapping[str, Any], node: Any = UNKNOWN) -> bool | None:
    """Whether the pod runs on spot capacity: its node's labels, else spot-pipelines' pool
    annotation, else a spot label its placement requires; None when nothing says."""
    if isinstance(node, Mapping):
        labels = _meta(node).get("labels") or {}
        return any(labels.get(f.label) == f.spot_value for f in FLAVOURS)
    pool: str = (_meta(pod).get("annotations") or {}).get(ANNOTATION_POOL, "")
    if pool.endswith("/spot") or pool.endswith("/on-demand"):
        return pool.endswith("/spot")
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    if any(selector.get(f.label) == f.spot_value for f in FLAVOURS):
        return True
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    wanted = {
        (e.get("key"), v)
        for t in terms
        for e in t.get("matchExpressions") or []
        if e.get("operator") == "In"
        for v in e.get("values") or []
    }
    return True if any((f.label, f.spot_value) in wanted for f in FLAVOURS) else None


# -- the verdict --------------------------------------------------------------------------------
def classify_pod(
    pod: Any,
    node: Any = UNKNOWN,
    *,
    events: Sequence[Any] = (),
    spot: bool | None = None,
    completed: bool | Callable[[], bool] = False,
    terminated_by_us: bool = False,
    earlier: Sequence[Disruption] = (),
    now: float,
    margin_seconds: float = NOTICE_MARGIN_SECONDS,
) -> PodVerdict:
    """What became of ``pod`` (None: it is gone, 404) on ``node`` (a Node; None: gone;
    ``UNKNOWN``: not given). ``events``: the pod's and its node's events, if read.
    ``spot``: the pod's market when the caller knows it. ``completed``: whether the step
    reported completion (or a function that reads it, called only when it matters).
    ``earlier``: notices seen before (the provider remembers them). See the module
    docstring for the rules."""
    pod, node = as_api(pod), node if node is UNKNOWN else as_api(node)
    events = [as_api(e) for e in events]
    if pod is None:
        return _gone(node, earlier, events, spot, completed, terminated_by_us, now)
    current = [
        *disruptions(pod, node, terminated_by_us=terminated_by_us),
        *(d for d in event_evidence(events) if d.kind != "event"),
    ]
    if spot is None:
        spot = spot_of(pod, node)
    if not _stopped(pod, current):
        return _still_running(
            pod,
            node,
            _stamped(current, earlier),
            events,
            spot,
            completed,
            terminated_by_us,
            now,
            margin_seconds,
        )
    if terminated_by_us and not earlier and not _from_kubernetes(pod):
        return _ours(pod, now)
    found = [*current, *earlier]
    if not found:
        return _own_verdict(pod, now)
    notice_at = min((d.at for d in found if d.at is not None), default=now)
    return _disrupted(pod, node, found, events, spot, completed, notice_at, now)


def _stamped(current: Sequence[Disruption], earlier: Sequence[Disruption]) -> list[Disruption]:
    """The evidence shown now, each dated when it was first seen: a notice withdrawn since
    (a node uncordoned, a condition cleared) no longer counts for a pod still running."""
    first = {(d.kind, d.why): d.at for d in earlier if d.at is not None}
    return [replace(d, at=first.get((d.kind, d.why), d.at)) for d in current]


def _still_running(
    pod: Mapping[str, Any],
    node: Any,
    found: Sequence[Disruption],
    events: Sequence[Mapping[str, Any]],
    spot: bool | None,
    completed: bool | Callable[[], bool],
    terminated_by_us: bool,
    now: float,
    margin: float,
) -> PodVerdict:
    """A pod not ended yet: running, under a notice, or past that notice's deadline."""
    if not found:
        verdict = _own_verdict(pod, now)
        if terminated_by_us:
            return replace(verdict, reason="being deleted by spot-pipelines")
        return verdict
    notice_at = min((d.at for d in found if d.at is not None), default=now)
    deadline = _deadline(pod, found, notice_at, margin)
    if now < deadline:
        return _notice(pod, found, notice_at, deadline)
    return _disrupted(pod, node, found, events, spot, completed, notice_at, now, forced=True)


def _from_kubernetes(pod: Mapping[str, Any]) -> bool:
    """A disruption Kubernetes itself recorded in the pod (not a deletion of ours)."""
    return bool(_condition_evidence(pod) or _status_evidence(pod))


def _ours(pod: Mapping[str, Any], now: float) -> PodVerdict:
    """A pod spot-pipelines deleted itself, ended: the controller knows why (a drain, a
    time limit, a stop); a step that finished first still succeeded."""
    own = _own_verdict(pod, now)
    if own.outcome == Outcome.SUCCEEDED.value:
        return own
    return replace(
        own,
        outcome=Outcome.INFRASTRUCTURE_FAILED.value,
        ours=True,
        reason="deleted by spot-pipelines",
    )


def _stopped(pod: Mapping[str, Any], found: Sequence[Disruption]) -> bool:
    return terminal(pod) or any(d.stopped for d in found)


def _deadline(
    pod: Mapping[str, Any], found: Sequence[Disruption], notice_at: float, margin: float
) -> float:
    """When a pod under notice must have ended: the notice, the grace period, a margin. A
    ``DisruptionTarget`` with no deletion yet may still be withdrawn: allow for that."""
    deletion = parse_time(_meta(pod).get("deletionTimestamp"))
    if deletion is not None:
        return max(deletion, notice_at) + margin
    grace = max([grace_seconds(pod), *(d.grace_seconds or 0 for d in found)])
    if any(d.why.startswith("DisruptionTarget") for d in found):
        grace = max(grace, CONDITION_CLEARED_SECONDS)
    return notice_at + grace + margin


def _notice(
    pod: Mapping[str, Any], found: Sequence[Disruption], notice_at: float, deadline: float
) -> PodVerdict:
    lead = found[0]
    return PodVerdict(
        RUNNING,
        f"under notice: {lead.why}",
        disruption=lead,
        notice_at=notice_at,
        deadline=deadline,
        evidence=tuple(found),
    )


def _disrupted(
    pod: Mapping[str, Any],
    node: Any,
    found: Sequence[Disruption],
    events: Sequence[Mapping[str, Any]],
    spot: bool | None,
    completed: bool | Callable[[], bool],
    notice_at: float,
    now: float,
    *,
    forced: bool = False,
) -> PodVerdict:
    code, ended = _exit(pod, now)
    lead = _decisive(found)
    detail = "; ".join(dict.fromkeys(d.why for d in found))
    force_delete = forced and (node is None or any(d.kind == "node-gone" for d in found))

    def verdict(outcome: str, reason: str) -> PodVerdict:
        return PodVerdict(
            outcome,
            reason,
            disruption=lead,
            notice_at=notice_at,
            ended_at=ended if not forced else now,
            exit_code=code,
            forced=forced,
            force_delete=force_delete,
            evidence=tuple(found),
        )

    if forced:
        detail = f"still not ended past its notice's grace period: {detail}"
    if _completed(completed):
        return verdict(
            Outcome.SUCCEEDED.value,
            f"the step reported completion before it was disrupted ({detail})",
        )
    outcome, why = _disruption_outcome(found, event_evidence(events), spot)
    return verdict(outcome.value, f"{why}: {detail}"[:500])


def _decisive(found: Sequence[Disruption]) -> Disruption:
    order = (
        "node-pressure",
        "own-limit",
        "preemption",
        "node-shutdown",
        "node-gone",
        "taint-eviction",
        "eviction",
        "node-lost",
        "node-notice",
        "disruption",
        "deleted",
    )
    return min(found, key=lambda d: order.index(d.kind) if d.kind in order else len(order))


def _disruption_outcome(
    found: Sequence[Disruption], events: Sequence[Disruption], spot: bool | None
) -> tuple[Outcome, str]:
    kinds = {d.kind for d in found}
    if "node-pressure" in kinds:
        return Outcome.INFRASTRUCTURE_FAILED, "node-pressure eviction (the node's, not the step's)"
    if "own-limit" in kinds:
        return Outcome.USER_FAILED, "evicted for exceeding the pod's own storage limit"
    evidence = [*found, *events]
    if any(d.voluntary is False for d in evidence):
        return Outcome.PREEMPTED, "involuntary disruption"
    if any(d.voluntary is True for d in evidence):
        return Outcome.DISRUPTED, "voluntary disruption (" + next(
            d.why for d in evidence if d.voluntary is True
        ) + ")"
    if kinds == {"deleted"}:
        return Outcome.INFRASTRUCTURE_FAILED, "deleted outside spot-pipelines, with no reason"
    if spot:
        return Outcome.PREEMPTED, "disruption of a spot node (a spot handler drains this way)"
    return Outcome.DISRUPTED, "voluntary disruption (the Eviction API, on a node not on spot)"


def _completed(completed: bool | Callable[[], bool]) -> bool:
    return bool(completed() if callable(completed) else completed)


def _exit(pod: Mapping[str, Any], now: float) -> tuple[int | None, float]:
    """(exit code, ended at) of the step; a code the kubelet made up is no code."""
    terminated = _terminated(step_status(pod)) or {}
    ended = parse_time(terminated.get("finishedAt")) or now
    code = terminated.get("exitCode")
    if terminated.get("reason") == "ContainerStatusUnknown" or not isinstance(code, int):
        return None, ended
    return code, ended


def _own_verdict(pod: Mapping[str, Any], now: float) -> PodVerdict:
    """No disruption in sight: the pod's own progress, or its step's own end."""
    if not terminal(pod):
        return _progress(pod)
    status = step_status(pod)
    terminated = _terminated(status) or {}
    code, ended = _exit(pod, now)
    reason = terminated.get("reason") or ""
    message = (terminated.get("message") or _status(pod).get("message") or "").strip()
    last = clip(message.splitlines()[-1], 300) if message else ""
    if reason == "OOMKilled":
        return PodVerdict(
            Outcome.USER_FAILED.value,
            "OOMKilled: the step ran out of memory "
            "(raise its memory limit)" + (f"; {last}" if last else ""),
            exit_code=code,
            ended_at=ended,
        )
    if _status(pod).get("reason") == "DeadlineExceeded":
        return PodVerdict(
            Outcome.USER_FAILED.value,
            "DeadlineExceeded: the pod ran past its "
            f"own activeDeadlineSeconds; {_status(pod).get('message', '')}",
            exit_code=code,
            ended_at=ended,
        )
    if code == 0:
        return PodVerdict(Outcome.SUCCEEDED.value, "the step exited 0", exit_code=0, ended_at=ended)
    if code is not None:
        return PodVerdict(
            Outcome.USER_FAILED.value,
            f"the step exited {code}"
            + (f" ({reason})" if reason and reason != "Error" else "")
            + (f": {last}" if last else ""),
            exit_code=code,
            ended_at=ended,
        )
    said = " ".join(filter(None, (_status(pod).get("reason"), _status(pod).get("message"), reason)))
    return PodVerdict(
        Outcome.INFRASTRUCTURE_FAILED.value,
        f"the pod failed without a verdict of its step ({said or 'no reason given'})"[:500],
        ended_at=ended,
    )


def _progress(pod: Mapping[str, Any]) -> PodVerdict:
    scheduled = next(iter(conditions(pod, "PodScheduled")), {})
    if scheduled.get("status") == "False":
        return PodVerdict(
            PENDING,
            f"not scheduled ({scheduled.get('reason', '')}: {scheduled.get('message', '')})",
        )
    state = step_status(pod).get("state") or {}
    if _status(pod).get("phase") == "Pending" or "waiting" in state and not state.get("running"):
        waiting = state.get("waiting") or {}
        return PodVerdict(
            PENDING,
            "waiting to start"
            + (
                f" ({waiting.get('reason')}: {waiting.get('message', '')})".rstrip(": )") + ")"
                if waiting.get("reason")
                else ""
            ),
        )
    return PodVerdict(RUNNING, "running")


def _gone(
    node: Any,
    earlier: Sequence[Disruption],
    events: Sequence[Any],
    spot: bool | None,
    completed: bool | Callable[[], bool],
    terminated_by_us: bool,
    now: float,
) -> PodVerdict:
    """The pod object is gone (404): by a notice seen earlier or its node, else a loss."""
    if terminated_by_us and not earlier:
        return PodVerdict(
            Outcome.INFRASTRUCTURE_FAILED.value,
            "deleted by spot-pipelines",
            ended_at=now,
            ours=True,
        )
    found = list(earlier)
    if isinstance(node, Mapping):
        found += [
            d
            for d in _node_evidence({"spec": {"nodeName": _meta(node).get("name")}}, node)
            if d.kind == "node-notice"
        ]
    if spot is None and isinstance(node, Mapping):
        spot = spot_of({}, node)
    if not found:
        if _completed(completed):
            return PodVerdict(
                Outcome.SUCCEEDED.value,
                "the pod is gone, but the step reported completion",
                ended_at=now,
            )
        return PodVerdict(
            Outcome.INFRASTRUCTURE_FAILED.value,
            "the pod vanished (404) "
            "without a notice: an infrastructure loss, not the step's failure",
            ended_at=now,
        )
    notice_at = min((d.at for d in found if d.at is not None), default=now)
    verdict = _disrupted({}, node, found, events, spot, completed, notice_at, now)
    return replace(verdict, reason=f"the pod is gone after a notice; {verdict.reason}"[:500])
