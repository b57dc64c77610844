"""The handover: a replacement launched on the interruption notice, while the old attempt
saves, then adopted once the old attempt closed.

The replacement is a ``Replacement`` here; the record keeps it as the JSON mapping it always
had (``Attempt.replacement``: attempt, lease, launched_at, state, checkpoint interval,
reason), converted at the edge, so stored JobRecords read unchanged. Its states:
``launched`` (waiting for the old attempt), then ``adopted`` (it became the running
attempt) or ``terminated`` (the old attempt was not interrupted: it was ended unused).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from spot_core.attempt_env import HANDOVER_DEADLINE, HANDOVER_FROM
from spot_core.checkpoint import CheckpointStore
from spot_core.checkpoint.handover import (
    DEFAULT_NOTICE_SECONDS,
    forget_launched,
    mark_ended,
    mark_launched,
    read_launched,
)
from spot_core.errors import ConfigError
from spot_core.lifecycle.liveness import DriverLiveness
from spot_core.lifecycle.moves import Moves
from spot_core.lifecycle.types import JobSpec, Next
from spot_core.market.base import Market as PriceMarket
from spot_core.model import INTERRUPTED, Attempt, JobRecord, Lease, Outcome, Pool
from spot_core.policy.retry import Decision
from spot_core.providers.base import Capability, LaunchSpec, LeaseStatus, Provider
from spot_core.settings import HANDOVER_MODES

log = logging.getLogger(__name__)


class ReplacementState(StrEnum):
    """Where a replacement stands (its ``state`` in the record)."""

    LAUNCHED = "launched"  # waiting for the old attempt to close
    ADOPTED = "adopted"  # the running attempt now
    TERMINATED = "terminated"  # the old attempt was not interrupted: ended unused


@dataclass(frozen=True)
class Replacement:
    """The attempt launched on an attempt's notice (``Attempt.replacement`` typed)."""

    attempt: int
    lease: Lease
    launched_at: float
    state: ReplacementState
    checkpoint_interval_seconds: float | None
    reason: str
    # Keys a newer writer added: kept as they were, so reading a record never drops them.
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON form of it (as stored in ``Attempt.replacement``)."""
        return {
            "attempt": self.attempt,
            "lease": self.lease.to_dict(),
            "launched_at": self.launched_at,
            "state": self.state.value,
            "checkpoint_interval_seconds": self.checkpoint_interval_seconds,
            "reason": self.reason,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Replacement:
        """``to_dict()``'s output (or a record's ``Attempt.replacement``) back."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        interval = data.get("checkpoint_interval_seconds")
        return cls(
            attempt=int(data["attempt"]),
            lease=Lease.from_dict(data["lease"]),
            launched_at=float(data.get("launched_at", 0.0)),
            state=ReplacementState(data.get("state", ReplacementState.LAUNCHED)),
            checkpoint_interval_seconds=None if interval is None else float(interval),
            reason=str(data.get("reason", "")),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def with_state(self, state: ReplacementState) -> Replacement:
        return dataclasses.replace(self, state=state)


def _readable(launched: Mapping[str, Any] | None, attempt: int) -> Replacement | None:
    """The store's replacement object typed; None (warned) for one no writer of ours made
    (an unknown state): as ``read_launched`` reads a torn or forged one, the usual path
    relaunches after the end, never an exception in the driver."""
    if launched is None:
        return None
    try:
        return Replacement.from_dict(launched)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("attempt %d: unreadable replacement record (%s); ignored", attempt, exc)
        return None


def handover_mode(provider: Provider, handover: str | None) -> str:
    """The ``handover`` setting for ``provider``: its default (``on_notice`` where it can
    launch in parallel, else ``off``), or the one asked for if the provider can do it."""
    # A provider object that declares nothing (a test double, an old plugin) can do nothing
    # optional: no handover, rather than no controller.
    declared = getattr(provider, "capabilities", Capability.NONE)
    parallel = Capability.PARALLEL_LAUNCH in declared
    if handover is None:
        return "on_notice" if parallel else "off"
    if handover not in HANDOVER_MODES:
        raise ConfigError(f"handover={handover!r} is not one of {', '.join(HANDOVER_MODES)}")
    if handover != "off" and not parallel:
        raise ConfigError(
            f"handover={handover} needs a provider that can hold two leases of a job at "
            f"once; {provider.name} cannot (set handover=off)"
        )
    return handover


def pending_replacement(record: JobRecord) -> Mapping[str, Any] | None:
    """The replacement the last (closed) attempt launched and nobody adopted yet."""
    if not record.attempts or record.current_attempt is not None:
        return None
    replacement = record.attempts[-1].replacement
    if replacement is None or replacement.get("state") != ReplacementState.LAUNCHED:
        return None
    return replacement


class HandoverHost(Protocol):
    """What the handover uses of the controller that owns it."""

    provider: Provider
    market: PriceMarket | None
    stores: Callable[[str], CheckpointStore]
    attempt_timeout_seconds: float
    liveness: DriverLiveness
    moves: Moves

    def decide(self, spec: JobSpec, record: JobRecord, now: float | None = None) -> Decision: ...

    def _launch_spec(self, spec: JobSpec, number: int) -> LaunchSpec: ...

    def _launch_first(
        self,
        pools: Sequence[Pool],
        launch: LaunchSpec,
        intervals: Mapping[str, float] | None = None,
    ) -> tuple[Lease | None, list[str], bool]: ...

    def _end_by(self, lease: Lease) -> float: ...

    def _save(self, record: JobRecord, kind: str, detail: str) -> JobRecord: ...

    def _terminate(self, lease: Lease) -> None: ...


class Handover:
    """The handovers of one controller's jobs (it keeps no state: the record and the job's
    store hold it, so another driver can go on with a handover this one started)."""

    def __init__(self, host: HandoverHost) -> None:
        self.host = host

    def hand_over(
        self, spec: JobSpec, watch: Next, status: LeaseStatus, signal_at: float, now: float
    ) -> Next:
        """Launch the running attempt's replacement now, while it saves (``handover``).

        The policy decides where, as it would once the attempt ended preempted (it is asked
        with that record); its budgets are the same. The replacement is told which attempt
        it replaces and by when that one's capacity is gone: it prefetches, waits for the
        emergency checkpoint, then fences (``spot_core.checkpoint.handover``). The old
        attempt is left to finish its save; the record names both leases before anything
        else happens, and ``advance`` adopts the replacement once the old one is closed."""
        record = watch.record
        running = record.current_attempt
        if (
            running is None
            or running.replacement is not None
            or running.drain_requested_at is not None
            or self.host.market is None
            or not spec.command  # a watch-only spec (a trigger without the job's launch
            # spec, ``jobs.Relaunch``): the driver that launched the job hands over
            # A deadline policy's plan decides on the progress the emergency checkpoint is
            # about to prove: asked before that save, it could choose another market than
            # it will once the attempt closed, so such a job relaunches after the end.
            or self.host.moves.deadline_plan(spec, record) is not None
        ):
            return watch
        store = self.host.stores(spec.checkpoint_uri)
        launched = _readable(read_launched(store, running.number), running.number)
        if launched is not None:  # launched by a driver that restarted before recording it
            return self.record_replacement(watch, launched, running.number)
        try:
            ended = dataclasses.replace(
                running, ended_at=now, outcome=Outcome.PREEMPTED, notice_at=signal_at
            )
            decision = self.host.decide(spec, record.finish_attempt(ended), now)
        except Exception as exc:  # noqa: BLE001 - the usual path launches after the end
            log.warning("job %s: no handover (%s); relaunching after the end", spec.job_id, exc)
            return watch
        if decision.action != "launch":
            return watch  # the policy waits or settles: asked again once the attempt ends
        number = max(record.next_attempt_number, store.fence_level() + 1)
        deadline = status.reclaim_at or signal_at + DEFAULT_NOTICE_SECONDS
        if watch.notice_at is None:  # a rebalance: no reclaim is announced yet, so the
            # replacement waits for the old attempt's notice and save or its end, at most
            # the attempt's time limit (the second lease is the insurance's price)
            deadline = now + self.host.attempt_timeout_seconds
        launch = self.host._launch_spec(spec, number)
        handover_env = {HANDOVER_FROM: str(running.number), HANDOVER_DEADLINE: f"{deadline:.3f}"}
        launch = dataclasses.replace(launch, env={**launch.env, **handover_env})
        start_ref = record.latest_checkpoint
        intervals = {
            pool.key: self.host.moves.checkpoint_interval(pool, start_ref, now)
            for pool in decision.pools
        }
        lease, problems, _ = self.host._launch_first(decision.pools, launch, intervals)
        if lease is None:
            log.info("job %s: no capacity for a handover (%s)", spec.job_id, "; ".join(problems))
            return watch
        replacement = Replacement(
            attempt=number,
            lease=lease,
            launched_at=now,
            state=ReplacementState.LAUNCHED,
            checkpoint_interval_seconds=intervals.get(lease.pool.key),
            reason=decision.reason,
        )
        try:
            mark_launched(store, running.number, replacement.to_dict())
            return self.record_replacement(watch, replacement, running.number)
        except BaseException:
            self.host._terminate(lease)  # unrecorded: nobody else could end it
            forget_launched(store, running.number)
            raise

    def record_replacement(self, watch: Next, replacement: Replacement, old: int) -> Next:
        """The record names ``old``'s replacement before anything else happens."""
        lease = replacement.lease
        record = self.host._save(
            watch.record.with_running(replacement=replacement.to_dict()),
            "handover",
            f"attempt {replacement.attempt} launched on {lease.pool.key} on the "
            f"notice to attempt {old}",
        )
        return dataclasses.replace(watch, record=record)

    def adopt_replacement(self, spec: JobSpec, record: JobRecord, now: float) -> Next:
        """The closed attempt's replacement becomes the running attempt: the store is
        fenced at its number (the old attempt, closed, can no longer save: a zombie of it is
        refused) and it is watched like any launched attempt."""
        old = record.attempts[-1]
        replacement = Replacement.from_dict(old.replacement or {})
        lease = replacement.lease
        number = replacement.attempt
        store = self.host.stores(spec.checkpoint_uri)
        store.fence(number)
        self.host.liveness.renew_at_start(spec, number, now, store)
        adopted = replacement.with_state(ReplacementState.ADOPTED).to_dict()
        record = dataclasses.replace(
            record,
            attempts=record.attempts[:-1] + (dataclasses.replace(old, replacement=adopted),),
        )
        attempt = Attempt(
            number=number,
            pool=lease.pool,
            started_at=lease.started_at,
            lease_id=lease.lease_id,
            checkpoint_step_start=old.checkpoint_step_end,
            lease=lease.to_dict(),
            checkpoint_interval_seconds=replacement.checkpoint_interval_seconds,
        )
        reason = f"handover from attempt {old.number}: {replacement.reason}"
        record = self.host._save(record.start_attempt(attempt), "launched", reason)
        return Next("watch", record, until=self.host._end_by(lease), lease=lease, reason=reason)

    def end_replacement(self, spec: JobSpec, attempt: Attempt, now: float) -> Attempt:
        """An attempt that did not end in an interruption (it finished, or the driver was
        stopped) needs no replacement: end its lease and bill it to the attempt."""
        replacement = Replacement.from_dict(attempt.replacement or {})
        lease = replacement.lease
        self.host._terminate(lease)
        bill = self.host.provider.bill(lease, now)
        return dataclasses.replace(
            attempt,
            replacement=replacement.with_state(ReplacementState.TERMINATED).to_dict(),
            cost=attempt.cost + bill.cost,
            on_demand_cost=attempt.on_demand_cost + bill.on_demand_cost,
            message=(attempt.message + "; " if attempt.message else "")
            + f"its replacement (attempt {replacement.attempt}) was ended unused",
        )

    def close_handover(
        self, spec: JobSpec, store: CheckpointStore, finished: Attempt, now: float
    ) -> Attempt:
        """The old attempt of a handover closed: tell its waiting replacement to go on
        (``advance`` adopts it) or, when the attempt was not interrupted, end it."""
        if finished.outcome not in INTERRUPTED:
            return self.end_replacement(spec, finished, now)
        try:
            mark_ended(store, finished.number, finished.ended_at or now)
        except Exception as exc:  # noqa: BLE001 - it still goes on at the notice's deadline
            log.warning("job %s: could not tell the replacement to go on: %s", spec.job_id, exc)
        return finished
