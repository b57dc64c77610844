"""``KubernetesProvider``: the provider protocol over a Kubernetes API server, assembled
from its parts (launch, observe) with what is its own: the pools, bills, termination and
cleanup."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from spot_core import stopping
from spot_core.adaptors import kubernetes as k8s
from spot_core.market.kubernetes import KubernetesMarket, PriceTable, check_prices
from spot_core.model import Lease, Market, Pool
from spot_core.providers import kubernetes_pods as pods
from spot_core.providers.base import Bill, Capability
from spot_core.providers.kubernetes.launch import KubernetesLaunch
from spot_core.providers.kubernetes.observe import KubernetesObserve
from spot_core.providers.kubernetes.options import KubernetesOptions

log = logging.getLogger(__name__)


class KubernetesProvider(KubernetesLaunch, KubernetesObserve):
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
        self._launched = {}
        self._terminated = set()
        self._notices = {}
        self._annotations = {}

    @classmethod
    def from_options(cls, **options: Any) -> KubernetesProvider:
        """Build from plain JSON-able options (what engine adapters store and pass)."""
        return cls(KubernetesOptions.from_plain(**options))

    def pools(self) -> tuple[Pool, ...]:
        """Spot pools first, then the on-demand pools the job falls back to."""
        return self.market.pools(Market.SPOT) + self.market.pools(Market.ON_DEMAND)

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
