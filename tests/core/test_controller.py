"""The controller against the local spot cloud: real processes, real checkpoints, real traces."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from spot_core.checkpoint import open_store
from spot_core.market.fixtures import default_traces, fixture_json_trace_path
from spot_core.market.trace import load_trace
from spot_core.market.trace_market import TraceMarket
from spot_core.model import JobStatus, Market, Outcome
from spot_core.policy.retry import RetryPolicy
from spot_core.workloads.softmax_regression import TrainConfig, train
from tests.support.builders import controller_for, job_spec, local_cloud, store_uri
from tests.support.spot_helpers import marked_processes, trace, train_command, wait_until

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path, provider, command, policy, pools=None, market=None, persist=None):
    spec = job_spec(tmp_path, provider, command, pools=pools or provider.pools())
    controller = controller_for(provider, policy, market=market, persist=persist)
    with provider:
        return controller.run(spec)


def _final_sha(tmp_path) -> str:
    from spot_core.checkpoint.state import arrays_from_bytes
    from spot_core.workloads.softmax_regression import STATE_FILE, weights_sha256

    store = open_store(store_uri(tmp_path))
    ref = store.latest()
    assert ref.metadata.get("final")
    return weights_sha256(arrays_from_bytes(store.load(ref)[STATE_FILE]))


@pytest.mark.parametrize(
    "seed, traces, start_tick, time_scale",
    [
        (7, "aws-csv", 450, 3600.0),  # the shipped AWS V100 excerpt, 195 s ticks
        (11, "aws-json", 100, 7200.0),  # the 4-node excerpt in the 1 = preempted JSON format
    ],
)
def test_preempted_job_resumes_and_matches_uninterrupted_run(
    tmp_path, seed, traces, start_tick, time_scale
):
    loaded = default_traces() if traces == "aws-csv" else [load_trace(fixture_json_trace_path())]
    provider = local_cloud(tmp_path, loaded, time_scale=time_scale, start_tick=start_tick)
    saved = []
    record = _run(
        tmp_path,
        provider,
        train_command(steps=900, seed=seed),
        RetryPolicy(max_preemptions=5, capacity_wait_seconds=0.3, min_on_demand_seconds=1e9),
        persist=saved.append,
    )
    assert record.status is JobStatus.SUCCEEDED
    assert record.preemptions >= 1, [a.outcome for a in record.attempts]
    assert record.user_failures == 0
    resumed = [a.checkpoint_step_start for a in record.attempts[1:] if a.outcome is not None]
    assert any(step and step > 0 for step in resumed)
    assert _final_sha(tmp_path) == train(TrainConfig(steps=900, seed=seed)).weights_sha256
    assert saved[-1] == record and len(saved) >= 2 * len(record.attempts)
    assert record.ledger.spent < record.ledger.on_demand_equivalent
    assert not marked_processes(str(tmp_path))


def test_falls_back_to_on_demand_after_the_preemption_budget(tmp_path):
    # Spot for 2 s out of every 4 s: a 6 s job cannot finish on spot alone.
    provider = local_cloud(tmp_path, [trace("us-east-1a_v100_1", "1100" * 40)])
    record = _run(
        tmp_path,
        provider,
        train_command(steps=600, every_steps=10),
        RetryPolicy(max_preemptions=1, capacity_wait_seconds=0.5, min_on_demand_seconds=1e9),
    )
    assert record.status is JobStatus.SUCCEEDED
    assert record.preemptions == 1 and record.fallbacks == 1
    assert record.attempts[-1].pool.market is Market.ON_DEMAND
    assert record.attempts[-1].checkpoint_step_start > 0


def test_no_spot_capacity_in_any_pool_goes_to_on_demand(tmp_path):
    """The controller's market view says spot is there; every launch finds none."""
    dead = [trace(f"us-east-1{z}_v100_1", "0" * 200) for z in "ab"]
    live = [trace(f"us-east-1{z}_v100_1", "1" * 200) for z in "ab"]
    provider = local_cloud(tmp_path, dead)
    stale_view = TraceMarket(live, tick_origin=time.time(), time_scale=60.0)
    record = _run(
        tmp_path,
        provider,
        train_command(steps=60),
        RetryPolicy(capacity_wait_seconds=0.2, min_on_demand_seconds=1e9),
        market=stale_view,
    )
    outcomes = [a.outcome for a in record.attempts]
    assert outcomes[0] is Outcome.CAPACITY_UNAVAILABLE
    assert "us-east-1a" in record.attempts[0].message and "us-east-1b" in record.attempts[0].message
    assert record.attempts[-1].pool.market is Market.ON_DEMAND
    assert record.status is JobStatus.SUCCEEDED and record.preemptions == 0


def _flaky_step(tmp_path) -> tuple[str, ...]:
    """Fails (exit 3) on its first run, then trains; a user error, not infrastructure."""
    script = tmp_path / "flaky.py"
    marker = tmp_path / "failed-once"
    script.write_text(
        textwrap.dedent(f"""
        import pathlib, sys
        from spot_core.workloads.softmax_regression import main
        marker = pathlib.Path({str(marker)!r})
        if not marker.exists():
            marker.write_text("x")
            sys.exit(3)
        sys.exit(main(sys.argv[1:]))
    """)
    )
    return (sys.executable, str(script), *train_command(steps=600, every_steps=10)[3:])


def test_user_failure_spends_a_user_retry_and_preemptions_do_not(tmp_path):
    provider = local_cloud(tmp_path, [trace("us-east-1a_v100_1", "1110" * 60)])
    record = _run(
        tmp_path,
        provider,
        _flaky_step(tmp_path),
        RetryPolicy(
            max_preemptions=10,
            max_user_retries=1,
            capacity_wait_seconds=0.3,
            min_on_demand_seconds=1e9,
        ),
    )
    assert record.status is JobStatus.SUCCEEDED
    assert record.user_failures == 1
    assert record.preemptions >= 1
    assert record.attempts[0].outcome is Outcome.USER_FAILED


def test_user_failure_without_retries_fails_the_job(tmp_path):
    provider = local_cloud(tmp_path, [trace("us-east-1a_v100_1", "1" * 100)])
    record = _run(
        tmp_path,
        provider,
        (sys.executable, "-c", "raise SystemExit(4)"),
        RetryPolicy(max_user_retries=0),
    )
    assert record.status is JobStatus.FAILED
    assert [a.outcome for a in record.attempts] == [Outcome.USER_FAILED]


def test_ctrl_c_on_run_leaves_no_process_behind(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "run",
            "--checkpoint-uri",
            (tmp_path / "ckpt").as_uri(),
            "--",
            *train_command(steps=5000, step_seconds=0.02),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert wait_until(lambda: len(marked_processes(str(tmp_path))) >= 2, timeout=20)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)


def test_a_deadline_too_close_for_spot_goes_straight_to_on_demand(tmp_path):
    """Spot is available, but work left plus two restarts no longer fits on spot."""
    provider = local_cloud(tmp_path, [trace("us-east-1a_v100_1", "1" * 400)])
    work, overhead = 120.0, 60.0  # capacity seconds: 2 s and 1 s of wall time at 60x
    spec = job_spec(
        tmp_path,
        provider,
        train_command(steps=100, step_seconds=0.0),
        job_id="job-deadline",
        deadline_at=time.time() + (work + 1.5 * overhead) / 60.0,
        work_capacity_seconds=work,
        total_steps=100,
        restart_overhead_capacity_seconds=overhead,
    )
    with provider:
        record = controller_for(provider).run(spec)
    assert record.attempts[0].pool.market is Market.ON_DEMAND
    assert record.status is JobStatus.SUCCEEDED


def test_a_roomy_deadline_still_takes_spot(tmp_path):
    provider = local_cloud(tmp_path, [trace("us-east-1a_v100_1", "1" * 400)])
    spec = job_spec(
        tmp_path,
        provider,
        train_command(steps=100, step_seconds=0.0),
        job_id="job-roomy",
        deadline_at=time.time() + 60.0,
        work_capacity_seconds=120.0,
        total_steps=100,
        restart_overhead_capacity_seconds=60.0,
    )
    with provider:
        record = controller_for(provider).run(spec)
    assert record.attempts[0].pool.market is Market.SPOT
    assert record.status is JobStatus.SUCCEEDED


def test_a_price_cap_waits_for_a_cheaper_window_then_falls_back(tmp_path):
    events = []
    provider = local_cloud(tmp_path, [trace("us-east-1a_v100_1", "1" * 200, price=0.9)])
    spec = job_spec(tmp_path, provider, (sys.executable, "-c", "print('done')"), job_id="job-cap")
    policy = RetryPolicy(max_spot_price=0.5, capacity_wait_seconds=0.4, max_capacity_waits=2)
    controller = controller_for(
        provider, policy, listener=lambda kind, record, detail: events.append((kind, detail))
    )
    started = time.monotonic()
    with provider:
        record = controller.run(spec)
    assert record.status is JobStatus.SUCCEEDED
    assert [a.pool.market for a in record.attempts] == [Market.ON_DEMAND]
    waits = [detail for kind, detail in events if kind == "wait"]
    assert waits and all("above max_spot_price $0.5/h" in w for w in waits)
    assert time.monotonic() - started >= 0.8, "it waited two windows before paying on-demand"
