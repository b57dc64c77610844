"""The provider protocol: the only way the controller touches capacity.

A provider turns a ranked pool and a launch spec into a ``Lease``, reports what became
of its leases (batched, so a cloud provider can answer many leases with one describe
call), bills them, and terminates them. Launch failures for lack of capacity raise
``CapacityUnavailable``; everything else is translated at the edge into a ``SpotError``
whose message says what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Mapping, Protocol, Sequence

from spot_core.model import Lease, Pool


@dataclass(frozen=True)
class LaunchSpec:
    """What to run for one attempt, and what it needs to know about itself.

    ``image``: run ``command`` in this container image (Docker on the machine that runs
    the step; see ``spot_core.container``) instead of directly on the machine.
    ``heartbeat_timeout_seconds``: the provider passes it to the node's watcher
    (``SPOT_HEARTBEAT_TIMEOUT``), which ends the lease once the driver stops renewing.
    """

    job_id: str
    attempt: int
    command: tuple[str, ...]
    checkpoint_uri: str
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    image: str | None = None
    # Seconds the step may outlive a silent driver: the node's watcher ends the lease when
    # the job's heartbeat (``spot_core.checkpoint.heartbeat``) is older. None: never.
    heartbeat_timeout_seconds: float | None = None


class LeaseState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"          # the step's process ended by itself (any exit code)
    RECLAIMED = "reclaimed"    # the capacity was taken away after its notice period
    TERMINATED = "terminated"  # we terminated it


@dataclass(frozen=True)
class LeaseStatus:
    """What a provider observed of one lease at one moment."""

    state: LeaseState
    exit_code: int | None = None
    notice_at: float | None = None   # when an interruption notice was first served, if ever
    ended_at: float | None = None
    message: str = ""
    # A provider that reads why its lease ended better than an exit code can says so here
    # (an ``Outcome`` value): the kubernetes provider's pod classifier, which decides a
    # disruption before the exit code (a step that exits 0 on the kubelet's SIGTERM was cut
    # short, not done). None: the controller classifies from the state and exit code.
    outcome: str | None = None

    @property
    def ended(self) -> bool:
        return self.state is not LeaseState.RUNNING


@dataclass(frozen=True)
class Observation:
    """One lease as a describe made elsewhere saw it (``spot_core.observer``, which batches
    many leases into one call): its ``status`` (None: the provider did not report the
    lease) or the ``error`` that describe raised, and ``at``, when the describe began.
    The controller reads it as if it had observed the lease itself."""

    lease_id: str
    status: LeaseStatus | None = None
    error: BaseException | None = None
    at: float = 0.0

    def result(self) -> LeaseStatus | None:
        """The status, or the describe's error raised here, for the one who reads it."""
        if self.error is not None:
            raise self.error
        return self.status


@dataclass(frozen=True)
class Bill:
    """Cost of a lease over its life, and what on-demand would have cost for the same time.

    ``capacity_seconds`` is the lease's duration in the provider's clock (the local spot
    cloud replays traces faster than real time; a cloud provider's scale is 1).
    ``data_transfer_cost`` is the part of ``cost`` paid to move data to the lease (a
    checkpoint read from another region), shown on its own in the ledger.
    """

    cost: float
    on_demand_cost: float
    capacity_seconds: float
    data_transfer_cost: float = 0.0


class Provider(Protocol):
    """``market`` answers offers for the provider's pools (a trace market, the EC2 market);
    ``options`` are JSON-able, hold no credential, and reopen the provider elsewhere via
    ``open_provider`` (with that process's own ``session``, resolved from the engine's
    connection or block). A provider that reaches its cloud with particular credentials
    may also have ``open_store(uri)``, which the controller then uses for its jobs'
    checkpoint stores."""

    name: str
    market: Any
    options: Mapping[str, Any]

    def pools(self) -> tuple[Pool, ...]:
        """The spot pools this provider can launch in, ranked by nothing in particular."""

    def launch(self, spec: LaunchSpec, pool: Pool) -> Lease:
        """Start the attempt on ``pool``; raise ``CapacityUnavailable`` if it has none."""

    def observe(self, leases: Sequence[Lease]) -> dict[str, LeaseStatus]:
        """Status per lease id, for many leases at once."""

    def bill(self, lease: Lease, ended_at: float) -> Bill:
        """What the lease cost from its start to ``ended_at`` (wall-clock POSIX seconds)."""

    def capacity_seconds(self, wall_seconds: float) -> float:
        """Convert a wall-clock duration into the provider's capacity time."""

    def terminate(self, lease: Lease) -> None:
        """Release the lease; idempotent; never raises for an already-gone lease."""

    def close(self) -> None:
        """Terminate every lease this provider launched and release its resources."""
