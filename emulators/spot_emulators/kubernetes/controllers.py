"""The control plane's loops in one thread: scheduler, kubelet sync, taint manager,
pod GC, node replacement and namespace cleanup.

Each pass reads the store, acts, and sleeps until the next change (at most 0.2 s), so
every reaction is bounded and nothing busy-waits.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .errors import ApiError
from .scheduler import (
    TERMINAL,
    UNSCHEDULABLE_TAINT,
    place,
    preempt,
    priority,
    tolerates,
    untolerated_taint,
)
from .timefmt import rfc3339

Cluster = Any  # a KubeCluster (cluster.py imports this module, so not imported here)

logger = logging.getLogger(__name__)
TAINT_MANAGER_MESSAGE = "Taint manager: deleting due to NoExecute taint"
POD_GC_MESSAGE = "PodGC: node no longer exists"
PREEMPTION_MESSAGE = "default-scheduler: preempting to accommodate a higher priority pod"
NAMESPACED_LEFTOVERS = (
    "events",
    "secrets",
    "configmaps",
    "serviceaccounts",
    "poddisruptionbudgets",
)
MIN_KILL_GRACE = 2.0  # the kubelet's minimumGracePeriodInSeconds
RETRY_UNSCHEDULABLE = 10.0  # seconds between FailedScheduling reports of one message


class ControlLoop:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.store = cluster.store
        self._thread = threading.Thread(target=self._run, daemon=True, name="kube-control")
        self._replacements: list[tuple[float, str]] = []
        self._unschedulable: dict[str, tuple[str, float]] = {}
        self._orphaned: dict[str, float] = {}
        self._known_nodes: dict[str, dict[str, Any]] = {}
        self._events_checked = time.monotonic()
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def replace_later(self, pool: str, delay: float) -> None:
        with self._lock:
            self._replacements.append((time.monotonic() + delay, pool))

    def _run(self) -> None:
        while not self.cluster.stopping.is_set():
            seen = self.store.resource_version
            try:
                self.reconcile()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad pass
                logger.exception("kubernetes emulator control loop pass failed")
            self.store.wait(seen, 0.2)

    def reconcile(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self.store.all("nodes")}
        self._notice_node_changes(nodes)
        self._taint_cordoned(nodes)
        pods = list(self.store.all("pods"))
        self._schedule(nodes, pods)
        pods = list(self.store.all("pods"))
        self._sync_kubelets(nodes, pods)
        self._taint_manager(nodes, pods)
        self._pod_gc(nodes, pods)
        self._replace_nodes()
        self._finish_namespaces(pods)
        self._expire_events()

    # -- scheduler -------------------------------------------------------------------------
    def _schedule(self, nodes: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        pending = sorted(
            (
                p
                for p in pods
                if not p["spec"].get("nodeName")
                and not p["metadata"].get("deletionTimestamp")
                and p["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
            ),
            key=lambda p: (-priority(p), p["metadata"]["creationTimestamp"]),
        )
        live = [n for n in nodes.values() if not n["metadata"].get("deletionTimestamp")]
        for pod in pending:
            placement = place(pod, live, pods)
            meta = pod["metadata"]
            if placement.node is not None:
                try:
                    self.cluster.bind(meta["namespace"], meta["name"], placement.node)
                except ApiError:
                    continue
                self._unschedulable.pop(meta["uid"], None)
                pods = list(self.store.all("pods"))
                continue
            self._report_unschedulable(pod, placement.message)
            self._preempt(pod, live, pods)

    def _preempt(
        self, pod: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
    ) -> None:
        """Evict lower-priority pods for ``pod`` (DisruptionTarget PreemptionByScheduler)
        and nominate the node; nothing more while earlier victims are still going."""
        nominated = pod["status"].get("nominatedNodeName")
        if nominated and any(
            p["spec"].get("nodeName") == nominated and p["metadata"].get("deletionTimestamp")
            for p in pods
        ):
            return
        choice = preempt(pod, nodes, pods)
        if choice is None:
            return
        meta = pod["metadata"]
        for victim in choice.victims:
            vmeta = victim["metadata"]
            try:
                self.cluster.mark_disruption(
                    vmeta["namespace"], vmeta["name"], "PreemptionByScheduler", PREEMPTION_MESSAGE
                )
                self.cluster.event(
                    victim,
                    "Normal",
                    "Preempted",
                    f"Preempted by pod {meta['uid']} on node {choice.node}",
                    component="default-scheduler",
                )
                self.cluster.delete_pod(vmeta["namespace"], vmeta["name"])
            except ApiError:
                continue
        try:
            self.store.update(
                "pods",
                meta["namespace"],
                meta["name"],
                lambda p: p["status"].update(nominatedNodeName=choice.node),
            )
        except ApiError:
            pass

    def _report_unschedulable(self, pod: dict[str, Any], message: str) -> None:
        from . import pod_status as ps

        uid = pod["metadata"]["uid"]
        last = self._unschedulable.get(uid)
        now = time.monotonic()
        if last is not None and last[0] == message and now - last[1] < RETRY_UNSCHEDULABLE:
            return
        self._unschedulable[uid] = (message, now)
        stamp = self.cluster.clock()
        try:
            pod = self.store.update(
                "pods",
                pod["metadata"]["namespace"],
                pod["metadata"]["name"],
                lambda p: ps.set_condition(
                    p["status"], "PodScheduled", "False", stamp, "Unschedulable", message
                ),
            )
        except ApiError:
            return
        self.cluster.event(
            pod, "Warning", "FailedScheduling", message, component="default-scheduler"
        )

    # -- kubelets --------------------------------------------------------------------------
    def _sync_kubelets(self, nodes: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        present = set()
        for pod in pods:
            meta, node = pod["metadata"], pod["spec"].get("nodeName")
            present.add(meta["uid"])
            if not node or node not in nodes:
                continue
            worker = self.cluster.workers.get(meta["uid"])
            if meta.get("deletionTimestamp"):
                if worker is None:
                    self.cluster.finish_deletion(meta["namespace"], meta["name"], meta["uid"])
                else:  # a second, shorter delete shortens the grace of the first
                    worker.request_termination(float(meta.get("deletionGracePeriodSeconds", 0)))
            elif worker is None and pod["status"].get("phase") not in TERMINAL:
                self.cluster.start_worker(pod)
        for uid, worker in list(self.cluster.workers.items()):
            if uid in present:
                continue
            if not worker.done.is_set():
                # Force-deleted (or garbage-collected): the kubelet still stops the
                # containers with its minimum grace before forgetting them.
                worker.request_termination(MIN_KILL_GRACE, delete=False)
            else:
                self.cluster.workers.pop(uid, None)

    # -- taint manager ---------------------------------------------------------------------
    def _taint_manager(self, nodes: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        now = self.cluster.clock()
        for pod in pods:
            node = nodes.get(pod["spec"].get("nodeName") or "")
            if (
                node is None
                or pod["metadata"].get("deletionTimestamp")
                or pod["status"].get("phase") in TERMINAL
            ):
                continue
            if not self._evicts(pod, node, now):
                continue
            meta = pod["metadata"]
            try:
                self.cluster.mark_disruption(
                    meta["namespace"], meta["name"], "DeletionByTaintManager", TAINT_MANAGER_MESSAGE
                )
                self.cluster.event(
                    pod,
                    "Normal",
                    "TaintManagerEviction",
                    f"Marking for deletion Pod {meta['namespace']}/{meta['name']}",
                    component="taint-eviction-controller",
                )
                self.cluster.delete_pod(meta["namespace"], meta["name"])
            except ApiError:
                continue

    def _evicts(self, pod: dict[str, Any], node: dict[str, Any], now: float) -> bool:
        """An untolerated NoExecute taint evicts at once; one tolerated only for
        ``tolerationSeconds`` evicts when that has passed since the taint's timeAdded."""
        if untolerated_taint(pod, node, ("NoExecute",)) is not None:
            return True
        tolerations = pod["spec"].get("tolerations") or []
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") != "NoExecute":
                continue
            matching = [t for t in tolerations if tolerates([t], taint)]
            if not matching or any(t.get("tolerationSeconds") is None for t in matching):
                continue
            seconds = min(max(0, int(t["tolerationSeconds"])) for t in matching)
            added = _parse_time(taint.get("timeAdded")) or now
            if now >= added + self.cluster.scaled(seconds):
                return True
        return False

    # -- pod GC ----------------------------------------------------------------------------
    def _pod_gc(self, nodes: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        for pod in pods:
            meta, node = pod["metadata"], pod["spec"].get("nodeName")
            if not node or node in nodes:
                self._orphaned.pop(meta["uid"], None)
                continue
            first = self._orphaned.setdefault(meta["uid"], now)
            if now - first < self.cluster.scaled(self.cluster.timings.pod_gc_seconds):
                continue
            try:
                if pod["status"].get("phase") not in TERMINAL:
                    self.cluster.mark_disruption(
                        meta["namespace"], meta["name"], "DeletionByPodGC", POD_GC_MESSAGE, "Failed"
                    )
                self.store.delete("pods", meta["namespace"], meta["name"])
            except ApiError:
                pass
            self._orphaned.pop(meta["uid"], None)

    # -- nodes and namespaces ----------------------------------------------------------------
    def _notice_node_changes(self, nodes: dict[str, Any]) -> None:
        for name, node in list(self._known_nodes.items()):
            if name not in nodes:
                del self._known_nodes[name]
                self.cluster.node_deleted(node)
        self._known_nodes.update(nodes)

    def _taint_cordoned(self, nodes: dict[str, Any]) -> None:
        """The node lifecycle controller's TaintNodesByCondition for a cordon: the
        ``node.kubernetes.io/unschedulable:NoSchedule`` taint follows spec.unschedulable."""
        stamp = rfc3339(self.cluster.clock())
        for name, node in nodes.items():
            taints = node["spec"].get("taints") or []
            has = any(t.get("key") == UNSCHEDULABLE_TAINT["key"] for t in taints)
            if bool(node["spec"].get("unschedulable")) == has:
                continue

            def mutate(obj: dict[str, Any]) -> None:
                kept = [
                    t
                    for t in obj["spec"].get("taints") or []
                    if t.get("key") != UNSCHEDULABLE_TAINT["key"]
                ]
                if obj["spec"].get("unschedulable"):
                    kept.append({**UNSCHEDULABLE_TAINT, "timeAdded": stamp})
                obj["spec"]["taints"] = kept

            try:
                nodes[name] = self.store.update("nodes", "", name, mutate)
            except ApiError:
                pass

    def _replace_nodes(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [pool for at, pool in self._replacements if at <= now]
            self._replacements = [(at, pool) for at, pool in self._replacements if at > now]
        for pool in due:
            if pool in self.cluster.pools and not self.cluster.stopping.is_set():
                self.cluster.add_node(pool)

    def _expire_events(self) -> None:
        """Events older than the event TTL go, as the API server's do (checked every 10 s,
        or every TTL if shorter)."""
        now = time.monotonic()
        ttl = self.cluster.scaled(self.cluster.timings.event_ttl_seconds)
        if now - self._events_checked < min(10.0, ttl):
            return
        self._events_checked = now
        cutoff = rfc3339(self.cluster.clock() - ttl)
        for event in self.store.all("events"):
            if (event.get("lastTimestamp") or "") < cutoff:
                try:
                    self.store.delete(
                        "events", event["metadata"]["namespace"], event["metadata"]["name"]
                    )
                except ApiError:
                    pass

    def _finish_namespaces(self, pods: list[dict[str, Any]]) -> None:
        """A terminating namespace goes once its pods are gone, with whatever was still
        created in it meanwhile (the kubelets' last events)."""
        for namespace in self.store.all("namespaces"):
            name = namespace["metadata"]["name"]
            if not namespace["metadata"].get("deletionTimestamp") or any(
                p["metadata"]["namespace"] == name for p in pods
            ):
                continue
            for resource in NAMESPACED_LEFTOVERS:
                for obj in self.store.list(resource, name)[0]:
                    try:
                        self.store.delete(resource, name, obj["metadata"]["name"])
                    except ApiError:
                        pass
            try:
                self.store.delete("namespaces", "", name)
            except ApiError:
                pass


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    import calendar

    try:
        return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None
