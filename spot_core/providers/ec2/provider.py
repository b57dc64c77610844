"""``Ec2Provider``: the provider protocol over the EC2 API, assembled from its parts
(launch, observe) with what is its own: the pools, bills, termination and cleanup."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from spot_core.adaptors import aws
from spot_core.market.ec2 import Ec2Market
from spot_core.model import Lease, Market, Pool
from spot_core.providers import ec2_lean
from spot_core.providers.base import Bill, Capability
from spot_core.providers.ec2.launch import Ec2Launch
from spot_core.providers.ec2.observe import Ec2Observe
from spot_core.providers.ec2.options import CLOUD, TAG_JOB, Ec2Options, _validate

log = logging.getLogger(__name__)


class Ec2Provider(Ec2Launch, Ec2Observe):
    """Provider protocol over the EC2 API (and anything that speaks it, such as moto)."""

    name = "ec2"
    capabilities = (
        Capability.SPOT
        | Capability.OWN_STORES
        | Capability.LAUNCH_ANY
        | Capability.LEASE_TAGS
        | Capability.CLEANUP_ORPHANS
        | Capability.IMAGES
        | Capability.PARALLEL_LAUNCH
    )

    def __init__(
        self,
        options: Ec2Options,
        *,
        clients: Mapping[str, Any] | None = None,
        sqs_client: Any = None,
        session: aws.Access = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        _validate(options)
        self.config = options
        # JSON-able and credential-free: `open_provider("ec2", session=..., **provider.options)`
        # reopens this provider elsewhere, with that process's own session (its engine
        # resolves the same connection or block again).
        self.options = options.to_options()
        self.access = aws.access_of(session)
        self.clock = clock
        self.clients = dict(
            clients
            or {
                r: aws.make_client(
                    "ec2", region=r, endpoint_url=options.endpoint_url, session=self.access
                )
                for r in options.regions
            }
        )
        for client in self.clients.values():
            ec2_lean.install(client)
        self._listed: dict[tuple[str, str], tuple[int, float]] = {}  # (what, region) -> size, when
        self._request_ids: dict[str, str] = {}  # instance id -> spot request id ("" for none)
        self._zones = self._resolve_subnets()
        from spot_core.market.advisor import load_advisor

        self.market = Ec2Market(
            self.clients,
            self._spot_pools(),
            load_advisor(options.advisor_path),
            on_demand_prices=options.on_demand_prices,
            refresh_seconds=options.price_refresh_seconds,
            clock=clock,
        )
        self._events = None
        if options.sqs_queue_url:
            from spot_core.interruption.eventbridge import EventQueue

            sqs = sqs_client or aws.make_client(
                "sqs",
                region=options.regions[0],
                endpoint_url=options.endpoint_url,
                session=self.access,
            )
            self._events = EventQueue(sqs, options.sqs_queue_url)
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self._terminated: set[str] = set()
        self._notices: dict[str, float] = {}
        self._report_read: dict[str, float] = {}  # instance id -> last read (monotonic)
        self._rebalances: dict[str, float] = {}  # instance id -> rebalance recommendation

    @classmethod
    def from_options(cls, *, session: aws.Access = None, **options: Any) -> Ec2Provider:
        """Build from plain JSON-able options (what engine adapters store and pass; see
        ``Ec2Options.from_plain``) and the process's ``session`` (a boto3 Session or
        ``AwsAccess`` from the engine's connection or block; None: boto3's default
        chain). The session's region is the default ``region``."""
        access = aws.access_of(session)
        if access.region and not options.get("region"):
            options = {**options, "region": access.region}
        return cls(Ec2Options.from_plain(**options), session=access)

    # -- pools --------------------------------------------------------------------------
    def _resolve_subnets(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """region -> zone -> subnet ids, from one describe_subnets per region."""
        zones: dict[str, dict[str, tuple[str, ...]]] = {}
        for region, subnet_ids in self.config.subnets.items():
            answer = aws.call(
                f"ec2:DescribeSubnets in {region}",
                self.clients[region].describe_subnets,
                SubnetIds=list(subnet_ids),
            )
            per_zone: dict[str, list[str]] = {}
            for subnet in sorted(
                answer["Subnets"], key=lambda s: list(subnet_ids).index(s["SubnetId"])
            ):
                per_zone.setdefault(subnet["AvailabilityZone"], []).append(subnet["SubnetId"])
            zones[region] = {z: tuple(s) for z, s in per_zone.items()}
        return zones

    def _spot_pools(self) -> tuple[Pool, ...]:
        return tuple(
            Pool(CLOUD, region, zone, instance_type, Market.SPOT)
            for region, zones in self._zones.items()
            for zone in zones
            for instance_type in self.config.instance_types
        )

    def pools(self) -> tuple[Pool, ...]:
        return self._spot_pools()

    # -- money --------------------------------------------------------------------------
    def bill(self, lease: Lease, ended_at: float) -> Bill:
        """Per-second billing at the spot price in effect each second, plus cross-region
        data transfer (costs one DescribeSpotPriceHistory call per ended spot attempt)."""
        seconds = max(0.0, ended_at - lease.started_at)
        on_demand = self.market.on_demand_price(lease.pool.region, lease.pool.instance_type)
        transfer = float(lease.details.get("data_transfer_cost", 0.0) or 0.0)
        if lease.pool.is_spot:
            capacity_cost = self.market.spot_cost(
                lease.pool, lease.started_at, lease.started_at + seconds, lease.price_per_hour
            )
        else:
            capacity_cost = on_demand * seconds / 3600.0
        return Bill(
            cost=capacity_cost + transfer,
            on_demand_cost=on_demand * seconds / 3600.0,
            capacity_seconds=seconds,
            data_transfer_cost=transfer,
        )

    def capacity_seconds(self, wall_seconds: float) -> float:
        return wall_seconds

    # -- terminate ----------------------------------------------------------------------
    def terminate(self, lease: Lease) -> None:
        with self._lock:
            self._terminated.add(lease.lease_id)
        self._terminate_ids(lease.pool.region, [lease.lease_id])

    def close(self) -> None:
        """Terminate every instance this provider launched (idempotent)."""
        with self._lock:
            leases = list(self._leases.values())
            self._terminated.update(each.lease_id for each in leases)
        by_region: dict[str, list[str]] = {}
        for lease in leases:
            by_region.setdefault(lease.pool.region, []).append(lease.lease_id)
        for region, ids in by_region.items():
            self._terminate_ids(region, ids)

    def cleanup_orphans(self, job_id: str | None = None) -> list[str]:
        """Terminate every live instance tagged ``spot-pipelines:managed=true`` (of
        ``job_id`` only, if given) in this provider's regions; return their ids."""
        filters = [] if job_id is None else [{"Name": f"tag:{TAG_JOB}", "Values": [job_id]}]
        doomed: list[str] = []
        for region in self.clients:
            ids = self._live_tagged(region, filters)
            if ids:
                self._terminate_ids(region, ids)
                doomed += ids
        if doomed:
            shown = ", ".join(doomed[:10]) + (
                f" and {len(doomed) - 10} more" if len(doomed) > 10 else ""
            )
            log.warning("terminated %d orphaned instance(s): %s", len(doomed), shown)
        return doomed

    def __enter__(self) -> Ec2Provider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
