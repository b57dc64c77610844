"""The attempt lifecycle table, through the controller's resumable API.

Each row drives one job with ``advance`` / ``check`` exactly as every engine driver does,
against the local cloud server behind a real HTTP proxy that can fail on purpose, and
checks how the attempts ended, what the record says, and that no lease is left running.
"""

from __future__ import annotations

import sys
import time

import pytest

from spot_core.controller import Controller, JobSpec, Next
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import JobStatus, Outcome
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import open_provider
from tests.support.fault_proxy import FaultProxy
from tests.support.spot_helpers import marked_processes, trace, train_command, wait_until

pytestmark = pytest.mark.timeout(120)
FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)
UP = "1" * 400
SLEEP = (sys.executable, "-c", "import time; time.sleep(60)")


def drive(controller: Controller, spec: JobSpec, during_watch=None, limit: float = 90.0):
    """The driver loop every engine adapter implements; returns (record, every Next seen)."""
    seen: list[Next] = []
    nxt = controller.advance(spec, controller.persist(controller.new_record(spec)))
    give_up = time.monotonic() + limit
    while nxt.action != "finished" and time.monotonic() < give_up:
        seen.append(nxt)
        if nxt.action == "sleep":
            time.sleep(max(0.0, nxt.until - time.time()))
            nxt = controller.advance(spec, nxt.record)
        elif nxt.action == "watch":
            if during_watch is not None:
                during_watch(nxt)
            time.sleep(0.05)
            nxt = controller.check(spec, nxt)
        else:
            nxt = controller.advance(spec, nxt.record)
    assert nxt.action == "finished", f"the job did not settle in {limit} s: {seen[-1:]}"
    return nxt.record, seen


def run_row(
    tmp_path,
    pattern,
    command,
    policy,
    *,
    proxy_match="/describe",
    during_watch=None,
    **controller_options,
):
    with (
        LocalCloudServer.from_traces(
            [trace("us-east-1a_v100_1", pattern)],
            time_scale=60.0,
            workdir=tmp_path / "cloud",
            config=FAST,
        ) as server,
        FaultProxy(server.url, match=proxy_match) as proxy,
    ):
        provider = open_provider("local", url=proxy.url, workdir=server.cloud.workdir)
        spec = JobSpec("job-row", command, (tmp_path / "ckpt").as_uri(), provider.pools())
        options = {"heartbeat_timeout_seconds": None, **controller_options}
        controller = Controller(provider, provider.market, policy, **options)
        record, seen = drive(
            controller, spec, None if during_watch is None else lambda nxt: during_watch(proxy, nxt)
        )
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15), (
            "a lease process outlived its attempt"
        )
        return record, seen, proxy


def outcomes(record):
    return [a.outcome for a in record.attempts]


def test_row_succeeded(tmp_path):
    record, seen, _ = run_row(tmp_path, UP, (sys.executable, "-c", "pass"), RetryPolicy())
    assert outcomes(record) == [Outcome.SUCCEEDED]
    assert record.status is JobStatus.SUCCEEDED
    assert record.attempts[0].lease["lease_id"] == record.attempts[0].lease_id


def test_row_preempted_after_a_notice_resumes_from_its_checkpoint(tmp_path):
    pattern = "1" * 4 + "0" * 3 + "1" * 400
    record, seen, _ = run_row(
        tmp_path,
        pattern,
        train_command(steps=600, step_seconds=0.01),
        RetryPolicy(max_preemptions=3, capacity_wait_seconds=0.5, on_demand_fallback=False),
    )
    assert outcomes(record)[0] is Outcome.PREEMPTED
    assert outcomes(record)[-1] is Outcome.SUCCEEDED, [a.message for a in record.attempts]
    assert any(n.action == "watch" and n.notice_at is not None for n in seen), (
        "check() never reported the notice before the lease ended"
    )
    resumed = [a.checkpoint_step_start for a in record.attempts if a.outcome is Outcome.SUCCEEDED]
    assert resumed[0] and resumed[0] > 0
    assert record.preemptions >= 1 and record.user_failures == 0


def test_row_user_failure_spends_no_preemption(tmp_path):
    record, _, _ = run_row(
        tmp_path, UP, (sys.executable, "-c", "raise SystemExit(3)"), RetryPolicy(max_user_retries=0)
    )
    assert outcomes(record) == [Outcome.USER_FAILED]
    assert record.status is JobStatus.FAILED
    assert record.preemptions == 0 and record.user_failures == 1


def test_row_no_capacity_waits_bounded_then_launches(tmp_path):
    record, seen, _ = run_row(
        tmp_path,
        "0" * 3 + UP,
        (sys.executable, "-c", "pass"),
        RetryPolicy(on_demand_fallback=False, capacity_wait_seconds=0.5, max_capacity_waits=20),
    )
    sleeps = [n for n in seen if n.action == "sleep"]
    assert sleeps and all(n.until - record.created_at < 60 for n in sleeps)
    assert outcomes(record)[-1] is Outcome.SUCCEEDED
    assert record.attempts[0].started_at - record.created_at > 1.5  # after the 3 empty ticks


def test_row_capacity_miss_at_launch_is_recorded_and_retried(tmp_path):
    """The market said yes, the launch said no (a stale offer): a capacity_unavailable
    attempt, then a bounded wait, then the launch that succeeds."""
    with (
        LocalCloudServer.from_traces(
            [trace("us-east-1a_v100_1", UP)],
            time_scale=60.0,
            workdir=tmp_path / "cloud",
            config=FAST,
        ) as server,
        FaultProxy(server.url, match="POST /instances ") as proxy,
    ):
        provider = open_provider("local", url=proxy.url, workdir=server.cloud.workdir)
        spec = JobSpec(
            "job-miss",
            (sys.executable, "-c", "pass"),
            (tmp_path / "ckpt").as_uri(),
            provider.pools(),
        )
        controller = Controller(
            provider,
            provider.market,
            RetryPolicy(on_demand_fallback=False, capacity_wait_seconds=0.3),
            heartbeat_timeout_seconds=None,
        )
        proxy.mode = "capacity"
        first = controller.advance(spec, controller.new_record(spec))
        proxy.mode = None
        record, _ = drive_from(controller, spec, first)
    assert first.action == "sleep"
    assert outcomes(record) == [Outcome.CAPACITY_UNAVAILABLE, Outcome.SUCCEEDED]
    assert "InsufficientInstanceCapacity" in record.attempts[0].message


def test_row_no_capacity_for_too_long_fails_the_job(tmp_path):
    record, seen, _ = run_row(
        tmp_path,
        "0" * 400,
        (sys.executable, "-c", "pass"),
        RetryPolicy(on_demand_fallback=False, capacity_wait_seconds=0.3, max_capacity_waits=3),
    )
    assert record.status is JobStatus.FAILED and not record.attempts
    assert 1 <= len([n for n in seen if n.action == "sleep"]) <= 4


@pytest.mark.parametrize("mode", ["503", "reset"])
def test_row_transient_observe_errors_do_not_end_the_attempt(tmp_path, mode):
    def flaky(proxy, nxt):
        age = time.time() - nxt.lease.started_at
        proxy.mode = mode if 0.3 < age < 2.0 else None

    record, seen, proxy = run_row(
        tmp_path,
        UP,
        (sys.executable, "-c", "import time; time.sleep(3)"),
        RetryPolicy(),
        during_watch=flaky,
        observe_failure_timeout_seconds=30.0,
    )
    assert proxy.failed > 3
    assert any(n.failing_since is not None for n in seen)
    assert outcomes(record) == [Outcome.SUCCEEDED]


def test_row_sustained_observe_failure_ends_the_attempt_and_its_lease(tmp_path):
    def down(proxy, nxt):
        proxy.mode = "503" if time.time() - nxt.lease.started_at > 0.3 else None

    record, _, _ = run_row(
        tmp_path,
        UP,
        SLEEP,
        RetryPolicy(max_infrastructure_retries=0),
        during_watch=down,
        observe_failure_timeout_seconds=1.5,
    )
    assert outcomes(record) == [Outcome.INFRASTRUCTURE_FAILED]
    assert "could not observe the lease" in record.attempts[0].message
    assert record.status is JobStatus.FAILED


def test_row_attempt_timeout_ends_the_attempt_and_its_lease(tmp_path):
    record, _, _ = run_row(
        tmp_path, UP, SLEEP, RetryPolicy(max_infrastructure_retries=0), attempt_timeout_seconds=1.5
    )
    assert outcomes(record) == [Outcome.INFRASTRUCTURE_FAILED]
    assert "time limit" in record.attempts[0].message


def test_a_driver_that_died_mid_watch_is_replaced_from_the_record_alone(tmp_path):
    """Another process (a triggerer, a new Airflow try) continues from the persisted record."""
    with LocalCloudServer.from_traces(
        [trace("us-east-1a_v100_1", UP)], time_scale=60.0, workdir=tmp_path / "cloud", config=FAST
    ) as server:
        saved = []
        first = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        spec = JobSpec(
            "job-handover",
            (sys.executable, "-c", "import time; time.sleep(1.5)"),
            (tmp_path / "ckpt").as_uri(),
            first.pools(),
        )
        controller = Controller(
            first, first.market, RetryPolicy(), persist=saved.append, heartbeat_timeout_seconds=None
        )
        nxt = controller.advance(spec, controller.new_record(spec))
        assert nxt.action == "watch"
        # the second driver knows nothing but the record
        second = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        again = Controller(second, second.market, RetryPolicy(), heartbeat_timeout_seconds=None)
        resumed = again.advance(spec, saved[-1])
        assert resumed.action == "watch" and resumed.lease.lease_id == nxt.lease.lease_id
        record, _ = drive_from(again, spec, resumed)
        assert outcomes(record) == [Outcome.SUCCEEDED]


def drive_from(controller, spec, nxt):
    seen = []
    while nxt.action != "finished":
        seen.append(nxt)
        time.sleep(0.05)
        nxt = (
            controller.check(spec, nxt)
            if nxt.action == "watch"
            else controller.advance(spec, nxt.record)
        )
    return nxt.record, seen


def test_next_round_trips_through_json(tmp_path):
    record, seen, _ = run_row(tmp_path, UP, (sys.executable, "-c", "pass"), RetryPolicy())
    watch = next(n for n in seen if n.action == "watch")
    assert Next.from_dict(watch.to_dict()) == watch


def test_row_heartbeat_expiry_ends_the_lease_and_the_next_driver_resumes(tmp_path):
    """A driver that dies mid-watch stops renewing; the node ends the lease after the
    heartbeat timeout; whoever picks the record up closes that attempt and resumes."""
    with LocalCloudServer.from_traces(
        [trace("us-east-1a_v100_1", UP)], time_scale=60.0, workdir=tmp_path / "cloud", config=FAST
    ) as server:
        saved = []
        first = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        spec = JobSpec(
            "job-heartbeat",
            train_command(steps=1500, step_seconds=0.01),
            (tmp_path / "ckpt").as_uri(),
            first.pools(),
        )
        dead = Controller(
            first,
            first.market,
            RetryPolicy(max_infrastructure_retries=2),
            persist=saved.append,
            heartbeat_timeout_seconds=2.0,
        )
        nxt = dead.advance(spec, dead.new_record(spec))
        assert nxt.action == "watch"  # ... and this driver is never heard of again
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=20), (
            "the lease outlived its silent driver"
        )
        heir = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        again = Controller(
            heir,
            heir.market,
            RetryPolicy(max_infrastructure_retries=2),
            heartbeat_timeout_seconds=5.0,
        )
        record, _ = drive_from(again, spec, again.advance(spec, saved[-1]))
    first_attempt, *rest = record.attempts
    assert first_attempt.outcome is Outcome.INFRASTRUCTURE_FAILED
    assert "heartbeat" in first_attempt.message
    assert first_attempt.checkpoint_step_end, "the node saved before it stopped"
    assert rest[-1].outcome is Outcome.SUCCEEDED
    assert rest[0].checkpoint_step_start == first_attempt.checkpoint_step_end
