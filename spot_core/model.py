"""The job's data model: pools, offers, leases, attempts and the JobRecord.

Everything here is a frozen dataclass with a lossless JSON round trip, because the
record lives in the workflow engine (Airflow's task state store and XCom, Prefect's
results and artifacts) and never on the node that can vanish. Times are POSIX seconds
(floats); money is US dollars; durations are seconds.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, overload

from spot_core.bounds import MAX_PRICE
from spot_core.errors import ConfigError

RECORD_SCHEMA_VERSION = 1
MAX_PRICE_PER_HOUR = MAX_PRICE
"""The highest $/h any price source may give (traces, price files, provider options).
The dearest instances cost about $100/h; a bound keeps every bill finite (a price of
1e308 made the record's cost Infinity, which no JSON reader accepts)."""


class Market(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class Outcome(StrEnum):
    """How an attempt ended. Only ``USER_FAILED`` consumes the engine's own retries."""

    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"
    CAPACITY_UNAVAILABLE = "capacity_unavailable"
    USER_FAILED = "user_failed"
    INFRASTRUCTURE_FAILED = "infrastructure_failed"
    # The controller ended the attempt itself, with an emergency checkpoint, to move the
    # job somewhere cheaper (back to spot from on-demand): counted in no budget.
    DRAINED = "drained"
    # The cluster took the capacity back on purpose, not the cloud: Karpenter consolidation,
    # drift or expiration, a cluster-autoscaler scale-down, a node drain for an upgrade.
    # Resumed from the checkpoint like a preemption, on its own budget (max_disruptions),
    # and never a reason by itself to move the job to on-demand.
    DISRUPTED = "disrupted"
    # The job's deadline passed while the attempt ran: the controller stopped it. Not the
    # infrastructure's failure nor the step's, so it spends no budget; the job ends
    # ``deadline_missed`` too.
    DEADLINE_MISSED = "deadline_missed"

    @property
    def consumes_user_retry(self) -> bool:
        return self is Outcome.USER_FAILED


class JobStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEADLINE_MISSED = "deadline_missed"


@dataclass(frozen=True)
class Pool:
    """One kind of capacity: where it is, what it is, and which market it is bought on."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    market: Market = Market.SPOT

    @property
    def key(self) -> str:
        return f"{self.cloud}/{self.region}/{self.zone}/{self.instance_type}/{self.market}"

    @property
    def is_spot(self) -> bool:
        return self.market is Market.SPOT

    def on(self, market: Market) -> Pool:
        """The same place and instance type on another market."""
        return dataclasses.replace(self, market=Market(market))

    def to_dict(self) -> dict[str, Any]:
        return {
            "cloud": self.cloud,
            "region": self.region,
            "zone": self.zone,
            "instance_type": self.instance_type,
            "market": str(self.market),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pool:
        return cls(
            cloud=data["cloud"],
            region=data["region"],
            zone=data["zone"],
            instance_type=data["instance_type"],
            market=Market(data["market"]),
        )


@dataclass(frozen=True)
class Offer:
    """What a market says about a pool at one moment: price and whether it has capacity."""

    pool: Pool
    price_per_hour: float
    on_demand_price_per_hour: float
    available: bool
    observed_at: float
    interruption_band: str | None = None

    @property
    def discount(self) -> float:
        """Fraction saved against on-demand (0.7 means 70% cheaper)."""
        if self.on_demand_price_per_hour <= 0:
            return 0.0
        return 1.0 - self.price_per_hour / self.on_demand_price_per_hour


@dataclass(frozen=True)
class Lease:
    """One piece of capacity held for one attempt of one job."""

    lease_id: str
    pool: Pool
    job_id: str
    attempt: int
    started_at: float
    price_per_hour: float
    details: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lease_id": self.lease_id,
            "pool": self.pool.to_dict(),
            "job_id": self.job_id,
            "attempt": self.attempt,
            "started_at": self.started_at,
            "price_per_hour": self.price_per_hour,
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lease:
        return cls(
            lease_id=data["lease_id"],
            pool=Pool.from_dict(data["pool"]),
            job_id=data["job_id"],
            attempt=int(data["attempt"]),
            started_at=float(data["started_at"]),
            price_per_hour=float(data["price_per_hour"]),
            details=dict(data.get("details", {})),
        )


@dataclass(frozen=True)
class CheckpointRef:
    """Names one committed checkpoint in a store; enough to load it from anywhere."""

    store_uri: str
    checkpoint_id: str
    step: int
    attempt: int
    created_at: float
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "store_uri": self.store_uri,
            "checkpoint_id": self.checkpoint_id,
            "step": self.step,
            "attempt": self.attempt,
            "created_at": self.created_at,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckpointRef:
        return cls(
            store_uri=data["store_uri"],
            checkpoint_id=data["checkpoint_id"],
            step=int(data["step"]),
            attempt=int(data["attempt"]),
            created_at=float(data["created_at"]),
            metadata=dict(data.get("metadata", {})),
        )


@dataclass(frozen=True)
class Attempt:
    """One try of a job on one lease, from launch to its outcome."""

    number: int
    pool: Pool
    started_at: float
    lease_id: str | None = None
    ended_at: float | None = None
    outcome: Outcome | None = None
    cost: float = 0.0
    on_demand_cost: float = 0.0
    checkpoint_step_start: int | None = None
    checkpoint_step_end: int | None = None
    lost_work_seconds: float = 0.0
    checkpoint_overhead_seconds: float = 0.0
    message: str = ""
    # Part of ``cost``: moving the checkpoint to this attempt's region (cross-region moves).
    data_transfer_cost: float = 0.0
    # The lease as launched (``Lease.to_dict()``): any driver, in any process, can watch,
    # bill and terminate the attempt from the record alone.
    lease: Mapping[str, Any] | None = None
    # The time-based checkpoint interval the attempt was given for its pool (Young/Daly
    # from the pool's interruption rate and the job's measured save cost), in the pool's
    # capacity seconds like ``lost_work_seconds``; None: none was given.
    checkpoint_interval_seconds: float | None = None
    # When the controller asked the attempt to checkpoint and stop so the job could move
    # (a voluntary drain); its end is then ``drained``, whatever the lease reports.
    drain_requested_at: float | None = None
    # When the first interruption notice was seen (POSIX time), if any: the UI's notice mark.
    notice_at: float | None = None
    # When the attempt's step had restored and made its first step (POSIX time), as its
    # Checkpointer reported through the store; None: not reported (an old record, a step
    # without a Checkpointer, or one that never made a step).
    resumed_at: float | None = None
    # The next attempt, launched on this one's notice while it still ran (the handover
    # setting): ``attempt`` (its number), ``lease`` (``Lease.to_dict()``), ``launched_at``,
    # ``state`` (launched, adopted once this attempt closed and it became the running one,
    # or terminated when this attempt did not end in an interruption). In the record so
    # any driver, in any process, can adopt or end it: two leases are never untracked.
    replacement: Mapping[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def lease_of(self, job_id: str) -> Lease | None:
        """The attempt's lease (rebuilt from the record), or None if it never had one."""
        if self.lease is not None:
            return Lease.from_dict(self.lease)
        if self.lease_id is None:
            return None
        return Lease(
            lease_id=self.lease_id,
            pool=self.pool,
            job_id=job_id,
            attempt=self.number,
            started_at=self.started_at,
            price_per_hour=0.0,
        )

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["pool"] = self.pool.to_dict()
        data["outcome"] = None if self.outcome is None else str(self.outcome)
        data["lease"] = None if self.lease is None else dict(self.lease)
        data["replacement"] = None if self.replacement is None else dict(self.replacement)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Attempt:
        values = {k: v for k, v in data.items() if k not in _ATTEMPT_DERIVED}
        values["pool"] = Pool.from_dict(values["pool"])
        values["outcome"] = None if values.get("outcome") is None else Outcome(values["outcome"])
        for name in _ATTEMPT_REALS:
            if name in values:
                values[name] = _real(values[name], name, optional=name in _ATTEMPT_OPTIONAL)
        for name in _ATTEMPT_WHOLES:
            if name in values:
                values[name] = _whole(values[name], name, optional=name != "number")
        return cls(**values)


_ATTEMPT_REALS = (
    "started_at",
    "ended_at",
    "cost",
    "on_demand_cost",
    "lost_work_seconds",
    "checkpoint_overhead_seconds",
    "data_transfer_cost",
    "checkpoint_interval_seconds",
    "drain_requested_at",
    "notice_at",
    "resumed_at",
)
_ATTEMPT_OPTIONAL = (
    "ended_at",
    "notice_at",
    "checkpoint_interval_seconds",
    "drain_requested_at",
    "resumed_at",
)
# Derived views written beside an attempt's fields for readers of the JSON; not fields.
_ATTEMPT_DERIVED = ("time_to_resume_seconds",)
# Outcomes after which the next attempt resumes the job: the capacity went away (or the
# controller moved the job), not the step's own end.
INTERRUPTED = (Outcome.PREEMPTED, Outcome.DISRUPTED, Outcome.DRAINED)
_ATTEMPT_WHOLES = ("number", "checkpoint_step_start", "checkpoint_step_end")


def _non_finite(data: Any, path: str = "") -> str:
    """Where the first NaN or Infinity in ``data`` is, e.g. ``attempts[0].cost=inf``."""
    if isinstance(data, float) and not math.isfinite(data):
        return f"{path}={data}"
    items = (
        data.items()
        if isinstance(data, Mapping)
        else enumerate(data)
        if isinstance(data, (list, tuple))
        else ()
    )
    for key, value in items:
        found = _non_finite(
            value,
            f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key),
        )
        if found:
            return found
    return ""


@overload
def _real(value: Any, name: str, *, optional: Literal[False] = False) -> float: ...
@overload
def _real(value: Any, name: str, *, optional: bool) -> float | None: ...
def _real(value: Any, name: str, *, optional: bool = False) -> float | None:
    """A finite number read back from a record (no strings, bools, NaN or Infinity)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not a finite number")
    return float(value)


@overload
def _whole(value: Any, name: str, *, optional: Literal[False] = False) -> int: ...
@overload
def _whole(value: Any, name: str, *, optional: bool) -> int | None: ...
def _whole(value: Any, name: str, *, optional: bool = False) -> int | None:
    """A whole number read back from a record (no strings, bools or fractions)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} is not a whole number")
    return value


def _scale(value: Any) -> float:
    """A record's ``time_scale``: a finite number above 0."""
    scale = _real(value, "time_scale")
    if scale <= 0:
        raise ValueError(f"time_scale={value!r} is not above 0")
    return scale


@dataclass(frozen=True)
class CostLedger:
    """Money and time accounting for one job, summed over its attempts."""

    spent: float = 0.0
    on_demand_equivalent: float = 0.0
    lost_work_seconds: float = 0.0
    checkpoint_overhead_seconds: float = 0.0
    data_transfer_cost: float = 0.0

    @property
    def saved(self) -> float:
        return self.on_demand_equivalent - self.spent

    @property
    def savings_fraction(self) -> float:
        if self.on_demand_equivalent <= 0:
            return 0.0
        return self.saved / self.on_demand_equivalent

    def add(self, attempt: Attempt) -> CostLedger:
        return dataclasses.replace(
            self,
            spent=self.spent + attempt.cost,
            on_demand_equivalent=self.on_demand_equivalent + attempt.on_demand_cost,
            lost_work_seconds=self.lost_work_seconds + attempt.lost_work_seconds,
            checkpoint_overhead_seconds=self.checkpoint_overhead_seconds
            + attempt.checkpoint_overhead_seconds,
            data_transfer_cost=self.data_transfer_cost + attempt.data_transfer_cost,
        )

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["saved"] = self.saved
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostLedger:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: _real(v, f"ledger.{k}") for k, v in data.items() if k in names})


@dataclass(frozen=True)
class JobRecord:
    """Everything any decision about a job needs; lives in the engine between attempts."""

    job_id: str
    created_at: float
    status: JobStatus = JobStatus.PENDING
    attempts: tuple[Attempt, ...] = ()
    preemptions: int = 0
    user_failures: int = 0
    infrastructure_failures: int = 0
    capacity_misses: int = 0
    disruptions: int = 0
    latest_checkpoint: CheckpointRef | None = None
    ledger: CostLedger = field(default_factory=CostLedger)
    # The job's deadline, a wall-clock POSIX time (``SpotSettings.deadline_spec``).
    deadline_at: float | None = None
    checkpoint_uri: str | None = None
    # The clock of the record's costs and durations: capacity seconds per wall second of
    # the provider that ran it (its ``capacity_seconds(1.0)``). 1 is wall time (EC2,
    # Kubernetes); a trace market replays faster (the local cloud's ``time_scale``, 3600 by
    # default: a wall second is billed as an hour). Clock times (``*_at``) are always wall.
    time_scale: float = 1.0

    # -- derived views -------------------------------------------------------------
    @property
    def current_attempt(self) -> Attempt | None:
        if self.attempts and not self.attempts[-1].finished:
            return self.attempts[-1]
        return None

    @property
    def next_attempt_number(self) -> int:
        return max((a.number for a in self.attempts), default=0) + 1

    @property
    def fallbacks(self) -> int:
        """How many times the job moved from spot to on-demand."""
        markets = [a.pool.market for a in self.attempts]
        return sum(
            1
            for prev, cur in itertools.pairwise(markets)
            if prev is Market.SPOT and cur is Market.ON_DEMAND
        )

    def interrupted_before(self, attempt: Attempt) -> Attempt | None:
        """The launched attempt before ``attempt`` when it was interrupted (preempted,
        disrupted, drained), else None. Attempts that never got a lease (capacity misses)
        in between are skipped: the job was still down."""
        earlier = [a for a in self.attempts if a.number < attempt.number and a.lease_id]
        if not earlier or earlier[-1].outcome not in INTERRUPTED:
            return None
        return earlier[-1]

    def time_to_resume(self, attempt: Attempt) -> float | None:
        """Wall seconds from the interruption of the attempt before ``attempt`` (its first
        notice, else its end) to ``attempt``'s first step; None when ``attempt`` did not
        follow an interruption or did not report its resume. Can be negative only with
        clocks out of step; a handover that resumed before the old end is still >= 0
        from the notice."""
        if attempt.resumed_at is None:
            return None
        before = self.interrupted_before(attempt)
        if before is None:
            return None
        since = before.notice_at if before.notice_at is not None else before.ended_at
        if since is None:
            return None
        return attempt.resumed_at - since

    @property
    def saving_claimed(self) -> float | None:
        """What spot saved, when the job can claim it: None for a job that failed or
        missed its deadline (its spend bought nothing an on-demand run would have
        delivered, so there is no saving to show), else ``ledger.saved`` (so far, while
        it runs)."""
        if self.status in (JobStatus.FAILED, JobStatus.DEADLINE_MISSED):
            return None
        return self.ledger.saved

    @property
    def time_to_resume_seconds(self) -> list[float]:
        """One per resumed attempt (in order): what each reclaim cost in wall time."""
        found = (self.time_to_resume(a) for a in self.attempts)
        return [round(t, 3) for t in found if t is not None]

    # -- transitions (pure: each returns a new record) -----------------------------
    def start_attempt(self, attempt: Attempt) -> JobRecord:
        if self.current_attempt is not None:
            raise ValueError(
                f"job {self.job_id}: attempt {self.current_attempt.number} "
                "is still running; finish it before starting another"
            )
        return dataclasses.replace(
            self, attempts=self.attempts + (attempt,), status=JobStatus.RUNNING
        )

    def finish_attempt(self, finished: Attempt) -> JobRecord:
        """Close the running attempt and update counters and the ledger."""
        if self.current_attempt is None or self.current_attempt.number != finished.number:
            raise ValueError(f"job {self.job_id}: attempt {finished.number} is not running")
        if finished.outcome is None:
            raise ValueError("a finished attempt needs an outcome")
        counters = {
            Outcome.PREEMPTED: "preemptions",
            Outcome.USER_FAILED: "user_failures",
            Outcome.INFRASTRUCTURE_FAILED: "infrastructure_failures",
            Outcome.CAPACITY_UNAVAILABLE: "capacity_misses",
            Outcome.DISRUPTED: "disruptions",
        }
        changes: dict[str, Any] = {
            "attempts": self.attempts[:-1] + (finished,),
            "ledger": self.ledger.add(finished),
        }
        if finished.outcome in counters:
            name = counters[finished.outcome]
            changes[name] = getattr(self, name) + 1
        if finished.outcome is Outcome.SUCCEEDED:
            changes["status"] = JobStatus.SUCCEEDED
        return dataclasses.replace(self, **changes)

    def with_running(self, **changes: Any) -> JobRecord:
        """The running attempt with ``changes`` (e.g. a drain request) recorded."""
        running = self.current_attempt
        if running is None:
            raise ValueError(f"job {self.job_id}: no attempt is running")
        return dataclasses.replace(
            self, attempts=self.attempts[:-1] + (dataclasses.replace(running, **changes),)
        )

    def with_checkpoint(self, ref: CheckpointRef) -> JobRecord:
        if self.latest_checkpoint is not None and ref.step < self.latest_checkpoint.step:
            return self
        return dataclasses.replace(self, latest_checkpoint=ref)

    def with_status(self, status: JobStatus) -> JobRecord:
        return dataclasses.replace(self, status=JobStatus(status))

    # -- serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": RECORD_SCHEMA_VERSION,
            "job_id": self.job_id,
            "created_at": self.created_at,
            "status": str(self.status),
            "attempts": [self._attempt_dict(a) for a in self.attempts],
            "preemptions": self.preemptions,
            "user_failures": self.user_failures,
            "infrastructure_failures": self.infrastructure_failures,
            "capacity_misses": self.capacity_misses,
            "disruptions": self.disruptions,
            "latest_checkpoint": None
            if self.latest_checkpoint is None
            else self.latest_checkpoint.to_dict(),
            "ledger": self.ledger.to_dict(),
            # Persisted under its first name, so records read alike before and after.
            "deadline": self.deadline_at,
            "checkpoint_uri": self.checkpoint_uri,
            "time_scale": self.time_scale,
        }

    def _attempt_dict(self, attempt: Attempt) -> dict[str, Any]:
        data = attempt.to_dict()
        seconds = self.time_to_resume(attempt)
        if seconds is not None:
            data["time_to_resume_seconds"] = round(seconds, 3)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRecord:
        """The record from ``to_dict()``'s output. Anything else (another schema version,
        a truncated or hand-edited record, NaN) is one ConfigError naming what is wrong."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"JobRecord is a {type(data).__name__}, not a mapping; it was "
                "not written by spot-pipelines (pass JobRecord.to_dict())"
            )
        version = data.get("schema_version")
        if version != RECORD_SCHEMA_VERSION:
            raise ConfigError(
                f"JobRecord schema_version {version!r} is not supported (this "
                f"spot-pipelines reads version {RECORD_SCHEMA_VERSION}); upgrade "
                "spot-pipelines or start the job afresh"
            )
        try:
            checkpoint = data.get("latest_checkpoint")
            return cls(
                job_id=data["job_id"],
                created_at=_real(data["created_at"], "created_at"),
                status=JobStatus(data["status"]),
                attempts=tuple(Attempt.from_dict(a) for a in data["attempts"]),
                preemptions=_whole(data["preemptions"], "preemptions"),
                user_failures=_whole(data["user_failures"], "user_failures"),
                infrastructure_failures=_whole(
                    data["infrastructure_failures"], "infrastructure_failures"
                ),
                capacity_misses=_whole(data["capacity_misses"], "capacity_misses"),
                # absent from records written before voluntary disruptions had a budget
                disruptions=_whole(data.get("disruptions", 0), "disruptions"),
                latest_checkpoint=None
                if checkpoint is None
                else CheckpointRef.from_dict(checkpoint),
                ledger=CostLedger.from_dict(data["ledger"]),
                deadline_at=_real(
                    data.get("deadline", data.get("deadline_at")), "deadline", optional=True
                ),
                checkpoint_uri=data.get("checkpoint_uri"),
                # absent from records written before the record named its clock: wall
                time_scale=_scale(data.get("time_scale", 1.0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"JobRecord is malformed ({type(exc).__name__}: {exc}); it was not "
                "written by spot-pipelines or was edited by hand"
            ) from exc

    def to_json(self) -> str:
        """Strict JSON (no NaN or Infinity, which ``from_json`` and other readers refuse);
        a record holding one is a ConfigError naming the field, never unreadable text."""
        data = self.to_dict()
        try:
            return json.dumps(data, sort_keys=True, allow_nan=False)
        except ValueError:
            raise ConfigError(
                f"job {self.job_id}: the record holds a non-finite number "
                f"({_non_finite(data)}); a price or duration was out of range, "
                "so it cannot be written as JSON"
            ) from None

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"JobRecord is not valid JSON ({exc}); pass the text that "
                "JobRecord.to_json() produced"
            ) from exc
        return cls.from_dict(data)

    def summary(self) -> dict[str, Any]:
        """The small view an engine shows in its UI and passes downstream."""
        resumed = [
            a.checkpoint_step_start
            for a in self.attempts[1:]
            if a.checkpoint_step_start is not None
        ]
        return {
            "job_id": self.job_id,
            "status": str(self.status),
            "attempts": len(self.attempts),
            "preemptions": self.preemptions,
            "user_failures": self.user_failures,
            "disruptions": self.disruptions,
            "fallbacks": self.fallbacks,
            "resumed_from_steps": resumed,
            "spot_cost": round(self.ledger.spent, 6),
            "on_demand_cost": round(self.ledger.on_demand_equivalent, 6),
            "saved": round(self.ledger.saved, 6),
            "savings_fraction": round(self.ledger.savings_fraction, 6),
            "lost_work_seconds": round(self.ledger.lost_work_seconds, 3),
            "checkpoint_overhead_seconds": round(self.ledger.checkpoint_overhead_seconds, 3),
            "data_transfer_cost": round(self.ledger.data_transfer_cost, 6),
            "time_to_resume_seconds": self.time_to_resume_seconds,
            "latest_checkpoint_step": None
            if self.latest_checkpoint is None
            else self.latest_checkpoint.step,
        }
