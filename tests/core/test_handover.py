"""Handover on the local cloud: the replacement is launched on the notice, beside the old
attempt, resumes from that attempt's emergency checkpoint, and the old attempt (a zombie
of it) can no longer save once the replacement took over. Every lease ends on every path.

Driven through ``Controller.run`` and the resumable API, as every engine does; the step is
``handover_step.py``, whose emergency save takes a second and a half (a big model's), so
the old lease outlives the notice.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from spot_core.checkpoint import open_store
from spot_core.checkpoint.handover import launched_key, mark_launched, read_launched
from spot_core.checkpoint.resumed import read_resumed
from spot_core.controller import (
    Controller,
    JobSpec,
    Replacement,
    ReplacementState,
    handover_mode,
)
from spot_core.errors import ConfigError, FencedOut
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import JobStatus, Outcome
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import open_provider
from spot_core.providers.in_place import InPlaceProvider
from tests.support import SUPPORT
from tests.support.spot_helpers import marked_processes, trace, wait_until

pytestmark = pytest.mark.timeout(120)
STEP = SUPPORT / "handover_step.py"
STEPS, STEP_SECONDS, SAVE_SECONDS = 300, 0.02, 1.5
# Zone a is reclaimed at tick 3 (3 s at 60x) with a 2 s notice; zone b comes up at tick 2.
ZONES = {"us-east-1a_v100_1": "111" + "0" * 400, "us-east-1b_v100_1": "00" + "1" * 400}
POLICY = RetryPolicy(max_preemptions=3, capacity_wait_seconds=0.5, on_demand_fallback=False)


def _job(tmp_path: Path, provider, result: Path) -> JobSpec:
    command = (sys.executable, str(STEP), str(STEPS), str(STEP_SECONDS), str(SAVE_SECONDS))
    return JobSpec(
        "job-handover",
        (*command, str(result)),
        (tmp_path / "ckpt").as_uri(),
        provider.pools(),
    )


def _cloud(tmp_path: Path) -> LocalCloudServer:
    return LocalCloudServer.from_traces(
        [trace(name, pattern) for name, pattern in ZONES.items()],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=2.0),
    )


def _run(tmp_path: Path, handover: str):
    result = tmp_path / "result.json"
    with _cloud(tmp_path) as server:
        provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        spec = _job(tmp_path, provider, result)
        controller = Controller(
            provider,
            provider.market,
            POLICY,
            poll_interval_seconds=0.05,
            heartbeat_timeout_seconds=30.0,
            handover=handover,
        )
        record = controller.run(spec)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15), (
            "a lease process outlived its attempt"
        )
    return record, open_store(spec.checkpoint_uri), json.loads(result.read_text())


def test_on_notice_the_replacement_starts_beside_the_old_attempt_and_resumes_its_emergency_save(
    tmp_path,
):
    record, store, result = _run(tmp_path, "on_notice")
    assert record.status is JobStatus.SUCCEEDED, [a.message for a in record.attempts]
    old, new = record.attempts[0], record.attempts[1]
    assert old.outcome is Outcome.PREEMPTED and new.outcome is Outcome.SUCCEEDED
    # launched before the old lease ended, and adopted once it had
    assert new.started_at < old.ended_at
    assert old.replacement is not None and old.replacement["state"] == "adopted"
    assert old.replacement["attempt"] == new.number
    # resumed from the old attempt's emergency checkpoint, not an older one
    emergency = [r for r in store.list() if r.attempt == old.number and "emergency" in r.metadata]
    assert len(emergency) == 1
    resumed = read_resumed(store, new.number)
    assert resumed is not None and resumed.step == emergency[0].step
    assert new.checkpoint_step_start == emergency[0].step
    assert old.lost_work_seconds == 0.0  # it stopped at its emergency save: nothing to redo
    assert result["total"] == sum(range(STEPS))  # no step lost or done twice
    # a zombie of the old attempt cannot save after the handover
    with pytest.raises(FencedOut):
        store.save(STEPS + 1, {"state.json": b"{}"}, attempt=old.number)
    assert record.preemptions == 1 and len(record.time_to_resume_seconds) == 1


def test_off_launches_the_replacement_only_after_the_old_lease_ended(tmp_path):
    record, store, result = _run(tmp_path, "off")
    assert record.status is JobStatus.SUCCEEDED, [a.message for a in record.attempts]
    old, new = record.attempts[0], record.attempts[1]
    assert old.outcome is Outcome.PREEMPTED and old.replacement is None
    assert new.started_at >= old.ended_at
    assert result["total"] == sum(range(STEPS))


def test_a_driver_stopped_during_a_handover_ends_both_leases(tmp_path):
    """The driver is told to stop (killed, cancelled) while two leases run: both end, the
    record says so, and no process of either is left."""
    result = tmp_path / "result.json"
    with _cloud(tmp_path) as server:
        provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        spec = _job(tmp_path, provider, result)
        controller = Controller(
            provider, provider.market, POLICY, heartbeat_timeout_seconds=None, handover="on_notice"
        )
        nxt = controller.advance(spec, controller.persist(controller.new_record(spec)))
        give_up = time.monotonic() + 60
        while nxt.action == "watch" and time.monotonic() < give_up:
            running = nxt.record.current_attempt
            if running is not None and running.replacement is not None:
                break
            time.sleep(0.05)
            nxt = controller.check(spec, nxt)
        running = nxt.record.current_attempt
        assert running is not None and running.replacement is not None, nxt.reason
        record = controller.stop(spec, nxt.record, "stopped: the driver was killed")
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)
    old = record.attempts[-1]
    assert old.replacement["state"] == "terminated" and "ended unused" in old.message
    assert record.current_attempt is None and not result.exists()


def test_handover_defaults_to_what_the_provider_can_do(tmp_path):
    with _cloud(tmp_path) as server:
        local = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        assert handover_mode(local, None) == "on_notice"
    in_place = InPlaceProvider()
    assert handover_mode(in_place, None) == "off"
    with pytest.raises(ConfigError, match="set handover=off"):
        handover_mode(in_place, "on_notice")


def test_a_replacements_watcher_counts_the_old_attempts_beats_until_it_is_adopted():
    """Until the driver adopts the replacement it renews the old attempt's heartbeat: the
    replacement's node watcher counts those renewals (so a live driver keeps both leases)
    and nothing else, so a killed driver lets both time out."""
    from spot_core.checkpoint.heartbeat import Beat
    from spot_core.interruption.driver import Freshness

    fresh = Freshness(started_at=0.0, attempt=2, handover_from=1)
    fresh.observe(Beat(1, 0.0, 1), 1.0)
    fresh.observe(Beat(1, 0.0, 2), 5.0)  # the driver renewed the old attempt's beat
    assert fresh.age(6.0) == 1.0
    fresh.observe(Beat(3, 0.0, 3), 9.0)  # another attempt's beat proves nothing
    assert fresh.age(10.0) == 5.0
    plain = Freshness(started_at=0.0, attempt=2)
    plain.observe(Beat(1, 0.0, 1), 1.0)
    plain.observe(Beat(1, 0.0, 2), 5.0)
    assert plain.age(6.0) == 6.0  # without a handover the old attempt's beats do not count


class _Rebalancing:
    """The local provider, reporting a rebalance recommendation on every running lease
    once ``at`` has passed (as the EC2 provider does from EventBridge)."""

    def __init__(self, provider, at: float) -> None:
        self._provider, self._at = provider, at

    def __getattr__(self, name):
        return getattr(self._provider, name)

    def observe(self, leases):
        import dataclasses

        statuses = self._provider.observe(leases)
        if time.time() < self._at:
            return statuses
        return {
            lease_id: status if status.ended else dataclasses.replace(status, rebalance_at=self._at)
            for lease_id, status in statuses.items()
        }


def test_on_rebalance_the_old_attempt_is_not_cut_short_and_an_unused_replacement_ends(tmp_path):
    """A rebalance recommendation with no reclaim after it: the replacement is launched on
    it and waits; the old attempt finishes its work (never fenced out by the waiting
    replacement), and the replacement is ended unused and billed to the attempt."""
    result = tmp_path / "result.json"
    zones = {"us-east-1a_v100_1": "1" * 400, "us-east-1b_v100_1": "1" * 400}
    with LocalCloudServer.from_traces(
        [trace(name, pattern) for name, pattern in zones.items()],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
    ) as server:
        local = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        provider = _Rebalancing(local, time.time() + 1.5)
        spec = _job(tmp_path, local, result)
        controller = Controller(
            provider,
            local.market,
            POLICY,
            poll_interval_seconds=0.05,
            heartbeat_timeout_seconds=None,
            handover="on_rebalance",
        )
        record = controller.run(spec)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)
    assert record.status is JobStatus.SUCCEEDED and len(record.attempts) == 1
    only = record.attempts[0]
    assert only.outcome is Outcome.SUCCEEDED and only.replacement["state"] == "terminated"
    assert "ended unused" in only.message
    assert json.loads(result.read_text())["total"] == sum(range(STEPS))


LEASE = {
    "lease_id": "i-local-2",
    "pool": {
        "cloud": "aws",
        "region": "us-east-1",
        "zone": "us-east-1a",
        "instance_type": "p3.2xlarge",
        "market": "spot",
    },
    "job_id": "j",
    "attempt": 2,
    "started_at": 1.0e9,
    "price_per_hour": 0.9,
    "details": {},
}


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b'{"attempt": 2}',  # no lease
        json.dumps({"attempt": 1, "lease": LEASE}).encode(),  # not after the old attempt
        json.dumps({"attempt": True, "lease": LEASE}).encode(),
        json.dumps({"attempt": 2, "lease": {"lease_id": "i-1"}}).encode(),
    ],
    ids=["torn", "no-lease", "same-attempt", "bool-attempt", "bad-lease"],
)
def test_a_torn_or_forged_replacement_record_is_read_as_none(tmp_path, data):
    """What a restarted driver reads to record a replacement it launched (a trigger's):
    anything but a replacement of a later attempt with a lease is none (the job then
    relaunches after the end as without a handover), never a crash or a stray lease."""
    store = open_store((tmp_path / "ckpt").as_uri())
    assert read_launched(store, 1) is None
    store.put_object(launched_key(1), data)
    assert read_launched(store, 1) is None
    good = {"attempt": 2, "lease": LEASE, "state": "launched"}
    mark_launched(store, 1, good)
    assert read_launched(store, 1) == good


@pytest.mark.parametrize(
    ("report", "needed"),
    [
        ({"exit_code": 0, "notice_at": None}, False),  # it finished the work
        ({"exit_code": 143, "notice_at": 1.0e9}, True),  # reclaimed after a notice
        # reclaimed, its watcher missed the notice: the controller judges, the replacement
        # must be ready to be adopted
        ({"exit_code": 143, "notice_at": None}, True),
        ({"exit_code": 0, "notice_at": 1.0e9}, True),  # done on the notice: judged too
    ],
    ids=["finished", "reclaimed", "reclaimed-unseen", "done-on-the-notice"],
)
def test_a_replacement_launched_on_a_rebalance_stands_down_when_no_reclaim_came(
    tmp_path, report, needed
):
    """The old attempt's node reports its end: its step exited 0 with no notice, so nothing
    is to be taken over and the waiting replacement neither fences the store nor restores
    (it would run the job again after the attempt that finished it); any other end, it
    goes on (the controller judges the old attempt, and may adopt it)."""
    from spot_core.attempt_env import ATTEMPT, CHECKPOINT_URI, HANDOVER_DEADLINE, HANDOVER_FROM
    from spot_core.checkpoint import Checkpointer
    from spot_core.checkpoint.status import write_report
    from spot_core.errors import ReplacementNotNeeded

    uri = (tmp_path / "ckpt").as_uri()
    store = open_store(uri)
    store.fence(1)
    store.save(10, {"state.json": b"{}"}, {"rebalance": True}, attempt=1)
    write_report(ended_at=time.time(), **report, environ={CHECKPOINT_URI: uri, ATTEMPT: "1"})
    env = {
        CHECKPOINT_URI: uri,
        ATTEMPT: "2",
        HANDOVER_FROM: "1",
        HANDOVER_DEADLINE: f"{time.time() + 60:.3f}",
    }
    if needed:
        ckpt = Checkpointer.from_env(env)
        assert ckpt.restore()[0] == 10 and store.fence_level() == 2
        return
    with pytest.raises(ReplacementNotNeeded, match="no handover needed"):
        Checkpointer.from_env(env)
    assert store.fence_level() == 1
    store.save(20, {"state.json": b"{}"}, attempt=1)  # the old attempt may still save


def test_a_long_wait_polls_the_store_less_often(tmp_path):
    """A replacement launched on a rebalance may wait hours for a notice that never comes:
    after the first half minute (a notice's save is done well within it) it polls every
    half second instead of ten times a second, and still ends at the deadline."""
    from spot_core.checkpoint.handover import (
        FAST_POLL_WINDOW_SECONDS,
        POLL_SECONDS,
        SLOW_POLL_SECONDS,
        await_handover,
    )

    store = open_store((tmp_path / "ckpt").as_uri())
    now = [1000.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    handover = await_handover(
        store, old_attempt=1, deadline=1060.0, clock=lambda: now[0], sleep=sleep
    )
    assert "deadline passed" in handover.reason and handover.needed
    fast = [s for s in sleeps if s == POLL_SECONDS]
    slow = [s for s in sleeps if s == SLOW_POLL_SECONDS]
    assert len(fast) + len(slow) == len(sleeps)
    assert abs(len(fast) * POLL_SECONDS - FAST_POLL_WINDOW_SECONDS) <= POLL_SECONDS
    assert abs(len(slow) * SLOW_POLL_SECONDS - (60.0 - FAST_POLL_WINDOW_SECONDS)) <= 1.0


def test_the_go_is_written_once_and_a_torn_or_foreign_one_is_no_go(tmp_path):
    """The go a driver gives a waiting replacement (the Prefect worker's): a second go (a
    restarted worker's) changes nothing; a torn one, or one for another attempt, is no go
    (the replacement waits on, bounded), never a crash."""
    from spot_core.checkpoint.handover import go_key, mark_go, read_go

    store = open_store((tmp_path / "ckpt").as_uri())
    assert read_go(store, 1, 2) is None
    store.put_object(go_key(1), b"{torn")
    assert read_go(store, 1, 2) is None
    store.delete_object(go_key(1))
    assert mark_go(store, 1, 3, 100.0) and read_go(store, 1, 2) is None  # another attempt's
    store.delete_object(go_key(1))
    assert mark_go(store, 1, 2, 100.0)
    assert not mark_go(store, 1, 2, 200.0)  # written once
    assert read_go(store, 1, 2) == {"attempt": 2, "from": 1, "go_at": 100.0}


def test_a_stored_replacement_reads_back_in_the_same_json_form():
    """A JobRecord stored before the replacement was typed (``Attempt.replacement`` as the
    record's JSON mapping) reads as a ``Replacement`` and writes back key for key."""
    stored = {
        "attempt": 2,
        "lease": {
            "lease_id": "i-0abc",
            "pool": {
                "cloud": "local",
                "region": "r",
                "zone": "z",
                "instance_type": "t",
                "market": "spot",
            },
            "job_id": "job",
            "attempt": 2,
            "started_at": 1700000000.5,
            "price_per_hour": 0.25,
            "details": {"node": "n1"},
        },
        "launched_at": 1700000000.0,
        "state": "launched",
        "checkpoint_interval_seconds": 120.0,
        "reason": "cheapest spot pool",
    }
    replacement = Replacement.from_dict(json.loads(json.dumps(stored)))
    assert replacement.state is ReplacementState.LAUNCHED and replacement.attempt == 2
    assert json.dumps(replacement.to_dict()) == json.dumps(stored)
    adopted = replacement.with_state(ReplacementState.ADOPTED).to_dict()
    assert adopted == {**stored, "state": "adopted"}


def test_a_stored_replacement_of_an_unknown_state_is_read_as_none(caplog):
    """The typed Replacement refuses a state no writer of ours makes; a driver that reads
    such an object from the store (its own launch, before it was recorded) warns and
    relaunches after the end as without a handover, never raises."""
    from spot_core.lifecycle.handover import _readable

    assert _readable({"attempt": 2, "lease": LEASE, "state": "launched"}, 1) is not None
    assert _readable({"attempt": 2, "lease": LEASE, "state": "exploded"}, 1) is None
    assert _readable(None, 1) is None
    assert "unreadable replacement record" in caplog.text
