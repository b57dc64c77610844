"""The kubernetes provider: a lease is a pod on a spot (or on-demand) node pool.

Pools come from the nodes' labels (``spot_core.market.kubernetes``: EKS managed node
groups, Karpenter, GKE Spot and preemptible, AKS spot pools). ``launch`` creates the
attempt's pod (``kubernetes_pods.build_pod``) and waits, bounded, until it is scheduled
and its step container started: a pod still unscheduled after ``unschedulable_timeout``
is a capacity miss (deleted; ``CapacityUnavailable``, the controller tries the next
pool); a container that cannot start for its configuration (``ImagePullBackOff``,
``ErrImagePull``, ``CreateContainerConfigError``) is one ``ConfigError`` carrying the
pod's message (deleted; no pool can fix it). ``observe`` answers any number of leases
with one pod list by label selector and one node list, re-reads a pod whose disruption
condition it is about to act on, and hands each to the one pod classifier
(``spot_core.policy.pod_outcomes.classify_pod``) with what only it knows: the lease's market, the
notices seen on earlier looks (so a pod stuck under one ends at its grace period plus
``notice_margin_seconds``, deleted, with grace 0 when its node is gone), whether the
step reported completion, and, when they can settle the cause, the pod's and its node's
events. The pod's life on its node (scheduling to end) is billed per second at the
pool's configured price.

Every pod carries ``spot-pipelines/managed=true``, ``spot-pipelines/job`` and
``spot-pipelines/attempt``; ``terminate`` deletes it (idempotent), ``close`` deletes
every pod this provider launched, ``cleanup_orphans`` every labelled pod (of one job).
"""

from __future__ import annotations

import logging
import math
import shlex
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from spot_core import stopping
from spot_core.adaptors import kubernetes as k8s
from spot_core.errors import CapacityUnavailable, ConfigError, InfrastructureError
from spot_core.market.kubernetes import KubernetesMarket, PriceTable, check_prices
from spot_core.model import Lease, Market, Outcome, Pool
from spot_core.policy import pod_outcomes as classify
from spot_core.providers import kubernetes_pods as pods
from spot_core.providers.base import (
    Bill,
    Capability,
    LaunchSpec,
    LeaseStatus,
    Provider,
    ProviderPlugin,
    SessionKind,
    key_values,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KubernetesOptions:
    """Everything the provider needs, as plain JSON-able values (``from_plain`` checks)."""

    kubeconfig: str | None = None  # path; default $KUBECONFIG or ~/.kube/config
    context: str | None = None
    in_cluster: bool | None = None  # None: the service account when in a pod
    namespace: str = "default"
    image: str | None = None  # the step's image (else the template's)
    pod_template: Mapping[str, Any] = field(default_factory=dict)  # a V1Pod as a dict
    prices: Mapping[str, Any] = field(default_factory=dict)  # see market.kubernetes
    service_account: str | None = None
    unschedulable_timeout: float = 60.0  # seconds a pod may wait for a node: then next pool
    start_timeout: float = 600.0  # seconds from scheduling to a started step
    watch_command: tuple[str, ...] = ("spot-pipelines",)
    watch_poll_interval: float = 1.0
    node_refresh_seconds: float = 5.0
    capacity_cooldown_seconds: float = 120.0
    # Annotate every step pod karpenter.sh/do-not-disrupt: "true" and
    # cluster-autoscaler.kubernetes.io/safe-to-evict: "false", so neither consolidates or
    # scales down a node under a running step (a spot reclaim still takes it).
    do_not_disrupt: bool = True
    # After a notice (its node NotReady or gone, the pod stuck Terminating) a pod that has
    # not ended within its grace period plus this margin is ended by the provider.
    notice_margin_seconds: float = 30.0

    @classmethod
    def from_plain(cls, **options: Any) -> KubernetesOptions:
        check_option_names(options)
        for name, value in options.items():
            check_option_value(name, value)
        if isinstance(options.get("watch_command"), str):
            options["watch_command"] = shlex.split(options["watch_command"])
        if "watch_command" in options:
            options["watch_command"] = tuple(options["watch_command"])
        options = {k: v for k, v in options.items() if v is not None or k == "in_cluster"}
        return cls(**options)

    def to_options(self) -> dict[str, Any]:
        """Plain JSON-able keyword arguments for ``KubernetesProvider.from_options``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["watch_command"] = list(self.watch_command)
        out["pod_template"], out["prices"] = dict(self.pod_template), dict(self.prices)
        return out


OPTION_NAMES = frozenset(f.name for f in fields(KubernetesOptions))
SECONDS_OPTIONS = (
    "unschedulable_timeout",
    "start_timeout",
    "watch_poll_interval",
    "node_refresh_seconds",
    "capacity_cooldown_seconds",
    "notice_margin_seconds",
)


def check_option_names(names: Iterable[str]) -> None:
    unknown = sorted(set(names) - OPTION_NAMES)
    if unknown:
        raise ConfigError(
            f"unknown kubernetes provider option(s) {unknown}; choose from {sorted(OPTION_NAMES)}"
        )


def check_option_value(name: str, value: Any) -> None:
    """One option's type and range, one line naming the fix. A value still holding a
    template (``{{ ... }}``) is checked once rendered."""
    if value is None or (isinstance(value, str) and "{{" in value):
        return
    if name in SECONDS_OPTIONS and not (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    ):
        raise ConfigError(
            f"kubernetes provider option {name}={value!r} must be a number of seconds > 0, e.g. 60"
        )
    if name in ("kubeconfig", "context", "namespace", "image", "service_account") and not (
        isinstance(value, str) and value.strip()
    ):
        raise ConfigError(f"kubernetes provider option {name}={value!r} must be a non-empty string")
    if name in ("in_cluster", "do_not_disrupt") and not isinstance(value, bool):
        raise ConfigError(f"kubernetes provider option {name}={value!r} must be true or false")
    if name == "pod_template" and not (
        isinstance(value, Mapping) and isinstance(value.get("spec", {}), Mapping)
    ):
        raise ConfigError(
            "kubernetes provider option pod_template must be a V1Pod as a dict, "
            "e.g. {'spec': {'containers': [{'name': 'step', 'resources': ...}]}}"
        )
    if name == "prices":
        check_prices(value)
    if name == "watch_command" and not (
        (isinstance(value, str) and value.strip())
        or (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(w, str) and w for w in value)
        )
    ):
        raise ConfigError(
            f"kubernetes provider option watch_command={value!r} must be the "
            "command that runs spot-pipelines in the image, e.g. "
            "['spot-pipelines'] or ['python', '-m', 'spot_core.cli']"
        )


class KubernetesProvider:
    """Provider protocol over a Kubernetes API server (any that speaks the API)."""

    name = "kubernetes"
    capabilities = (
        Capability.SPOT
        | Capability.LEASE_TAGS
        | Capability.CLEANUP_ORPHANS
        | Capability.IMAGES
        | Capability.COMMAND_IN_IMAGE
        | Capability.PARALLEL_LAUNCH
    )

    def __init__(
        self,
        options: KubernetesOptions,
        *,
        api: Any = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = stopping.sleep,
    ) -> None:
        self.config = options
        # JSON-able: `open_provider("kubernetes", **provider.options)` reopens it elsewhere.
        self.options = options.to_options()
        self.clock, self._sleep = clock, sleep
        self.api = api or k8s.core_api(
            k8s.api_client(
                kubeconfig=options.kubeconfig,
                context=options.context,
                in_cluster=options.in_cluster,
            )
        )
        self.market = KubernetesMarket(
            self._list_nodes,
            PriceTable(check_prices(options.prices)),
            refresh_seconds=options.node_refresh_seconds,
            capacity_cooldown_seconds=options.capacity_cooldown_seconds,
            clock=clock,
        )
        self._launched: dict[str, str] = {}  # pod name -> namespace, for close()
        self._terminated: set[str] = set()
        # lease -> the notices its pod showed (or its watcher reported), first seen when
        self._notices: dict[str, tuple[classify.Disruption, ...]] = {}
        self._annotations: dict[str, dict[str, str]] = {}  # pod name -> annotations last observed

    @classmethod
    def from_options(cls, **options: Any) -> KubernetesProvider:
        """Build from plain JSON-able options (what engine adapters store and pass)."""
        return cls(KubernetesOptions.from_plain(**options))

    # -- pools ----------------------------------------------------------------------------
    def _list_nodes(self) -> list[Mapping[str, Any]]:
        return k8s.raw("list nodes", self.api.list_node).get("items") or []

    def pools(self) -> tuple[Pool, ...]:
        """Spot pools first, then the on-demand pools the job falls back to."""
        return self.market.pools(Market.SPOT) + self.market.pools(Market.ON_DEMAND)

    # -- launch ---------------------------------------------------------------------------
    def build_pod(self, spec: LaunchSpec, pool: Pool, name: str | None = None) -> dict[str, Any]:
        """The attempt's pod on ``pool`` as the API's JSON, the ``pod_template`` merged
        under ours (public: the Airflow SpotKubernetesPodOperator builds its pod here)."""
        image = spec.image or self.config.image or pods.template_image(self.config.pod_template)
        if not image:
            raise ConfigError(
                "the kubernetes provider needs the step's image: pass "
                "provider_options {'image': 'registry/step:tag'} (or image=, or "
                "a container image in pod_template)"
            )
        nodes = self.market.pool_nodes(pool)
        return pods.build_pod(
            spec,
            pool,
            name=name or pods.pod_name(spec.job_id, spec.attempt, uuid.uuid4().hex[:5]),
            namespace=self.config.namespace,
            image=image,
            watch_command=self.config.watch_command,
            pod_template=self.config.pod_template,
            service_account=self.config.service_account,
            flavours=nodes.flavours if nodes else (),
            watch_poll_interval=self.config.watch_poll_interval,
            do_not_disrupt=self.config.do_not_disrupt,
        )

    def launch(self, spec: LaunchSpec, pool: Pool) -> Lease:
        """The attempt's pod, scheduled and started on ``pool``; see the module docstring."""
        nodes = self.market.refresh(force=True).get(pool.key)
        if nodes is None or not nodes.schedulable_nodes:
            self.market.note_capacity_miss(pool, self.clock())
            raise CapacityUnavailable(f"no schedulable node in {pool.key}")
        body = self.build_pod(spec, pool)
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        # Known before the create: a stop landing while the create's answer is still being
        # read (a SIGTERM in `spot-pipelines run`) must delete the pod too, here or in close().
        self._launched[name] = namespace
        try:  # whatever stops us before the lease is handed back also deletes the pod
            k8s.call(f"create pod {name}", self.api.create_namespaced_pod, namespace, body)
            pod = self._wait_started(name, namespace, pool)
            return self._lease(spec, pool, pod, nodes.node_pools)
        except BaseException:
            self._delete_quietly(name, namespace)
            raise

    def _wait_started(self, name: str, namespace: str, pool: Pool) -> dict[str, Any]:
        """Poll the new pod until its step started (or ended); every way out is bounded."""
        started = self.clock()
        while True:
            try:
                pod = k8s.raw(f"get pod {name}", self.api.read_namespaced_pod, name, namespace)
            except k8s.NotFound:  # deleted or evicted before it started: try again elsewhere
                raise InfrastructureError(
                    f"pod {name} was deleted before its step started "
                    "(evicted, or deleted by someone else)"
                ) from None
            problem = classify.waiting_problem(pod)
            if problem is not None:
                raise ConfigError(
                    f"pod {name} cannot start its step: {problem}; fix the "
                    "image, its pull secret or pod_template"
                )
            if _step_started(pod):
                return pod
            waited = self.clock() - started
            if pods.scheduled_at(pod) is None and waited >= self.config.unschedulable_timeout:
                self.market.note_capacity_miss(pool, self.clock())
                why = (pods.unschedulable_since(pod) or (0.0, "not scheduled"))[1]
                raise CapacityUnavailable(
                    f"pod {name} found no node in {pool.key} within "
                    f"{self.config.unschedulable_timeout:g} s ({why})"
                )
            if waited >= self.config.unschedulable_timeout + self.config.start_timeout:
                raise InfrastructureError(
                    f"pod {name} was scheduled but its step did not "
                    f"start within {self.config.start_timeout:g} s"
                )
            self._sleep(0.25)

    def _lease(
        self, spec: LaunchSpec, pool: Pool, pod: Mapping[str, Any], node_pools: Sequence[str]
    ) -> Lease:
        now = self.clock()
        offer = self.market.offers([pool], now)[0]
        name = pod["metadata"]["name"]
        return Lease(
            lease_id=name,
            pool=pool,
            job_id=spec.job_id,
            attempt=spec.attempt,
            started_at=min(now, pods.scheduled_at(pod) or now),
            price_per_hour=offer.price_per_hour,
            details={
                "namespace": pod["metadata"].get("namespace", self.config.namespace),
                "checkpoint_uri": spec.checkpoint_uri,
                "node": classify.node_of(pod) or "",
                "node_pool": ",".join(node_pools),
                "on_demand_price_per_hour": f"{offer.on_demand_price_per_hour:.6f}",
                "labels": pods.job_selector(spec.job_id) + f",{pods.LABEL_ATTEMPT}={spec.attempt}",
            },
        )

    # -- observe --------------------------------------------------------------------------
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

    # -- money ----------------------------------------------------------------------------
    def bill(self, lease: Lease, ended_at: float) -> Bill:
        """Per second of the pod's life on its node, at the prices fixed at launch."""
        seconds = max(0.0, ended_at - lease.started_at)
        on_demand = float(lease.details.get("on_demand_price_per_hour", lease.price_per_hour))
        return Bill(
            cost=lease.price_per_hour * seconds / 3600.0,
            on_demand_cost=on_demand * seconds / 3600.0,
            capacity_seconds=seconds,
        )

    def capacity_seconds(self, wall_seconds: float) -> float:
        return wall_seconds

    # -- end --------------------------------------------------------------------------------
    def terminate(self, lease: Lease) -> None:
        """Delete the lease's pod (its step gets SIGTERM and saves); idempotent."""
        self._terminated.add(lease.lease_id)
        self._delete(lease.lease_id, lease.details.get("namespace", self.config.namespace))

    def _delete(self, name: str, namespace: str) -> bool:
        """True if a pod was deleted; a pod already gone (or never created) is no error. A
        failed delete keeps the pod on the list close() deletes."""
        try:
            k8s.call(f"delete pod {name}", self.api.delete_namespaced_pod, name, namespace)
        except k8s.NotFound:
            self._launched.pop(name, None)
            return False
        self._launched.pop(name, None)
        return True

    def _delete_quietly(self, name: str, namespace: str) -> None:
        """``_delete`` on a way out: its own failure is logged, not raised over the error
        that is already leaving (close() and cleanup_orphans remain)."""
        try:
            self._delete(name, namespace)
        except Exception as exc:  # noqa: BLE001 - the first error is the one to report
            log.warning("could not delete pod %s/%s: %s", namespace, name, exc)

    def close(self) -> None:
        """Delete every pod this provider launched that is still there."""
        for name, namespace in list(self._launched.items()):
            self._delete_quietly(name, namespace)

    def cleanup_orphans(self, job_id: str | None = None) -> list[str]:
        """Delete every pod labelled ``spot-pipelines/managed=true`` (of ``job_id`` only,
        if given) in the namespace; return their names. Only for when no live run owns
        them (a controller that crashed): it does not ask."""
        namespace = self.config.namespace
        listed = k8s.raw(
            f"list pods in {namespace}",
            self.api.list_namespaced_pod,
            namespace,
            label_selector=pods.job_selector(job_id),
        )
        names = [p["metadata"]["name"] for p in listed.get("items") or []]
        deleted = [name for name in names if self._delete(name, namespace)]
        if deleted:
            log.warning("deleted %d orphaned pod(s): %s", len(deleted), ", ".join(deleted))
        return deleted

    def __enter__(self) -> KubernetesProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _step_started(pod: Mapping[str, Any]) -> bool:
    """The step's container runs or ran (or the pod already ended)."""
    if (pod.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    state = pods.step_state(pod).get("state") or {}
    return bool(state.get("running") or state.get("terminated"))


def annotate_own_pod(key: str, value: str, environ: Mapping[str, str] | None = None) -> str:
    """Set annotation ``key`` on the pod this runs in (named by the downward API's
    ``SPOT_POD_NAME`` / ``SPOT_POD_NAMESPACE``) with the pod's own credentials; the pod's
    name. The admission policy in deploy/kubernetes/rbac.yaml lets a step's service
    account patch only its own pod, so no other pod can set this annotation there."""
    import os

    from spot_core.interruption.kubernetes import POD_NAME_ENV, POD_NAMESPACE_ENV

    env = os.environ if environ is None else environ
    name, namespace = env.get(POD_NAME_ENV), env.get(POD_NAMESPACE_ENV)
    if not name or not namespace:
        raise ConfigError(
            f"annotate_own_pod needs ${POD_NAME_ENV} and ${POD_NAMESPACE_ENV} "
            "(the kubernetes provider sets them from the downward API)"
        )
    api = k8s.core_api(k8s.api_client())
    k8s.call(
        f"annotate pod {name} (its own)",
        api.patch_namespaced_pod,
        name,
        namespace,
        {"metadata": {"annotations": {key: value}}},
    )
    return name


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


# -- the plugin: what the engines know of this provider -----------------------------------------
class KubernetesPlugin(ProviderPlugin):
    """Pods on a cluster's spot node pools, reached with a ``kubernetes`` ApiClient."""

    capabilities = KubernetesProvider.capabilities
    session = SessionKind.KUBERNETES
    summary = (
        "pods on a Kubernetes cluster's spot node pools (a store its pods reach: "
        "s3://, or a volume every pod mounts)"
    )
    lease_noun = "pods"
    step_container = classify.STEP_CONTAINER
    store_hint = (
        "'s3://bucket/prefix', or a file:// path under a volumeMount of the "
        "pod_template's step container (a PVC every pod mounts)"
    )

    def open(self, options: Mapping[str, Any], session: Any = None) -> Provider:
        """``session``: an ApiClient the engine resolved (an Airflow ``kubernetes_conn_id``,
        a Prefect ``KubernetesClusterConfig``); None: the kubeconfig options."""
        if session is None:
            return KubernetesProvider.from_options(**options)
        return KubernetesProvider(
            KubernetesOptions.from_plain(**options), api=k8s.core_api(session)
        )

    def check_options(self, options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
        """Every name a kubernetes option, each value of its type (no API call). Pools come
        from the cluster's node labels, so ``instance_types`` is not needed."""
        check_option_names(options)
        for name, value in options.items():
            check_option_value(name, value)

    def reaches_store(self, uri: str | None, options: Mapping[str, Any]) -> bool:
        return pods.mounted_store(uri, options.get("pod_template"))

    def publish_from_lease(self, key: str, value: str, environ: Mapping[str, str]) -> bool:
        """In one of its pods (the downward API names it): an annotation on the pod."""
        from spot_core.interruption.kubernetes import POD_NAME_ENV

        if not environ.get(POD_NAME_ENV):
            return False
        annotate_own_pod(key, value, environ)
        return True

    def add_cli_arguments(self, parser: Any) -> None:
        group = parser.add_argument_group("kubernetes provider (see docs/kubernetes.md)")
        group.add_argument(
            "--kubeconfig",
            default=None,
            help="kubernetes: kubeconfig file "
            "(default: $KUBECONFIG or ~/.kube/config; in a pod: its service "
            "account)",
        )
        group.add_argument("--context", default=None, help="kubernetes: kubeconfig context")
        group.add_argument(
            "--namespace",
            default=None,
            help="kubernetes: namespace of the step pods (default: default)",
        )
        group.add_argument(
            "--k8s-option",
            action="append",
            default=[],
            metavar="KEY=JSON",
            help="kubernetes: any other provider option, e.g. "
            'image="reg/step:1" or prices=\'{"spot-ng": {"spot": 0.07}}\' '
            "(repeatable)",
        )

    def cli_options(self, args: Any) -> dict[str, Any]:
        from spot_core.providers.registry import refuse_credentials

        options = key_values(args.k8s_option, "--k8s-option")
        for name in ("kubeconfig", "context", "namespace"):
            if getattr(args, name):
                options[name] = getattr(args, name)
        refuse_credentials(options)
        self.check_options(options, ())
        return options
