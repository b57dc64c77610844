"""How each flavour takes a spot node back, step by step, as its documentation says.

* karpenter: taint ``karpenter.sh/disrupted:NoSchedule``, evict every pod through the
  Eviction API (DisruptionTarget ``EvictionByEvictionAPI``) except those tolerating the
  taint, which go down with the instance (pod GC: ``DeletionByPodGC``), delete the node.
* eks (managed node group rebalance): cordon (``spec.unschedulable`` and the
  ``node.kubernetes.io/unschedulable:NoSchedule`` taint), drain through evictions, delete.
* gke (graceful node shutdown): taint ``cloud.google.com/impending-node-termination``;
  the kubelet marks each pod Failed, reason ``Terminated``, condition DisruptionTarget
  ``TerminationByKubelet``, SIGTERM then SIGKILL within the shutdown grace; node deleted;
  pod GC removes the failed pods.
* aks: the VM is evicted with its kubelet (the node turns Ready=Unknown and gets the
  unreachable taints; processes get the OS shutdown's SIGTERM, then SIGKILL; no pod
  status is reported), the node is deleted, pod GC marks the pods
  (DisruptionTarget ``DeletionByPodGC``, phase Failed) and removes them.

A node whose pool has a metadata server first serves the cloud's notice there (IMDS spot
interruption / rebalance, GCE ``preempted``, Azure ``Preempt`` scheduled event).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import pod_status as ps
from .errors import ApiError
from .pools import FLAVOURS
from .scheduler import TERMINAL, priority, tolerates
from .timefmt import rfc3339

Cluster = Any   # a KubeCluster (cluster.py imports this module, so not imported here)

logger = logging.getLogger(__name__)
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
KARPENTER_TAINT = "karpenter.sh/disrupted"
GKE_TAINT = "cloud.google.com/impending-node-termination"
CORDON_TAINT = "node.kubernetes.io/unschedulable"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
CRITICAL_PRIORITY = 2000000000          # system-cluster-critical and above


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
        return {"node": self.node, "flavour": self.flavour, "done": self.done.is_set(),
                "steps": list(self.steps), "error": self.error}


def start_reclaim(cluster: Cluster, node: str, flavour: str) -> Reclaim:
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
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
def add_taint(cluster: Cluster, node: str, key: str, effect: str = "NoSchedule",
              value: str | None = None, cordon: bool = False) -> None:
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
    return [p for p in cluster.store.all("pods") if p["spec"].get("nodeName") == node
            and p["status"].get("phase") not in TERMINAL]


def _notice(cluster: Cluster, reclaim: Reclaim, rebalance: bool = False) -> None:
    emulator = cluster.metadata.get(reclaim.node)
    if emulator is None:
        return
    if rebalance:
        emulator.schedule_rebalance()
    notice = 30.0 if reclaim.flavour == "aks" else 120.0
    emulator.schedule_interruption(notice_seconds=notice)
    reclaim.steps.append("metadata notice served")


def _drain(cluster: Cluster, reclaim: Reclaim, skip_tolerating: dict | None = None) -> None:
    """Evict every pod of the node (retrying those a PDB protects) until none is left;
    pods that tolerate ``skip_tolerating`` are left to go down with the machine."""
    deadline = time.monotonic() + cluster.scaled(cluster.timings.max_drain_seconds)
    while time.monotonic() < deadline and not cluster.stopping.is_set():
        pods = [p for p in _pods_on(cluster, reclaim.node) if skip_tolerating is None
                or not tolerates(p["spec"].get("tolerations") or [], skip_tolerating)]
        if not pods:
            return
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
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


def _node_event(cluster: Cluster, node: str, reason: str, message: str,
                component: str) -> None:
    obj = cluster.store.find("nodes", "", node)
    if obj is not None:
        cluster.event(obj, "Normal", reason, message, host=node, component=component)


# -- the flavours ------------------------------------------------------------------------------
def karpenter(cluster: Cluster, reclaim: Reclaim) -> None:
    _notice(cluster, reclaim)
    _node_event(cluster, reclaim.node, "SpotInterrupted", "Spot interruption warning was "
                "triggered", "karpenter")
    add_taint(cluster, reclaim.node, KARPENTER_TAINT)
    reclaim.steps.append(f"tainted {KARPENTER_TAINT}:NoSchedule")
    _node_event(cluster, reclaim.node, "DisruptionTerminating", "Disrupting Node: "
                "Interruption/SpotInterruption", "karpenter")
    # Karpenter's termination controller leaves pods that tolerate its taint (and static
    # and finished pods) on the node: they go down with the instance.
    _drain(cluster, reclaim, skip_tolerating={"key": KARPENTER_TAINT, "effect": "NoSchedule"})
    _lose_machine(cluster, reclaim)
    _delete_node(cluster, reclaim)


def eks(cluster: Cluster, reclaim: Reclaim) -> None:
    _notice(cluster, reclaim, rebalance=True)
    add_taint(cluster, reclaim.node, CORDON_TAINT, cordon=True)
    reclaim.steps.append("cordoned")
    _node_event(cluster, reclaim.node, "NodeNotSchedulable", f"Node {reclaim.node} status "
                "is now: NodeNotSchedulable", "kubelet")
    _drain(cluster, reclaim)
    _delete_node(cluster, reclaim)


def gke(cluster: Cluster, reclaim: Reclaim) -> None:
    _notice(cluster, reclaim)
    add_taint(cluster, reclaim.node, GKE_TAINT)
    reclaim.steps.append(f"tainted {GKE_TAINT}:NoSchedule")
    _node_event(cluster, reclaim.node, "Shutdown", "Shutdown manager detected shutdown "
                "event", "kubelet")
    _mark_node_not_ready(cluster, reclaim.node, "node is shutting down")
    timings = cluster.timings
    critical = timings.gke_shutdown_critical_seconds
    regular = max(0.0, timings.gke_shutdown_grace_seconds - critical)
    pods = _pods_on(cluster, reclaim.node)
    # The kubelet's shutdown manager: regular pods first, then critical ones, each group
    # within its share of shutdownGracePeriod.
    for group, budget in (([p for p in pods if priority(p) < CRITICAL_PRIORITY], regular),
                          ([p for p in pods if priority(p) >= CRITICAL_PRIORITY], critical)):
        _shut_down(cluster, reclaim, group, budget)
    _delete_node(cluster, reclaim)


def _shut_down(cluster: Cluster, reclaim: Reclaim, pods: list[dict[str, Any]],
               budget: float) -> None:
    """Mark each pod Failed / Terminated (DisruptionTarget TerminationByKubelet), stop its
    containers within ``budget``, and wait (bounded) until they have stopped."""
    workers = []
    for pod in pods:
        meta = pod["metadata"]
        grace = min(float(pod["spec"].get("terminationGracePeriodSeconds", 30)), budget)
        try:
            cluster.mark_disruption(meta["namespace"], meta["name"], "TerminationByKubelet",
                                    SHUTDOWN_MESSAGE, "Failed", "Terminated")
        except ApiError:
            continue
        worker = cluster.workers.get(meta["uid"])
        if worker is not None:
            worker.request_termination(grace, delete=False, final_phase="Failed")
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
    _mark_node_not_ready(cluster, reclaim.node, "Kubelet stopped posting node status.",
                         "Unknown", "NodeStatusUnknown")
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
    threads = [threading.Thread(target=w.machine_lost, args=(grace,), daemon=True)
               for w in workers if not w.done.is_set()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(cluster.scaled(grace) + 15)
    if threads:
        reclaim.steps.append(f"machine shut down under {len(threads)} pod(s)")


def _mark_node_not_ready(cluster: Cluster, node: str, message: str, status: str = "False",
                         reason: str = "KubeletNotReady") -> None:
    now = cluster.clock()

    def mutate(obj: dict[str, Any]) -> None:
        ps.set_condition(obj["status"], "Ready", status, now, reason, message)
        for condition in obj["status"]["conditions"]:
            if "lastProbeTime" in condition:
                condition["lastHeartbeatTime"] = condition.pop("lastProbeTime") or rfc3339(now)
    cluster.store.update("nodes", "", node, mutate)


SCRIPTS: dict[str, Callable[[Cluster, Reclaim], None]] = {
    "karpenter": karpenter, "eks": eks, "gke": gke, "aks": aks}
