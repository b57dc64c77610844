"""Kubernetes node pools as spot-pipelines pools, and what they cost.

A Kubernetes cluster sells no capacity itself: its nodes belong to node pools that the
cloud runs on spot or on-demand, and each flavour says which in a node label:

- EKS managed node groups: ``eks.amazonaws.com/capacityType: SPOT | ON_DEMAND``
- Karpenter: ``karpenter.sh/capacity-type: spot | on-demand``
- GKE: ``cloud.google.com/gke-spot: "true"`` (and the older ``gke-preemptible``)
- AKS: ``kubernetes.azure.com/scalesetpriority: spot`` (its nodes carry a NoSchedule
  taint of the same key that a pod must tolerate)

A pool here is (region, zone, instance type, market) read from the well-known labels
``topology.kubernetes.io/region|zone`` and ``node.kubernetes.io/instance-type``; the node
pools behind it (and their flavours) are kept beside it. Pure: node objects (the API's
JSON) in, pools and offers out; the provider lists the nodes.

Prices are configuration, since no cluster API says what a node costs: ``prices`` maps a
node pool name or an instance type to ``{"spot": $/h, "on_demand": $/h}`` (or a number:
the on-demand price). An on-demand price not given comes from the EC2 list prices shipped
in ``spot_core.market.ec2``; a spot price not given is the on-demand one (no saving is
claimed that nobody configured).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spot_core.errors import ConfigError
from spot_core.market.base import PoolStat
from spot_core.model import MAX_PRICE_PER_HOUR, Market, Offer, Pool

log = logging.getLogger(__name__)

CLOUD = "kubernetes"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
ANY = "any"  # a pool field the nodes do not label: no constraint on it


@dataclass(frozen=True)
class Flavour:
    """How one kind of managed node pool marks spot nodes, and what a pod must tolerate."""

    name: str
    label: str
    spot_value: str
    node_pool_label: str
    spot_taint: str | None = None  # a NoSchedule taint key its spot nodes carry, if any


FLAVOURS: tuple[Flavour, ...] = (
    Flavour("karpenter", "karpenter.sh/capacity-type", "spot", "karpenter.sh/nodepool"),
    Flavour("eks", "eks.amazonaws.com/capacityType", "SPOT", "eks.amazonaws.com/nodegroup"),
    Flavour(
        "gke-spot",
        "cloud.google.com/gke-spot",
        "true",
        "cloud.google.com/gke-nodepool",
        spot_taint="cloud.google.com/gke-spot",
    ),
    Flavour(
        "gke-preemptible",
        "cloud.google.com/gke-preemptible",
        "true",
        "cloud.google.com/gke-nodepool",
        spot_taint="cloud.google.com/gke-preemptible",
    ),
    Flavour(
        "aks",
        "kubernetes.azure.com/scalesetpriority",
        "spot",
        "kubernetes.azure.com/agentpool",
        spot_taint="kubernetes.azure.com/scalesetpriority",
    ),
)
FLAVOURS_BY_NAME = {f.name: f for f in FLAVOURS}

# Taints that only say "no new pods" for a reason we tolerate on purpose (the spot taints
# above); any other NoSchedule/NoExecute taint makes a node unavailable to a new pod.
IGNORED_TAINT_EFFECTS = ("PreferNoSchedule",)


@dataclass(frozen=True)
class NodeInfo:
    """What spot-pipelines reads from one node object."""

    name: str
    pool: Pool
    flavour: str  # a FLAVOURS name, or "generic" for an unlabelled on-demand node
    node_pool: str  # the flavour's node pool label, or "" when it has none
    schedulable: bool  # Ready, not cordoned, no taint a new pod would not tolerate


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """One node object (the API's JSON) as the pool it belongs to."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    market, flavour = capacity_of(labels)
    instance_type = next((labels[k] for k in INSTANCE_TYPE_LABELS if labels.get(k)), ANY)
    pool = Pool(
        CLOUD, labels.get(REGION_LABEL) or ANY, labels.get(ZONE_LABEL) or ANY, instance_type, market
    )
    spec = node.get("spec") or {}
    tolerated = {FLAVOURS_BY_NAME[flavour].spot_taint} if flavour in FLAVOURS_BY_NAME else set()
    blocking = [
        t
        for t in spec.get("taints") or []
        if t.get("effect") not in IGNORED_TAINT_EFFECTS and t.get("key") not in tolerated
    ]
    schedulable = is_ready(node) and not spec.get("unschedulable") and not blocking
    node_pool = (
        labels.get(FLAVOURS_BY_NAME[flavour].node_pool_label, "")
        if flavour in FLAVOURS_BY_NAME
        else _generic_node_pool(labels)
    )
    return NodeInfo(str(meta.get("name", "")), pool, flavour, node_pool, schedulable)


def capacity_of(labels: Mapping[str, str]) -> tuple[Market, str]:
    """(market, flavour) from a node's labels: spot if any flavour's label says so."""
    for flavour in FLAVOURS:
        if labels.get(flavour.label) == flavour.spot_value:
            return Market.SPOT, flavour.name
    for flavour in FLAVOURS:
        if flavour.label in labels or flavour.node_pool_label in labels:
            return Market.ON_DEMAND, flavour.name
    return Market.ON_DEMAND, "generic"


def _generic_node_pool(labels: Mapping[str, str]) -> str:
    return next((labels[f.node_pool_label] for f in FLAVOURS if labels.get(f.node_pool_label)), "")


def is_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass(frozen=True)
class PoolNodes:
    """One pool with the nodes, node pools and flavours behind it."""

    pool: Pool
    nodes: tuple[str, ...]
    schedulable_nodes: tuple[str, ...]
    node_pools: tuple[str, ...]
    flavours: tuple[str, ...]


def group_pools(nodes: Iterable[NodeInfo]) -> dict[str, PoolNodes]:
    """pool key -> PoolNodes, in the order the pools first appear."""
    grouped: dict[str, list[NodeInfo]] = {}
    for info in nodes:
        grouped.setdefault(info.pool.key, []).append(info)
    return {
        key: PoolNodes(
            infos[0].pool,
            tuple(i.name for i in infos),
            tuple(i.name for i in infos if i.schedulable),
            tuple(dict.fromkeys(i.node_pool for i in infos if i.node_pool)),
            tuple(dict.fromkeys(i.flavour for i in infos)),
        )
        for key, infos in grouped.items()
    }


# -- prices ------------------------------------------------------------------------------------
def check_prices(prices: Any) -> dict[str, dict[str, float]]:
    """The ``prices`` option normalised to {name: {"spot"?: $/h, "on_demand"?: $/h}};
    one ConfigError line naming the bad entry otherwise."""
    if prices is None:
        return {}
    if not isinstance(prices, Mapping):
        raise ConfigError(
            f"kubernetes provider option prices={prices!r} must map a node pool "
            "or instance type to {'spot': 0.12, 'on_demand': 0.38} ($/h)"
        )
    out: dict[str, dict[str, float]] = {}
    for name, value in prices.items():
        entry = {"on_demand": value} if _is_price(value) else value
        if (
            not isinstance(entry, Mapping)
            or not entry
            or set(entry) - {"spot", "on_demand"}
            or not all(_is_price(v) for v in entry.values())
        ):
            raise ConfigError(
                f"kubernetes provider option prices[{name!r}]={value!r} must be "
                f"a price in $/h from 0 to {MAX_PRICE_PER_HOUR:,.0f} or "
                "{'spot': 0.12, 'on_demand': 0.38}"
            )
        out[str(name)] = {k: float(v) for k, v in entry.items()}
    return out


def _is_price(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_PRICE_PER_HOUR
    )


@dataclass
class PriceTable:
    """$/h of a pool: by node pool name first, then by instance type, then list prices."""

    prices: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def on_demand(self, pool: Pool, node_pools: Sequence[str] = ()) -> float:
        found = self._lookup("on_demand", pool, node_pools)
        if found is not None:
            return found
        from spot_core.market.ec2 import ON_DEMAND_PRICES

        if pool.instance_type in ON_DEMAND_PRICES:
            return ON_DEMAND_PRICES[pool.instance_type]
        name = node_pools[0] if node_pools else pool.instance_type
        raise ConfigError(
            f"no on-demand price known for node pool {name!r} (instance type "
            f"{pool.instance_type}); pass the kubernetes provider option "
            f"prices={{'{name}': {{'spot': 0.12, 'on_demand': 0.38}}}}"
        )

    def price(self, pool: Pool, node_pools: Sequence[str] = ()) -> float:
        """What the pool costs on its own market."""
        if not pool.is_spot:
            return self.on_demand(pool, node_pools)
        found = self._lookup("spot", pool, node_pools)
        return self.on_demand(pool, node_pools) if found is None else found

    def _lookup(self, kind: str, pool: Pool, node_pools: Sequence[str]) -> float | None:
        for name in (*node_pools, pool.instance_type):
            entry = self.prices.get(name)
            if entry is not None and kind in entry:
                return entry[kind]
        return None


# -- the market ------------------------------------------------------------------------------
@dataclass
class KubernetesMarket:
    """Offers for the cluster's pools: configured prices; capacity = a schedulable node.

    ``list_nodes`` returns the cluster's node objects (the provider's one list call); it
    is called at most every ``refresh_seconds``. A pool whose pod stayed unschedulable
    (``note_capacity_miss``) is offered as unavailable for ``capacity_cooldown_seconds``:
    an autoscaler may still bring nodes, but not soon enough to wait on.
    """

    list_nodes: Callable[[], list[Mapping[str, Any]]]
    price_table: PriceTable = field(default_factory=PriceTable)
    refresh_seconds: float = 5.0
    capacity_cooldown_seconds: float = 120.0
    clock: Callable[[], float] = time.time
    time_scale: float = 1.0  # pods run in real time
    tick_seconds: float | None = None  # node pools change whenever the cluster does

    def __post_init__(self) -> None:
        self._pools: dict[str, PoolNodes] = {}
        self._fetched_at = -math.inf
        self._misses: dict[str, float] = {}

    def refresh(self, force: bool = False) -> dict[str, PoolNodes]:
        now = self.clock()
        if force or now - self._fetched_at >= self.refresh_seconds:
            self._pools = group_pools(node_info(n) for n in self.list_nodes())
            self._fetched_at = now
        return self._pools

    def pool_nodes(self, pool: Pool) -> PoolNodes | None:
        return self.refresh().get(pool.key)

    def pools(self, market: Market | None = None) -> tuple[Pool, ...]:
        return tuple(
            p.pool for p in self.refresh().values() if market is None or p.pool.market is market
        )

    def offers(self, pools: Sequence[Pool], now: float) -> list[Offer]:
        return [self._offer(pool, now) for pool in pools]

    def _offer(self, pool: Pool, now: float) -> Offer:
        nodes = self.pool_nodes(pool)
        if nodes is None:  # no node of this kind (an on-demand twin the cluster lacks)
            return Offer(pool, 0.0, 0.0, False, now)
        on_demand = self.on_demand_price(pool)
        price = self.price_table.price(pool, nodes.node_pools)
        missed = now - self._misses.get(pool.key, -math.inf) < self.capacity_cooldown_seconds
        available = bool(nodes.schedulable_nodes) and not missed
        return Offer(pool, price, on_demand, available, now)

    def on_demand_price(self, pool: Pool) -> float:
        """The on-demand price of the pool's instance type: configured for its on-demand
        twin's node pools, its own or its spot twin's, else by type."""
        pools = self.refresh()
        names = tuple(
            name
            for market in (Market.ON_DEMAND, pool.market, Market.SPOT)
            for name in getattr(pools.get(pool.on(market).key), "node_pools", ())
        )
        return self.price_table.on_demand(pool, tuple(dict.fromkeys(names)))

    def stats(self, pools: Sequence[Pool], now: float) -> dict[str, PoolStat]:
        """None kept: a cluster's node pools carry no interruption history here (the
        controller then gives every attempt the longest checkpoint interval)."""
        return {}

    def note_capacity_miss(self, pool: Pool, now: float | None = None) -> None:
        self._misses[pool.key] = self.clock() if now is None else now
