"""Observing: the state of any number of leases from one pod list per namespace (by label
selector) and one node list, each pod judged by the one pod classifier
(``spot_core.policy.pod_outcomes.classify_pod``) with what only the provider knows: the
lease's market, the notices seen on earlier looks (a pod stuck under one is ended at its
grace period plus ``notice_margin_seconds``), whether the step reported completion, and,
when they can settle the cause, the pod's and its node's events."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from spot_core.adaptors import kubernetes as k8s
from spot_core.model import Lease, Outcome
from spot_core.policy import pod_outcomes as classify
from spot_core.providers import kubernetes_pods as pods
from spot_core.providers.base import LeaseStatus
from spot_core.providers.kubernetes.cluster import KubernetesCluster

log = logging.getLogger(__name__)


class KubernetesObserve(KubernetesCluster):
    """Observing: lease states from one pod list per namespace, judged by the one pod
    classifier with what only the provider knows."""

    def observe(self, leases: Sequence[Lease]) -> dict[str, LeaseStatus]:
        """One pod list per namespace (by label selector) and one node list for all."""
        if not leases:
            return {}
        found: dict[str, dict[str, Any]] = {}
        for namespace, selector in self._selectors(leases).items():
            listed = k8s.raw(
                f"list pods in {namespace}",
                self.api.list_namespaced_pod,
                namespace,
                label_selector=selector,
            )
            found.update({p["metadata"]["name"]: p for p in listed.get("items") or []})
        for name, pod in found.items():  # kept: the pod is deleted when its attempt closes
            self._annotations[name] = dict(pod["metadata"].get("annotations") or {})
        nodes = {n["metadata"]["name"]: n for n in self._list_nodes()}
        return {
            lease.lease_id: self._status(lease, found.get(lease.lease_id), nodes)
            for lease in leases
        }

    def _selectors(self, leases: Sequence[Lease]) -> dict[str, str]:
        """A label selector per namespace: the job's when every lease there is of one job;
        the managed label alone for many jobs, or for a lease known only by its name (no
        job id: Prefect's ``kill_infrastructure`` has the infrastructure id alone)."""
        by_namespace: dict[str, set[str]] = {}
        for lease in leases:
            namespace = lease.details.get("namespace", self.config.namespace)
            by_namespace.setdefault(namespace, set()).add(lease.job_id)
        return {ns: pods.job_selector(_only(jobs) or None) for ns, jobs in by_namespace.items()}

    def _status(
        self, lease: Lease, pod: dict[str, Any] | None, nodes: Mapping[str, Mapping[str, Any]]
    ) -> LeaseStatus:
        """The classifier's verdict on the lease's pod (``policy.pod_outcomes``), with what
        only the provider knows: the lease's market, the notices seen on earlier looks,
        whether the step reported completion, the pod's and its node's events."""
        if pod is not None and classify.conditions(pod, "DisruptionTarget"):
            pod = self._reread(lease)  # the condition can be withdrawn: act on a fresh copy
        node_name = (classify.node_of(pod) if pod else None) or lease.details.get("node") or ""
        node = nodes.get(node_name) if node_name else classify.UNKNOWN
        if pod is None or classify.terminal(pod):
            self._remember_report(lease)
        verdict = self._verdict(lease, pod, node, ())
        if verdict.ended and _events_may_tell(verdict):
            verdict = self._verdict(lease, pod, node, self._events(lease, node_name))
        if not verdict.ended:
            self._remember(lease, verdict.evidence)
        if verdict.forced:
            self._end_stuck(lease, verdict)
        return pods.lease_status(verdict)

    def _verdict(
        self, lease: Lease, pod: dict[str, Any] | None, node: Any, events: Sequence[dict[str, Any]]
    ) -> classify.PodVerdict:
        return classify.classify_pod(
            pod,
            node,
            events=events,
            spot=lease.pool.is_spot,
            completed=lambda: self._completed(lease),
            terminated_by_us=lease.lease_id in self._terminated,
            earlier=self._notices.get(lease.lease_id, ()),
            now=self.clock(),
            margin_seconds=self.config.notice_margin_seconds,
        )

    def _remember(self, lease: Lease, evidence: Sequence[classify.Disruption]) -> None:
        """Keep each notice a running pod showed, stamped when first seen, so a pod that
        later vanishes is judged by it and a stuck one's deadline does not move."""
        now = self.clock()
        kept = list(self._notices.get(lease.lease_id, ()))
        for found in evidence:
            if not any(k.kind == found.kind and k.why == found.why for k in kept):
                kept.append(found if found.at is not None else replace(found, at=now))
        if kept:
            self._notices[lease.lease_id] = tuple(kept)

    def _remember_report(self, lease: Lease) -> None:
        """The in-pod watcher's notice (from its status report), once, as evidence."""
        if any(k.kind == "notice" for k in self._notices.get(lease.lease_id, ())):
            return
        seen = self._reported_notice(lease)
        if seen is not None:
            self._notices[lease.lease_id] = (
                *self._notices.get(lease.lease_id, ()),
                classify.Disruption("notice", "a notice reported by the pod's watcher", at=seen),
            )

    def _end_stuck(self, lease: Lease, verdict: classify.PodVerdict) -> None:
        """A pod still there past its notice's grace period: delete it (with grace 0 when
        its node is gone, since no kubelet will confirm it) so the next attempt starts."""
        namespace = lease.details.get("namespace", self.config.namespace)
        log.warning(
            "pod %s/%s did not end after its notice (%s); deleting it%s",
            namespace,
            lease.lease_id,
            verdict.reason[:200],
            " with grace 0: its node is gone" if verdict.force_delete else "",
        )
        try:
            k8s.call(
                f"delete pod {lease.lease_id}",
                self.api.delete_namespaced_pod,
                lease.lease_id,
                namespace,
                **({"grace_period_seconds": 0} if verdict.force_delete else {}),
            )
        except k8s.NotFound:
            pass
        except Exception as exc:  # noqa: BLE001 - close() and cleanup_orphans remain
            log.warning("could not delete stuck pod %s: %s", lease.lease_id, exc)

    def _events(self, lease: Lease, node_name: str) -> list[dict[str, Any]]:
        """The pod's events and its node's (two lists); none when they cannot be read."""
        namespace = lease.details.get("namespace", self.config.namespace)
        wanted = [(namespace, f"involvedObject.name={lease.lease_id}")]
        if node_name:  # a cluster-scoped object's events live in the default namespace
            wanted.append(("default", f"involvedObject.kind=Node,involvedObject.name={node_name}"))
        found: list[dict[str, Any]] = []
        for where, selector in wanted:
            try:
                found += (
                    k8s.raw(
                        f"list events of {selector}",
                        self.api.list_namespaced_event,
                        where,
                        field_selector=selector,
                    ).get("items")
                    or []
                )
            except Exception as exc:  # noqa: BLE001 - events only sharpen the verdict
                log.info("could not read events (%s): %s", selector, exc)
        return found

    def _completed(self, lease: Lease) -> bool:
        """Whether the attempt's step reported completion: its newest checkpoint is its own
        and marked ``final``, or it left its result (``call/attempt-N/result.pkl``, the
        call exchange of spot_task and SpotTaskRunner)."""
        from spot_core.checkpoint import open_store

        uri = lease.details.get("checkpoint_uri")
        if not uri:
            return False
        try:
            store = open_store(uri)
            ref = store.latest()
            if ref is not None and ref.attempt == lease.attempt and ref.metadata.get("final"):
                return True
            return store.backend.exists(result_marker(lease.attempt))
        except Exception as exc:  # noqa: BLE001 - unknown completion is no completion
            log.warning("could not read the store of pod %s: %s", lease.lease_id, exc)
            return False

    def instance_tag(self, region: str, lease_id: str, key: str) -> str | None:
        """The annotation ``key`` of the lease's pod (the name the EC2 provider's twin
        reads tags by): as last observed, else read now; None if absent or gone. A lease
        publishes its call-exchange public key this way (``annotate_own_pod``)."""
        value = self._annotations.get(lease_id, {}).get(key)
        if value is not None:
            return value
        try:
            pod = k8s.raw(
                f"get pod {lease_id}", self.api.read_namespaced_pod, lease_id, self.config.namespace
            )
        except k8s.NotFound:
            return None
        annotations: dict[str, str] = pod["metadata"].get("annotations") or {}  # API JSON
        return annotations.get(key)

    def _reported_notice(self, lease: Lease) -> float | None:
        """When the pod's watcher saw an interruption notice (its node's taint, the cloud's
        metadata, the kubelet's SIGTERM), from the status object it wrote to the job's
        store (``watch --report``); None when it saw none or wrote nothing."""
        from spot_core.checkpoint import open_store
        from spot_core.checkpoint.status import parse_report, status_key

        uri = lease.details.get("checkpoint_uri")
        if not uri:
            return None
        try:
            return parse_report(open_store(uri).get_object(status_key(lease.attempt))).get(
                "notice_at"
            )
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - a missing report only blurs the outcome
            log.warning("could not read the status report of pod %s: %s", lease.lease_id, exc)
            return None

    def _reread(self, lease: Lease) -> dict[str, Any] | None:
        namespace = lease.details.get("namespace", self.config.namespace)
        try:
            return k8s.raw(
                f"get pod {lease.lease_id}", self.api.read_namespaced_pod, lease.lease_id, namespace
            )
        except k8s.NotFound:
            return None


def result_marker(attempt: int) -> str:
    """Where a step run through the call exchange leaves its result, from the job's store
    root (``prefect_spot._remote``: ``call/`` + ``result_key(attempt)``; a test holds the
    two equal)."""
    return f"call/attempt-{attempt:06d}/result.pkl"


def _events_may_tell(verdict: classify.PodVerdict) -> bool:
    """Whether events could change the verdict: a disruption whose cause (voluntary or a
    spot reclaim) the pod and its node alone leave open, or an exit 0 that only the
    kubelet's ``Evicted`` event tells from a success (an eviction for the pod's own
    storage limit leaves no other trace when the step exits 0 on the SIGTERM)."""
    if verdict.outcome == Outcome.SUCCEEDED.value:
        return verdict.disruption is None
    return verdict.outcome in (Outcome.PREEMPTED.value, Outcome.DISRUPTED.value) and any(
        d.voluntary is None for d in verdict.evidence
    )


def _only(values: set[str]) -> str | None:
    """The one value of ``values``, or None when there are several."""
    return next(iter(values)) if len(values) == 1 else None
