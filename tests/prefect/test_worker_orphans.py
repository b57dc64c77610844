"""A flow run whose spot worker died after its node handed the run back (the capacity was
reclaimed) is not left ``Running`` for ever: another spot worker of the pool adopts it
once its heartbeat is stale, reschedules it and finishes it; of two workers that find it
at once, only one adopts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import Outcome
from tests.support.prefect_helpers import (
    deploy_example_flow,
    final_record,
    running_worker,
    wait_completed,
)
from tests.support.spot_helpers import marked_processes, trace, wait_until

HERE = Path(__file__).resolve().parent
FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)
pytestmark = pytest.mark.timeout(420)

UP_SECONDS = 45  # one trace tick a second: up 45 s, reclaimed for 10 s, then up
HEARTBEAT_TIMEOUT = 60  # longer than the reclaim comes after the kill: no driver_lost first


def test_a_run_left_running_by_a_dead_worker_is_adopted_and_finished(prefect_api, tmp_path):
    from prefect import get_client
    from prefect.deployments import run_deployment

    pattern = "1" * UP_SECONDS + "0" * 10 + "1" * 2000
    marks = tmp_path / "marks"
    with LocalCloudServer.from_traces(
        [trace("us-east-1a_v100_1", pattern)],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=FAST,
        start_on_first_client=True,
    ) as cloud:
        deployment_id = deploy_example_flow(
            "spot-orphans",
            "orphans",
            {
                "provider_options": {"url": cloud.url, "workdir": str(cloud.cloud.workdir)},
                "on_demand_fallback": False,
                "heartbeat_timeout": HEARTBEAT_TIMEOUT,
                "capacity_wait": 0.5,
                "max_capacity_waits": 200,
                "checkpoint_root": (tmp_path / "ckpt").as_uri(),
            },
            source=HERE,
            entrypoint="spot_test_flows.py:naps_through_its_first_attempt",
        )
        with get_client(sync_client=True) as client:
            with running_worker("spot-orphans", tmp_path / "first.log") as first:
                run = run_deployment(deployment_id, timeout=0, parameters={"marks": str(marks)})
                assert wait_until(lambda: (marks / "attempt-1").exists(), timeout=UP_SECONDS - 5), (
                    "the flow did not start before the reclaim"
                )
                first.kill()  # no shutdown: it cannot stop its lease or reschedule anything
                first.wait(timeout=30)
            # The reclaim comes; the node hands the run back without a state and exits.
            assert wait_until(
                lambda: not marked_processes(str(tmp_path)), timeout=UP_SECONDS + 60
            ), "the lease outlived the reclaim"
            state = client.read_flow_run(run.id).state
            assert state.is_running(), state  # what nobody would ever change without adoption
            # Two workers find the orphan at about the same moment; one adopts it.
            with (
                running_worker("spot-orphans", tmp_path / "second.log"),
                running_worker("spot-orphans", tmp_path / "third.log"),
            ):
                run = wait_completed(client, run.id, timeout=HEARTBEAT_TIMEOUT + 150)
                names = [s.name for s in client.read_flow_run_states(run.id)]
                record = final_record(run.id)  # settled by the worker, before it stops
    logs = [(tmp_path / f"{n}.log").read_text(errors="replace") for n in ("second", "third")]
    assert run.state.is_completed(), f"{run.state!r} {names}\n{logs[0][-3000:]}\n{logs[1][-3000:]}"
    assert sum("adopting the flow run" in log for log in logs) == 1, (
        f"{logs[0][-3000:]}\n{logs[1][-3000:]}"
    )
    assert [a.outcome for a in record.attempts] == [Outcome.PREEMPTED, Outcome.SUCCEEDED], [
        (a.outcome, a.message) for a in record.attempts
    ]
    assert record.preemptions == 1
    # The adopter gave back the run the preempted attempt spent: the flow's one retry
    # (retries=1) is still there for its own errors.
    assert run.empirical_policy.retries == 1 + 1, (run.run_count, run.empirical_policy)
    # Handed back on the reclaim, rescheduled by the adopting worker: never Crashed/Failed.
    assert "AwaitingRetry" in names and not {"Crashed", "Failed"} & set(names), names


# -- the adoption rule alone (pure) -------------------------------------------------------------
def _record(open_attempt: bool):
    from spot_core.model import Attempt, JobRecord, Pool

    pool = Pool("local", "local-1", "us-east-1a", "p3.2xlarge")
    attempt = Attempt(
        number=1,
        pool=pool,
        started_at=1000.0,
        lease_id="i-1",
        **({} if open_attempt else {"ended_at": 1500.0, "outcome": Outcome.PREEMPTED}),
    )
    return JobRecord(job_id="flow-run-x", created_at=1000.0, attempts=(attempt,))


@pytest.mark.parametrize(
    "open_attempt, beat_age, lease, timeout, adopted",
    [
        (True, 400, "reclaimed", 300, True),  # the hole: open, stale, lease gone
        (True, None, "exited", 300, True),  # never a heartbeat at all, lease gone
        (True, 100, "reclaimed", 300, False),  # a live worker drives it (fresh heartbeat)
        (True, 400, "running", 300, False),  # the lease runs: the node's watcher ends it
        (True, 400, None, 300, False),  # the lease is unknown (not yet described)
        (False, 400, "reclaimed", 300, False),  # nothing open: the record is settled
        (True, 400, "reclaimed", None, False),  # no heartbeat to tell a live driver by
    ],
)
def test_only_a_run_with_an_open_attempt_a_stale_heartbeat_and_an_ended_lease_is_adopted(
    open_attempt, beat_age, lease, timeout, adopted
):
    """``beat_age``: seconds since this worker last saw the heartbeat change (None: it
    never saw one, since it first looked 400 s ago)."""
    from prefect_spot.workers.orphans import Evidence, orphaned
    from spot_core.providers.base import LeaseState, LeaseStatus

    status = None if lease is None else LeaseStatus(LeaseState(lease))
    evidence = Evidence(_record(open_attempt), 400.0 if beat_age is None else beat_age, status)
    assert (orphaned(evidence, timeout) is not None) is adopted


def test_silence_is_judged_by_the_beats_sequence_on_this_workers_clock_not_by_its_stamp(tmp_path):
    """A beat stamped by a driver whose clock is an hour behind still counts as fresh while
    its sequence moves; a run that beats is read once per timeout, a silent one each check."""
    from prefect_spot.workers.orphans import Looks, gather
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.heartbeat import Heartbeat

    class Provider:
        def observe(self, leases):
            return {}

    clock = [0.0]
    looks = Looks(monotonic=lambda: clock[0])
    uri = (tmp_path / "job").as_uri()
    driver = Heartbeat(open_store(uri))

    def look():
        return gather(
            looks.due("run"), uri, open_store, 300.0, clock[0], lambda: _record(True), Provider()
        )

    for _ in range(3):  # a live driver, its stamps an hour behind, beats between looks
        driver.renew(1, now=clock[0] - 3600)
        evidence = look()
        assert evidence.silent_for < 300 and evidence.record is None  # one read only
        looks.looked("run", evidence, 300.0)
        assert looks.due("run") is None  # not again before the timeout
        clock[0] += 300.0
    evidence = look()  # no beat since the last look, a whole timeout ago
    assert evidence.silent_for >= 300 and evidence.record is not None
    looks.looked("run", evidence, 300.0)
    assert looks.due("run") is not None  # silent: looked at again at the next check


def test_with_one_beat_per_worker_a_run_is_fresh_while_its_worker_lists_it(tmp_path):
    """heartbeat_uri: the run's heartbeat points at its worker's one beat; the run counts
    as driven while that beat lists it, and falls silent once it does not, though the
    worker lives on (renewing for its other runs)."""
    from prefect_spot.workers.orphans import Looks, gather
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.heartbeat import DriverBeat, Heartbeat

    class Provider:
        def observe(self, leases):
            return {}

    clock = [0.0]
    looks = Looks(monotonic=lambda: clock[0])
    uri, drivers_uri = (tmp_path / "job").as_uri(), (tmp_path / "drivers").as_uri()
    worker = DriverBeat(open_store(drivers_uri))
    worker.vouch("run-job", 1, 0.0)
    Heartbeat(open_store(uri)).point(1, worker, "run-job", 0.0)

    def look():
        return gather(
            looks.due("run"),
            uri,
            open_store,
            300.0,
            clock[0],
            lambda: _record(True),
            Provider(),
            drivers_uri,
        )

    for _ in range(3):  # the worker drives the run: listed at every renewal
        worker.vouch("run-job", 1, clock[0])
        worker.vouch("other-job", 1, clock[0])
        worker.renew(clock[0])
        evidence = look()
        assert evidence.silent_for < 300 and evidence.record is None
        looks.looked("run", evidence, 300.0)
        clock[0] += 300.0
    for _ in range(2):  # it stopped driving this run, renews for its other one only
        worker.vouch("other-job", 1, clock[0])
        worker.renew(clock[0], window=10.0)
        evidence = look()
        looks.looked("run", evidence, 300.0)
        clock[0] += 300.0
    assert evidence.silent_for >= 300 and evidence.record is not None


# -- one adopter per orphan: the claim ------------------------------------------------------------
@pytest.mark.parametrize(
    "current, seen, now, adopt",
    [
        (None, None, 0.0, True),  # nobody claims the attempt
        (b"a", None, 1000.0, False),  # a claim this worker has not seen before
        (b"a", (b"a", 0.0), 299.0, False),  # seen, but for less than the timeout
        (b"a", (b"a", 0.0), 300.0, True),  # unchanged for the timeout: its adopter died
        (b"b", (b"a", 0.0), 1000.0, False),  # another claim since: someone is on it
    ],
)
def test_a_claim_is_taken_only_when_absent_or_unchanged_for_the_timeout(current, seen, now, adopt):
    from prefect_spot.workers.orphans import may_take

    assert may_take(current, seen, now, 300.0) is adopt


def test_of_two_workers_claiming_one_orphan_one_wins_and_a_dead_adopters_claim_expires(tmp_path):
    """Each worker judges the other's claim on its own clock, as it judges the heartbeat."""
    from prefect_spot.workers.orphans import Looks
    from spot_core.checkpoint import open_store

    store = open_store((tmp_path / "job").as_uri())
    clock_a, clock_b = [0.0], [5000.0]  # two machines' monotonic clocks share no origin
    a, b = Looks(monotonic=lambda: clock_a[0]), Looks(monotonic=lambda: clock_b[0])
    assert a.claim("run", store, 1, "worker-a", 300.0)
    assert not b.claim("run", store, 1, "worker-b", 300.0)  # a adopts it
    clock_b[0] += 299.0
    assert not b.claim("run", store, 1, "worker-b", 300.0)
    clock_b[0] += 1.0  # a's claim has stood for the timeout: a died before settling the run
    assert b.claim("run", store, 1, "worker-b", 300.0)
    assert not a.claim("run", store, 1, "worker-a", 300.0)  # b's claim is new to a
    assert a.claim("run", store, 2, "worker-a", 300.0)  # the next attempt is claimed afresh
