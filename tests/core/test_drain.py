"""Back to spot mid-run: a running on-demand attempt is drained (emergency checkpoint, the
sixth outcome ``drained``, no budget spent) when the policy says spot is back and moving
pays, and the job resumes on spot; live uniform-progress then makes the simulator's choices."""

from __future__ import annotations

import dataclasses

import pytest

from spot_core.controller import Controller, JobSpec
from spot_core.model import (Attempt, JobRecord, JobStatus, Market, Offer, Outcome, Pool)
from spot_core.policy.deadline_live import DeadlineWork
from spot_core.policy.retry import RetryPolicy, decide_next
from spot_core.providers.local import LocalProvider
from spot_core.workloads.softmax_regression import TrainConfig, train

from spot_helpers import marked_processes, trace, train_command
from test_controller_deadline_policy import (FAST, OVERHEAD, SCALE, STEP_SECONDS, TICK,
                                             _choices, _live, _simulate, _summary, _traces)

pytestmark = pytest.mark.timeout(300)


def _final_sha(uri: str) -> str:
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.state import arrays_from_bytes
    from spot_core.workloads.softmax_regression import STATE_FILE, weights_sha256

    store = open_store(uri)
    ref = store.latest()
    assert ref.metadata.get("final")
    return weights_sha256(arrays_from_bytes(store.load(ref)[STATE_FILE]))


def test_a_capacity_fallback_moves_back_to_spot_mid_run(tmp_path):
    # No spot for the first 3 s of wall time (ticks of 1 s at 60x), then spot for good.
    provider = LocalProvider.from_traces([trace("us-east-1a_v100_1", "000" + "1" * 400)],
                                         time_scale=60.0, workdir=tmp_path / "cloud", config=FAST)
    spec = JobSpec(job_id="job-drain", command=train_command(steps=900, every_steps=20),
                   checkpoint_uri=(tmp_path / "ckpt").as_uri(), pools=provider.pools())
    events: list[tuple[str, str]] = []
    policy = RetryPolicy(max_preemptions=2, capacity_wait_seconds=0.3, max_capacity_waits=3,
                         min_on_demand_seconds=4.0)
    controller = Controller(provider, provider.market, policy, poll_interval=0.05,
                            listener=lambda kind, record, detail: events.append((kind, detail)))
    with provider:
        record = controller.run(spec)
    launched = [a for a in record.attempts if a.lease_id is not None]
    assert record.status is JobStatus.SUCCEEDED
    assert [(a.pool.market, a.outcome) for a in launched] == [
        (Market.ON_DEMAND, Outcome.DRAINED), (Market.SPOT, Outcome.SUCCEEDED)]
    drained, resumed = launched
    assert drained.drain_requested_at - drained.started_at >= 4.0, "min_on_demand is kept"
    assert drained.checkpoint_step_end and resumed.checkpoint_step_start == \
        drained.checkpoint_step_end, "the drain saved a checkpoint the spot attempt resumed"
    assert drained.lost_work_seconds < 60.0, "under a second of wall time lost at 60x"
    assert record.preemptions == 0 and record.infrastructure_failures == 0
    assert any(kind == "draining" and "back to spot" in detail for kind, detail in events)
    assert _final_sha(spec.checkpoint_uri) == train(TrainConfig(steps=900, seed=7)).weights_sha256
    assert not marked_processes(str(tmp_path))


def test_no_drain_once_the_preemption_budget_is_spent_or_return_to_spot_is_off():
    pool = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
    on_demand = pool.on(Market.ON_DEMAND)
    running = Attempt(number=3, pool=on_demand, started_at=0.0, lease_id="i-1")
    record = JobRecord(job_id="j", created_at=0.0, attempts=(running,), preemptions=1)
    offers = [Offer(pool, 0.9, 3.06, True, 1000.0), Offer(on_demand, 3.06, 3.06, True, 1000.0)]
    move = decide_next(record, offers, RetryPolicy(max_preemptions=2), now=1000.0)
    assert move.action == "launch" and move.market is Market.SPOT
    for policy in (RetryPolicy(max_preemptions=1), RetryPolicy(return_to_spot=False),
                   RetryPolicy(max_preemptions=2, min_on_demand_seconds=2000.0)):
        assert decide_next(record, offers, policy, now=1000.0).action == "wait"


@pytest.mark.parametrize("work_left, moves", [(3600.0 * 4, True), (300.0, False)])
def test_a_move_must_repay_its_restart(work_left, moves):
    pool = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
    on_demand = pool.on(Market.ON_DEMAND)
    record = JobRecord(job_id="j", created_at=0.0, deadline=10**6, attempts=(
        Attempt(number=1, pool=on_demand, started_at=0.0, lease_id="i-1"),))
    offers = [Offer(pool, 0.9, 3.06, True, 1000.0), Offer(on_demand, 3.06, 3.06, True, 1000.0)]
    work = DeadlineWork(work_left_seconds=work_left, restart_overhead_seconds=600.0)
    decision = decide_next(record, offers, RetryPolicy(min_on_demand_seconds=0), now=1000.0,
                           work=work)
    assert (decision.action == "launch") is moves


def test_drained_is_no_failure_in_any_budget():
    pool = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
    record = JobRecord(job_id="j", created_at=0.0).start_attempt(
        Attempt(number=1, pool=pool, started_at=0.0, lease_id="i-1", drain_requested_at=5.0))
    done = record.finish_attempt(dataclasses.replace(
        record.current_attempt, ended_at=6.0, outcome=Outcome.DRAINED))
    assert (done.preemptions, done.user_failures, done.infrastructure_failures,
            done.capacity_misses) == (0, 0, 0, 0)
    again = JobRecord.from_dict(done.to_dict())
    assert again.attempts[0].outcome is Outcome.DRAINED
    assert again.attempts[0].drain_requested_at == 5.0


# Uniform Progress on a trace where spot is gone for the first 6 ticks: it idles at tick 0,
# goes on-demand below its line, and leaves on-demand for spot once it is two restarts
# ahead of the line (tick 10 in the simulator); the live job must drain at the same point.
UP_ZONE = "0" * 6 + "1" * 34
UP_WORK_TICKS, UP_DEADLINE_TICKS = 8, 24


def test_live_uniform_progress_drains_on_demand_like_the_simulator(tmp_path):
    traces = _traces(UP_ZONE, "0" * 40)
    work = UP_WORK_TICKS * TICK
    steps = round(work / SCALE / STEP_SECONDS)
    simulated, sim_choices = _simulate(traces, work, UP_DEADLINE_TICKS, "uniform-progress")
    assert simulated.finished
    assert sim_choices == [("on-demand", Market.ON_DEMAND), ("us-east-1a", Market.SPOT)]

    record, spec, market, events = _live(tmp_path, traces, work, UP_DEADLINE_TICKS, steps,
                                         policy="uniform-progress")
    live = record.ledger.spent
    print(f"simulated cost {simulated.cost:.3f} $, live cost {live:.3f} $")
    print(_summary(record, market))
    assert record.status is JobStatus.SUCCEEDED
    assert _choices(record) == sim_choices
    assert [a.outcome for a in record.attempts if a.lease_id] == [Outcome.DRAINED,
                                                                  Outcome.SUCCEEDED]
    # As for greedy (see test_controller_deadline_policy): whole-tick billing and up to a
    # tick of difference where the live job leaves on-demand (the look is once per tick,
    # at a moment within it, on the progress its checkpoints prove), plus the drain's
    # notice and restart lag: one on-demand tick, plus half of one for the drain.
    od_tick = traces[0].on_demand_price * TICK / 3600.0
    tolerance = od_tick * 1.5
    assert abs(live - simulated.cost) <= tolerance, (live, simulated.cost, tolerance)
