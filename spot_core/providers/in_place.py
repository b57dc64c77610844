"""The capacity a step already runs on: the worker process of ``@task.spot`` or ``spot_task``.

An in-place step does not launch anything: the engine put it on a (spot) worker, and
its lease is that worker for as long as the call runs. The controller still opens,
classifies, bills and closes its attempts, so this provider gives it the same face as
the others: ``adopt`` describes the current host as a lease, ``observe`` cannot see past
the call's end (the driver reports it through ``Controller.on_lease_end``), ``bill``
charges ``price_per_hour`` if the user says what the worker costs, and ``terminate`` is
a no-op: the engine owns the worker.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from spot_core.errors import ConfigError
from spot_core.model import Lease, Market, Pool
from spot_core.providers.base import Bill, Capability, LaunchSpec, LeaseState, LeaseStatus


class InPlaceProvider:
    """The worker this process runs on, as the lease of an in-place attempt."""

    name = "in-place"
    capabilities = Capability.ON_THIS_MACHINE
    market = None

    def __init__(
        self,
        cloud: str = "auto",
        price_per_hour: float = 0.0,
        on_demand_price_per_hour: float | None = None,
    ) -> None:
        if not price_per_hour >= 0:
            raise ConfigError(f"price_per_hour must be >= 0, got {price_per_hour!r}")
        self.cloud = cloud
        self.price_per_hour = float(price_per_hour)
        self.on_demand_price_per_hour = float(on_demand_price_per_hour or price_per_hour)
        self.options: Mapping[str, Any] = {"cloud": cloud, "price_per_hour": price_per_hour}

    def pool(self) -> Pool:
        return Pool(
            cloud=self.cloud,
            region="-",
            zone=socket.gethostname(),
            instance_type="worker",
            market=Market.SPOT,
        )

    def pools(self) -> tuple[Pool, ...]:
        return (self.pool(),)

    def adopt(self, job_id: str, attempt: int, now: float | None = None) -> Lease:
        """This process's worker as the lease of ``attempt``."""
        return Lease(
            lease_id=f"{socket.gethostname()}:{os.getpid()}",
            pool=self.pool(),
            job_id=job_id,
            attempt=attempt,
            started_at=time.time() if now is None else now,
            price_per_hour=self.price_per_hour,
        )

    def launch(self, spec: LaunchSpec, pool: Pool) -> Lease:
        raise ConfigError(
            "an in-place step runs where the engine put it; it cannot launch "
            "capacity (use SpotJobOperator or SpotTaskRunner for that)"
        )

    def observe(self, leases: Sequence[Lease]) -> dict[str, LeaseStatus]:
        return {lease.lease_id: LeaseStatus(LeaseState.RUNNING) for lease in leases}

    def bill(self, lease: Lease, ended_at: float) -> Bill:
        hours = max(0.0, ended_at - lease.started_at) / 3600.0
        return Bill(
            cost=hours * self.price_per_hour,
            on_demand_cost=hours * self.on_demand_price_per_hour,
            capacity_seconds=hours * 3600.0,
        )

    def capacity_seconds(self, wall_seconds: float) -> float:
        return wall_seconds

    def terminate(self, lease: Lease) -> None:
        """The engine owns the worker: nothing to release."""

    def close(self) -> None:
        pass
