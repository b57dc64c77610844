"""1,000 SpotJobTriggers in one event loop, as in a busy triggerer: each poll's checks run
in a handful of thread hops (not one per trigger), every job's heartbeat is renewed in
its own store, and every job still ends as its lease ended."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from airflow_spot.triggers.spot import SpotJobTrigger
from spot_core import batched
from spot_core.checkpoint import open_store
from spot_core.checkpoint.heartbeat import Heartbeat
from spot_core.controller import Controller, Next
from spot_core.model import Attempt, JobRecord, Lease, Market, Outcome, Pool
from spot_core.observer import SharedObserver
from spot_core.providers.base import Bill, LeaseState, LeaseStatus
from spot_core.settings import SpotSettings

pytestmark = pytest.mark.timeout(240)
JOBS = 1000
POLL = 0.25
POOL = Pool("aws", "us-east-1", "us-east-1a", "g5.xlarge", Market.SPOT)


class Leases:
    """An in-memory provider: every lease runs until ``end_all``; then even jobs' steps
    have exited 0 and odd jobs' capacity was reclaimed."""

    name = "fake"

    def __init__(self) -> None:
        self.ended_at: float | None = None
        self.terminated: set[str] = set()
        self._lock = threading.Lock()

    def observe(self, leases):
        return {lease.lease_id: self._status(lease) for lease in leases}

    def _status(self, lease: Lease) -> LeaseStatus:
        if self.ended_at is None:
            return LeaseStatus(LeaseState.RUNNING)
        if int(lease.job_id.split("-")[1]) % 2 == 0:
            return LeaseStatus(LeaseState.EXITED, exit_code=0, ended_at=self.ended_at)
        return LeaseStatus(
            LeaseState.RECLAIMED,
            notice_at=self.ended_at,
            ended_at=self.ended_at,
            message="reclaimed",
        )

    def terminate(self, lease: Lease) -> None:
        with self._lock:
            self.terminated.add(lease.lease_id)

    def bill(self, lease: Lease, ended_at: float) -> Bill:
        return Bill(cost=0.1, on_demand_cost=0.3, capacity_seconds=ended_at - lease.started_at)

    def capacity_seconds(self, seconds: float) -> float:
        return seconds


def _watch_next(index: int, uri: str, now: float) -> Next:
    lease = Lease(f"lease-{index}", POOL, f"job-{index}", 1, now, 1.0)
    record = JobRecord(job_id=lease.job_id, created_at=now, checkpoint_uri=uri)
    record = record.start_attempt(
        Attempt(number=1, pool=POOL, started_at=now, lease_id=lease.lease_id, lease=lease.to_dict())
    )
    return Next("watch", record, until=now + 3600, lease=lease)


def test_a_thousand_triggers_check_in_a_few_hops_per_poll_and_all_end_right(tmp_path, monkeypatch):
    provider, observer = Leases(), None
    observer = SharedObserver(provider)
    options = {"poll_interval": POLL, "heartbeat_timeout": 60.0}
    monkeypatch.setattr(
        SpotJobTrigger,
        "_open",
        lambda self: (
            Controller(
                provider,
                market=None,
                stores=open_store,
                **SpotSettings.build(**options).controller_options(),
            ),
            observer,
        ),
    )
    now = time.time()
    uris = [(tmp_path / f"store-{i}").as_uri() for i in range(JOBS)]
    triggers = [
        SpotJobTrigger(
            provider="local",
            provider_options={},
            return_on_notice=False,
            next=_watch_next(i, uri, now).to_dict(),
            checkpoint_uri=uri,
            controller_options=options,
        )
        for i, uri in enumerate(uris)
    ]

    async def main():
        async def first(trigger):
            async for event in trigger.run():
                return event.payload

        tasks = [asyncio.create_task(first(t)) for t in triggers]
        batcher = batched.batcher_for()
        while batcher.calls < 3 * JOBS:  # a few polls of watching
            await asyncio.sleep(0.05)
        provider.ended_at = time.time()
        events = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        return batcher.hops, batcher.calls, observer.polls, events

    hops, calls, polls, events = asyncio.run(main())
    observer.close()

    assert calls >= 3 * JOBS, (calls, polls)  # every trigger checked while running, and at its end
    # Before batching each check was its own hop (calls == hops); a poll's checks now
    # share hops of up to MAX_BATCH (stragglers of a poll can make a small extra one).
    assert hops <= 2 * calls / batched.MAX_BATCH + polls, (
        f"{hops} thread hops for {calls} checks in {polls} polls: one hop per trigger?"
    )
    for uri in uris:  # each job's heartbeat is in its own store
        beat = Heartbeat(open_store(uri)).read()
        assert beat is not None and beat.attempt == 1, uri
    for index, event in enumerate(events):
        assert event["status"] == "ended", event
        record = Next.from_dict(event["next"]).record
        assert record.job_id == f"job-{index}" and record.current_attempt is None
        assert record.attempts[-1].outcome == (
            Outcome.SUCCEEDED if index % 2 == 0 else Outcome.PREEMPTED
        ), record.attempts[-1]
    assert len(provider.terminated) == JOBS  # every ended lease was terminated (idempotent)
