"""How each flavour takes a node back, step by step, as its documentation says.

Spot reclaims (involuntary: the cloud takes the machine):

* karpenter (interruption): events ``SpotInterrupted`` and ``TerminatingOnInterruption``,
  taint ``karpenter.sh/disrupted:NoSchedule``, evict every pod through the Eviction API
  (DisruptionTarget ``EvictionByEvictionAPI``) except those tolerating the taint and those
  annotated ``karpenter.sh/do-not-disrupt: "true"`` (Karpenter v1 no longer evicts them:
  they go down with the instance, and pod GC marks them ``DeletionByPodGC``), delete the
  node.
* eks (managed node group rebalance): cordon (``spec.unschedulable`` and the
  ``node.kubernetes.io/unschedulable:NoSchedule`` taint), drain through evictions, delete.
* gke (graceful node shutdown): taint ``cloud.google.com/impending-node-termination``; the
  kubelet adds DisruptionTarget ``TerminationByKubelet`` ("Pod was terminated in response to
  imminent node shutdown.") when the shutdown starts, sends SIGTERM then SIGKILL within the
  shutdown grace, and once the containers stopped writes the phase (``Succeeded`` for a
  container that exited 0, else ``Failed``), reason ``Terminated`` and that message; node
  deleted; pod GC removes the pods.
* aks: the VM is evicted with its kubelet (the node turns Ready=Unknown and gets the
  unreachable taints; processes get the OS shutdown's SIGTERM, then SIGKILL; no pod
  status is reported), the node is deleted, pod GC marks the pods
  (DisruptionTarget ``DeletionByPodGC``, phase Failed) and removes them.

Voluntary disruptions (the cluster's own choice):

* karpenter-consolidation: blocked, with a ``DisruptionBlocked`` event, by a pod annotated
  ``karpenter.sh/do-not-disrupt: "true"``; else the taint, node event
  ``DisruptionTerminating`` "Disrupting Node: Underutilized/Delete", a pod event
  ``Evicted`` "Evicted pod: Underutilized" and an eviction per pod, the node deleted.
* autoscaler-scale-down (cluster-autoscaler): blocked by a pod annotated
  ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"``; else taint
  ``ToBeDeletedByClusterAutoscaler`` (the Unix time), node event ``ScaleDown`` "marked the
  node as toBeDeleted/unschedulable", per pod the event ``ScaleDown`` "deleting pod for node
  scale down" and an eviction, the node deleted.
* drain (``kubectl drain`` for an upgrade): cordon, evictions (budgets respected, no
  annotation blocks it), the node deleted (the upgrade replaces it).

A node whose pool has a metadata server first serves the cloud's notice there (IMDS spot
interruption / rebalance, GCE ``preempted``, Azure ``Preempt`` scheduled event).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import pod_status as ps
from .errors import ApiError
from .scheduler import TERMINAL, priority, tolerates
from .timefmt import rfc3339

Cluster = Any  # a KubeCluster (cluster.py imports this module, so not imported here)

logger = logging.getLogger(__name__)
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
KARPENTER_TAINT = "karpenter.sh/disrupted"
GKE_TAINT = "cloud.google.com/impending-node-termination"
CORDON_TAINT = "node.kubernetes.io/unschedulable"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
CRITICAL_PRIORITY = 2000000000  # system-cluster-critical and above
AUTOSCALER_TAINT = "ToBeDeletedByClusterAutoscaler"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"


@dataclass
class Reclaim:
    """One reclaim in progress; ``steps`` records what was done, for tests and demos."""

    node: str
    flavour: str
    done: threading.Event = field(default_factory=threading.Event)
    steps: list[str] = field(default_factory=list)
    error: str | None = None
    thread: threading.Thread | None = None

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "flavour": self.flavour,
            "done": self.done.is_set(),
            "steps": list(self.steps),
            "error": self.error,
        }


def start_reclaim(cluster: Cluster, node: str, flavour: str) -> Reclaim:
    if flavour not in SCRIPTS:
        raise ValueError(f"flavour must be one of {sorted(SCRIPTS)}, got {flavour!r}")
    reclaim = Reclaim(node, flavour)
    script = SCRIPTS[flavour]

    def run() -> None:
        try:
            script(cluster, reclaim)
        except ApiError as exc:
            reclaim.error = exc.message
        except Exception as exc:  # noqa: BLE001 - reported on the handle, not lost
            logger.exception("reclaim of %s (%s) failed", node, flavour)
            reclaim.error = str(exc)
        finally:
            reclaim.done.set()

    reclaim.thread = threading.Thread(target=run, daemon=True, name=f"reclaim-{node}")
    reclaim.thread.start()
    return reclaim


# -- steps shared by the scripts -------------------------------------------------------------
def add_taint(
    cluster: Cluster,
    node: str,
    key: str,
    effect: str = "NoSchedule",
    value: str | None = None,
    cordon: bool = False,
) -> None:
    now = rfc3339(cluster.clock())

    def mutate(obj: dict[str, Any]) -> None:
        taints = obj["spec"].setdefault("taints", [])
        if not any(t.get("key") == key and t.get("effect") == effect for t in taints):
            taint = {"key": key, "effect": effect, "timeAdded": now}
            if value is not None:
                taint["value"] = value
            taints.append(taint)
        if cordon:
            obj["spec"]["unschedulable"] = True

    cluster.store.update("nodes", "", node, mutate)


def _pods_on(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.store.all("pods")
        if p["spec"].get("nodeName") == node and p["status"].get("phase") not in TERMINAL
    ]


def _notice(cluster: Cluster, reclaim: Reclaim, rebalance: bool = False) -> None:
    emulator = cluster.metadata.get(reclaim.node)
    if emulator is None:
        return
    if rebalance:
        emulator.schedule_rebalance()
    notice = 30.0 if reclaim.flavour == "aks" else 120.0
    emulator.schedule_interruption(notice_seconds=notice)
    reclaim.steps.append("metadata notice served")


def _drain(
    cluster: Cluster,
    reclaim: Reclaim,
    skip: Callable[[dict[str, Any]], bool] = lambda pod: False,
    before_each: Callable[[dict[str, Any]], None] = lambda pod: None,
) -> None:
    """Evict every pod of the node (retrying those a PDB protects) until none is left;
    pods ``skip`` names are left to go down with the machine; ``before_each`` records a
    controller's event for a pod before its first eviction."""
    deadline = time.monotonic() + cluster.scaled(cluster.timings.max_drain_seconds)
    announced: set[str] = set()
    while time.monotonic() < deadline and not cluster.stopping.is_set():
        pods = [p for p in _pods_on(cluster, reclaim.node) if not skip(p)]
        if not pods:
            return
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            if meta["uid"] not in announced:
                announced.add(meta["uid"])
                before_each(pod)
            try:
                cluster.api.evict(meta["namespace"], meta["name"], {})
                reclaim.steps.append(f"evicted {meta['namespace']}/{meta['name']}")
            except ApiError as exc:
                if exc.code != 429 and exc.code != 404:
                    raise
            cluster.stopping.wait(cluster.scaled(cluster.timings.drain_step_seconds))
        cluster.stopping.wait(0.05)
    reclaim.steps.append("drain bound reached")


def _delete_node(cluster: Cluster, reclaim: Reclaim) -> None:
    cluster.stopping.wait(cluster.scaled(cluster.timings.node_gone_seconds))
    try:
        cluster.store.delete("nodes", "", reclaim.node)
        reclaim.steps.append("node deleted")
    except ApiError:
        reclaim.steps.append("node already gone")
    cluster.wake()


def _node_event(
    cluster: Cluster, node: str, reason: str, message: str, component: str, type_: str = "Normal"
) -> None:
    obj = cluster.store.find("nodes", "", node)
    if obj is not None:
        cluster.event(obj, type_, reason, message, host=node, component=component)


def _annotated(pod: dict[str, Any], key: str, value: str) -> bool:
    return ((pod["metadata"].get("annotations") or {}).get(key) or "").lower() == value


# -- the flavours ------------------------------------------------------------------------------
def karpenter(cluster: Cluster, reclaim: Reclaim) -> None:
    _notice(cluster, reclaim)
    for type_, reason, message in (
        ("Warning", "SpotInterrupted", "Spot interruption warning was triggered"),
        ("Warning", "TerminatingOnInterruption", "Interruption triggered termination for the Node"),
    ):
        _node_event(cluster, reclaim.node, reason, message, "karpenter", type_)
    for pod in _pods_on(cluster, reclaim.node):
        cluster.event(
            pod,
            "Warning",
            "SpotInterrupted",
            "Spot interruption warning was triggered",
            component="karpenter",
        )
    add_taint(cluster, reclaim.node, KARPENTER_TAINT)
    reclaim.steps.append(f"tainted {KARPENTER_TAINT}:NoSchedule")
    # Karpenter's termination controller leaves pods that tolerate its taint, and (v1)
    # those annotated do-not-disrupt, on the node: they go down with the instance.
    taint = {"key": KARPENTER_TAINT, "effect": "NoSchedule"}
    _drain(
        cluster,
        reclaim,
        skip=lambda pod: (
            tolerates(pod["spec"].get("tolerations") or [], taint)
            or _annotated(pod, DO_NOT_DISRUPT, "true")
        ),
    )
    _lose_machine(cluster, reclaim)
    _delete_node(cluster, reclaim)


def karpenter_consolidation(cluster: Cluster, reclaim: Reclaim) -> None:
    """Karpenter removes an underutilized node, unless a pod says do-not-disrupt."""
    blocked = [p for p in _pods_on(cluster, reclaim.node) if _annotated(p, DO_NOT_DISRUPT, "true")]
    if blocked:
        meta = blocked[0]["metadata"]
        _node_event(
            cluster,
            reclaim.node,
            "DisruptionBlocked",
            f"Cannot disrupt Node: Pod "
            f'"{meta["namespace"]}/{meta["name"]}" has "{DO_NOT_DISRUPT}" annotation',
            "karpenter",
        )
        reclaim.steps.append(f"blocked by {meta['namespace']}/{meta['name']} ({DO_NOT_DISRUPT})")
        return
    add_taint(cluster, reclaim.node, KARPENTER_TAINT)
    reclaim.steps.append(f"tainted {KARPENTER_TAINT}:NoSchedule")
    _node_event(
        cluster,
        reclaim.node,
        "DisruptionTerminating",
        "Disrupting Node: Underutilized/Delete",
        "karpenter",
    )
    _drain(
        cluster,
        reclaim,
        before_each=lambda pod: cluster.event(
            pod, "Normal", "Evicted", "Evicted pod: Underutilized", component="karpenter"
        ),
    )
    _delete_node(cluster, reclaim)


def autoscaler_scale_down(cluster: Cluster, reclaim: Reclaim) -> None:
    """The cluster-autoscaler removes an unneeded node, unless a pod is not safe to evict."""
    blocked = [p for p in _pods_on(cluster, reclaim.node) if _annotated(p, SAFE_TO_EVICT, "false")]
    if blocked:
        meta = blocked[0]["metadata"]
        reclaim.steps.append(
            f"blocked by {meta['namespace']}/{meta['name']} ({SAFE_TO_EVICT}: false)"
        )
        return
    add_taint(cluster, reclaim.node, AUTOSCALER_TAINT, value=str(int(cluster.clock())))
    reclaim.steps.append(f"tainted {AUTOSCALER_TAINT}:NoSchedule")
    _node_event(
        cluster,
        reclaim.node,
        "ScaleDown",
        "marked the node as toBeDeleted/unschedulable",
        "cluster-autoscaler",
    )
    _drain(
        cluster,
        reclaim,
        before_each=lambda pod: cluster.event(
            pod,
            "Normal",
            "ScaleDown",
            "deleting pod for node scale down",
            component="cluster-autoscaler",
        ),
    )
    _delete_node(cluster, reclaim)


def drain(cluster: Cluster, reclaim: Reclaim) -> None:
    """``kubectl drain`` before an upgrade: cordon, evict, the node replaced."""
    add_taint(cluster, reclaim.node, CORDON_TAINT, cordon=True)
    reclaim.steps.append("cordoned")
    _node_event(
        cluster,
        reclaim.node,
        "NodeNotSchedulable",
        f"Node {reclaim.node} status is now: NodeNotSchedulable",
        "kubelet",
    )
    _drain(cluster, reclaim)
    _delete_node(cluster, reclaim)


def eks(cluster: Cluster, reclaim: Reclaim) -> None:
    _notice(cluster, reclaim, rebalance=True)
    add_taint(cluster, reclaim.node, CORDON_TAINT, cordon=True)
    reclaim.steps.append("cordoned")
    _node_event(
        cluster,
        reclaim.node,
        "NodeNotSchedulable",
        f"Node {reclaim.node} status is now: NodeNotSchedulable",
        "kubelet",
    )
    _drain(cluster, reclaim)
    _delete_node(cluster, reclaim)


def gke(cluster: Cluster, reclaim: Reclaim) -> None:
    _notice(cluster, reclaim)
    add_taint(cluster, reclaim.node, GKE_TAINT)
    reclaim.steps.append(f"tainted {GKE_TAINT}:NoSchedule")
    _node_event(
        cluster, reclaim.node, "Shutdown", "Shutdown manager detected shutdown event", "kubelet"
    )
    _mark_node_not_ready(cluster, reclaim.node, "node is shutting down")
    timings = cluster.timings
    critical = timings.gke_shutdown_critical_seconds
    regular = max(0.0, timings.gke_shutdown_grace_seconds - critical)
    pods = _pods_on(cluster, reclaim.node)
    # The kubelet's shutdown manager: regular pods first, then critical ones, each group
    # within its share of shutdownGracePeriod.
    for group, budget in (
        ([p for p in pods if priority(p) < CRITICAL_PRIORITY], regular),
        ([p for p in pods if priority(p) >= CRITICAL_PRIORITY], critical),
    ):
        _shut_down(cluster, reclaim, group, budget)
    _delete_node(cluster, reclaim)


def _shut_down(
    cluster: Cluster, reclaim: Reclaim, pods: list[dict[str, Any]], budget: float
) -> None:
    """The kubelet's shutdown manager on one priority group: DisruptionTarget
    TerminationByKubelet at once, the containers stopped within ``budget``, then the phase
    with reason Terminated and its message; waits (bounded) until they have stopped."""
    workers = []
    for pod in pods:
        meta = pod["metadata"]
        grace = min(float(pod["spec"].get("terminationGracePeriodSeconds", 30)), budget)
        try:
            cluster.mark_disruption(
                meta["namespace"], meta["name"], "TerminationByKubelet", SHUTDOWN_MESSAGE
            )
        except ApiError:
            continue
        worker = cluster.workers.get(meta["uid"])
        if worker is not None:
            worker.request_termination(
                grace, delete=False, final_reason=("Terminated", SHUTDOWN_MESSAGE)
            )
            workers.append(worker)
        reclaim.steps.append(f"shut down {meta['namespace']}/{meta['name']}")
    deadline = time.monotonic() + cluster.scaled(budget) + 10
    for worker in workers:
        worker.done.wait(max(0.0, deadline - time.monotonic()))


def aks(cluster: Cluster, reclaim: Reclaim) -> None:
    if reclaim.node in cluster.metadata:
        _notice(cluster, reclaim)
        cluster.stopping.wait(cluster.scaled(30.0))
    # The kubelet goes with the VM: the node stops reporting, and the node lifecycle
    # controller marks it (compressed here from its 40 s monitor grace period).
    _mark_node_not_ready(
        cluster,
        reclaim.node,
        "Kubelet stopped posting node status.",
        "Unknown",
        "NodeStatusUnknown",
    )
    add_taint(cluster, reclaim.node, UNREACHABLE_TAINT, "NoSchedule")
    add_taint(cluster, reclaim.node, UNREACHABLE_TAINT, "NoExecute")
    reclaim.steps.append("node unreachable")
    _lose_machine(cluster, reclaim)
    reclaim.steps.append("VM evicted")
    _delete_node(cluster, reclaim)


def _lose_machine(cluster: Cluster, reclaim: Reclaim) -> None:
    """The machine shuts down with its kubelet: every process on it gets the OS
    shutdown's SIGTERM, then SIGKILL; no pod status is reported any more."""
    grace = cluster.timings.vm_shutdown_seconds
    workers = [w for w in list(cluster.workers.values()) if w.node == reclaim.node]
    threads = [
        threading.Thread(target=w.machine_lost, args=(grace,), daemon=True)
        for w in workers
        if not w.done.is_set()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(cluster.scaled(grace) + 15)
    if threads:
        reclaim.steps.append(f"machine shut down under {len(threads)} pod(s)")


def _mark_node_not_ready(
    cluster: Cluster,
    node: str,
    message: str,
    status: str = "False",
    reason: str = "KubeletNotReady",
) -> None:
    now = cluster.clock()

    def mutate(obj: dict[str, Any]) -> None:
        ps.set_condition(obj["status"], "Ready", status, now, reason, message)
        for condition in obj["status"]["conditions"]:
            if "lastProbeTime" in condition:
                condition["lastHeartbeatTime"] = condition.pop("lastProbeTime") or rfc3339(now)

    cluster.store.update("nodes", "", node, mutate)


SCRIPTS: dict[str, Callable[[Cluster, Reclaim], None]] = {
    "karpenter": karpenter,
    "eks": eks,
    "gke": gke,
    "aks": aks,
    "karpenter-consolidation": karpenter_consolidation,
    "autoscaler-scale-down": autoscaler_scale_down,
    "drain": drain,
}
VOLUNTARY = ("karpenter-consolidation", "autoscaler-scale-down", "drain")
