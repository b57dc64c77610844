"""Launching an attempt: the ranked pools tried in order, and the record of a round in
which none had capacity."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from spot_core.errors import SpotError
from spot_core.model import Attempt, JobRecord, Lease, Outcome, Pool
from spot_core.policy.retry import Decision
from spot_core.providers.base import LaunchSpec, Provider


def launch_first(
    provider: Provider,
    pools: Sequence[Pool],
    launch: LaunchSpec,
    intervals: Mapping[str, float] | None,
    with_interval: Callable[[LaunchSpec, Pool, Mapping[str, float] | None], LaunchSpec],
) -> tuple[Lease | None, list[str], bool]:
    """Try the ranked pools in order; the first with capacity wins.

    Errors are read as data: a capacity miss moves to the next pool, another retryable
    error (a cloud API failure) too, but marks the round an infrastructure failure; a
    non-retryable one (bad configuration) is raised: no pool can fix it.
    """
    problems: list[str] = []
    failure = False
    for pool in pools:
        try:
            return (
                provider.launch(with_interval(launch, pool, intervals), pool),
                problems,
                failure,
            )
        except SpotError as exc:
            if not exc.retryable:
                raise
            failure = failure or exc.outcome != str(Outcome.CAPACITY_UNAVAILABLE)
            problems.append(f"{pool.key}: {exc}")
    return None, problems, failure


def closed_without_lease(
    record: JobRecord,
    number: int,
    decision: Decision,
    start_step: int | None,
    problems: list[str],
    outcome: Outcome,
    now: float,
) -> JobRecord:
    """``record`` with attempt ``number`` opened and closed at once: no pool launched it
    (``outcome``: capacity_unavailable, or infrastructure_failed when an API failed)."""
    pool = decision.pools[0]  # a launch decision names at least one pool
    running = Attempt(number=number, pool=pool, started_at=now, checkpoint_step_start=start_step)
    finished = dataclasses.replace(
        running,
        ended_at=now,
        outcome=outcome,
        checkpoint_step_end=start_step,
        message="; ".join(problems)[:500],
    )
    return record.start_attempt(running).finish_attempt(finished)
