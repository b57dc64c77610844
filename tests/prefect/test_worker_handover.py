"""The spot worker hands over on the notice (on a Prefect server on PostgreSQL, against a
local cloud server replaying a made-up trace that reclaims one zone with a notice).

The replacement lease boots beside the old attempt, but the flow run's engine on it
starts only when the worker says so, once the old attempt is closed and the run is back
to ``Pending``: the same flow run goes on (never ``AwaitingRetry``, never a second
submission), resumes from the old attempt's emergency checkpoint and completes with an
uninterrupted run's result. Cancelling the run or stopping the worker mid-handover ends
both leases; a replacement that never gets the go stops waiting in bounded time, and one
whose flow run was cancelled meanwhile never starts the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_core.attempt_env import INFRASTRUCTURE_EXIT_CODE
from spot_core.checkpoint import open_store
from spot_core.checkpoint.handover import mark_go
from spot_core.checkpoint.resumed import read_resumed
from spot_core.errors import FencedOut
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import JobRecord, Outcome
from tests.support.prefect_helpers import (
    deploy_example_flow,
    final_record,
    running_worker,
    wait_completed,
)
from tests.support.spot_helpers import marked_processes, trace, wait_until

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(420)
STEPS, STEP_SECONDS = 1500, 0.02  # 30 s of work
# One trace tick per wall second from the worker's first connection: zone a (the cheaper)
# is reclaimed at 25 s, with a 2 s notice; zone b is up throughout, at a higher price.
ZONE_A, ZONE_B = "us-east-1a_v100_1", "us-east-1b_v100_1"


@pytest.fixture
def prefect_api(prefect_server_on_postgres):
    """This module's tests talk to a Prefect server on PostgreSQL, as production runs."""
    yield


def _cloud(
    tmp_path: Path, grace_wall_seconds: float = 2.0, notice_wall_seconds: float = 2.0
) -> LocalCloudServer:
    return LocalCloudServer.from_traces(
        [
            trace(ZONE_A, "1" * 25 + "0" * 2000, price=0.5),
            trace(ZONE_B, "1" * 2025, price=0.9),
        ],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=LocalCloudConfig(
            min_notice_wall_seconds=notice_wall_seconds, grace_wall_seconds=grace_wall_seconds
        ),
        start_on_first_client=True,
    )


def _deploy(pool: str, cloud: LocalCloudServer, tmp_path: Path):
    return deploy_example_flow(
        pool,
        pool,
        {
            "provider_options": {"url": cloud.url, "workdir": str(cloud.cloud.workdir)},
            "on_demand_fallback": False,
            "max_preemptions": 2,
            "capacity_wait": 0.5,
            "poll_interval": 0.5,
            "checkpoint_root": (tmp_path / "ckpt").as_uri(),
        },
        source=HERE,
        entrypoint="spot_test_flows.py:sums_through_a_handover",
    )


def _start(deployment_id, tmp_path: Path, save_seconds: float):
    from prefect.deployments import run_deployment

    return run_deployment(
        deployment_id,
        timeout=0,
        parameters={
            "total_steps": STEPS,
            "step_seconds": STEP_SECONDS,
            "save_seconds": save_seconds,
            "result": str(tmp_path / "result.json"),
        },
    )


def _record(flow_run_id) -> JobRecord | None:
    from prefect_spot.artifacts import load_record, record_key

    return load_record(record_key(flow_run_id))


def _replacement_launched(flow_run_id, timeout: float) -> JobRecord:
    """The worker's record once it names a replacement launched beside the old attempt."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = _record(flow_run_id)
        running = None if record is None else record.current_attempt
        if running is not None and running.replacement is not None:
            return record
        time.sleep(0.2)
    raise AssertionError(f"no replacement was launched in {timeout} s: {_record(flow_run_id)}")


def test_the_worker_hands_over_on_the_notice_and_the_same_flow_run_completes(prefect_api, tmp_path):
    from prefect import get_client

    with _cloud(tmp_path) as cloud:
        deployment_id = _deploy("spot-handover", cloud, tmp_path)
        with running_worker("spot-handover", tmp_path / "worker.log"):
            run = _start(deployment_id, tmp_path, save_seconds=1.5)
            with get_client(sync_client=True) as client:
                run = wait_completed(client, run.id, timeout=240)
                states = client.read_flow_run_states(run.id)
            record = final_record(run.id)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=20), (
            "a lease process outlived the flow run"
        )
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    assert run.state.is_completed(), f"{run.state!r}\n{logs[-4000:]}"
    old, new = record.attempts
    assert (old.outcome, new.outcome) == (Outcome.PREEMPTED, Outcome.SUCCEEDED), record.attempts
    assert old.pool.zone == "us-east-1a" and new.pool.zone == "us-east-1b"
    # launched before the old lease ended, adopted once it had
    assert new.started_at < old.ended_at
    assert old.replacement["state"] == "adopted" and old.replacement["attempt"] == new.number
    # the same flow run went on: back to Pending (handed over), never rescheduled or failed
    names = [s.name for s in states]
    assert "AwaitingRetry" not in names and not {"Failed", "Crashed"} & set(names), names
    assert names[-3:] == ["Pending", "Running", "Completed"], names
    assert f"handed over to attempt {new.number}" in (states[-3].message or ""), states[-3]
    assert run.infrastructure_pid == new.lease_id
    # resumed from the old attempt's emergency checkpoint, not an older one
    store = open_store((tmp_path / "ckpt" / str(run.id)).as_uri())
    emergency = json.loads((tmp_path / f"emergency-{old.number}.json").read_text())["step"]
    resumed = read_resumed(store, new.number)
    assert resumed is not None and resumed.step == emergency
    assert old.checkpoint_step_end == new.checkpoint_step_start == emergency
    # the result of an uninterrupted run: no step lost or done twice
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"total": sum(range(STEPS)), "attempt": new.number}
    # a zombie of the old attempt cannot save after the handover
    with pytest.raises(FencedOut):
        store.save(STEPS + 1, {"state.json": b"{}"}, attempt=old.number)
    # the old attempt's run was given back: the flow's one retry is still the user's
    assert run.run_count == 2 and run.empirical_policy.retries == 2, run.empirical_policy
    assert record.preemptions == 1 and len(record.time_to_resume_seconds) == 1


def test_cancelling_the_flow_run_mid_handover_ends_both_leases(prefect_api, tmp_path):
    from prefect import get_client
    from prefect.states import Cancelling

    with _cloud(tmp_path) as cloud:
        deployment_id = _deploy("spot-handover-cancel", cloud, tmp_path)
        with running_worker("spot-handover-cancel", tmp_path / "worker.log"):
            # a 10 s emergency save: both leases run for a while after the notice
            run = _start(deployment_id, tmp_path, save_seconds=10.0)
            _replacement_launched(run.id, timeout=120)
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(run.id, Cancelling(message="the user cancels"))
                deadline = time.monotonic() + 60
                while not (state := client.read_flow_run(run.id).state).is_final():
                    assert time.monotonic() < deadline, state
                    time.sleep(0.5)
            record = final_record(run.id)
            assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=20), (
                "a lease of the handover outlived the cancel"
            )
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    assert state.is_cancelled(), f"{state!r}\n{logs[-4000:]}"
    (old,) = record.attempts
    assert old.replacement["state"] == "terminated" and "ended unused" in old.message
    assert record.current_attempt is None
    assert not (tmp_path / "result.json").exists()


def test_stopping_the_worker_mid_handover_ends_both_leases(prefect_api, tmp_path):
    from prefect import get_client

    # The handover lasts half a minute (a 30 s notice, whose end the step's watcher
    # enforces with SIGKILL; a 60 s emergency save; a 60 s grace): the worker is stopped
    # mid-handover however slow its SIGTERM is on a busy machine, never after the old
    # attempt ended and the replacement was adopted (with a 2 s notice it was, twice, in
    # full runs beside another suite).
    with _cloud(tmp_path, grace_wall_seconds=60.0, notice_wall_seconds=30.0) as cloud:
        deployment_id = _deploy("spot-handover-stop", cloud, tmp_path)
        with running_worker("spot-handover-stop", tmp_path / "worker.log") as worker:
            run = _start(deployment_id, tmp_path, save_seconds=60.0)
            _replacement_launched(run.id, timeout=120)
        # the worker was stopped (SIGTERM) as the block ended
        assert worker.returncode is not None
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=20), (
            "a lease of the handover outlived the worker"
        )
        record = _record(run.id)
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run.id).state
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    (old,) = record.attempts
    assert old.ended_at is not None and record.current_attempt is None, logs[-4000:]
    assert old.replacement["state"] == "terminated" and "ended unused" in old.message
    # never left Running or Pending with nothing to run it
    assert state.is_final(), f"{state!r}\n{logs[-4000:]}"


# -- the replacement's wait for the go (prefect_spot._engine), on its own ----------------------
def _waiting_replacement(tmp_path: Path, flow_run_id, *, deadline_in: float, margin: float):
    """``python -m prefect_spot._engine`` as attempt 2, the replacement of attempt 1."""
    from prefect.settings import get_current_settings

    env = {
        **os.environ,
        "PREFECT_API_URL": get_current_settings().api.url,
        "PREFECT__FLOW_RUN_ID": str(flow_run_id),
        "SPOT_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
        "SPOT_ATTEMPT": "2",
        "SPOT_HANDOVER_FROM": "1",
        "SPOT_HANDOVER_DEADLINE": f"{time.time() + deadline_in:.3f}",
        "SPOT_HANDOVER_GO_MARGIN": f"{margin:g}",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "prefect_spot._engine"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _pending_flow_run():
    from prefect import flow, get_client
    from prefect.states import Pending

    @flow(name="handover-wait")
    def never_runs() -> None:
        raise AssertionError("the engine must not start")

    with get_client(sync_client=True) as client:
        return client.create_flow_run(never_runs, state=Pending())


def test_a_replacement_without_the_go_stops_waiting_in_bounded_time(prefect_api, tmp_path):
    """No go (the worker is gone), or one addressed to another attempt: the wait ends at
    the notice's deadline plus the margin, with one line and exit 74 (the infrastructure,
    not the flow), and the flow run's engine never starts."""
    from prefect import get_client

    run = _pending_flow_run()
    store = open_store((tmp_path / "ckpt").as_uri())
    mark_go(store, 1, 3, time.time())  # a go for another attempt is no go for this one
    started = time.monotonic()
    proc = _waiting_replacement(tmp_path, run.id, deadline_in=2.0, margin=2.0)
    out, err = proc.communicate(timeout=120)
    waited = time.monotonic() - started
    assert proc.returncode == INFRASTRUCTURE_EXIT_CODE, (out, err)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "got none" in errors[0] and "not started" in errors[0], err
    assert 4.0 <= waited < 60, waited
    with get_client(sync_client=True) as client:
        after = client.read_flow_run(run.id)
    assert after.state.is_pending() and after.run_count == 0, after.state


def test_a_replacement_whose_flow_run_was_cancelled_never_starts_it(prefect_api, tmp_path):
    from prefect import get_client
    from prefect.states import Cancelled

    run = _pending_flow_run()
    proc = _waiting_replacement(tmp_path, run.id, deadline_in=120.0, margin=60.0)
    time.sleep(1.0)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelled(message="the user cancels"), force=True)
        out, err = proc.communicate(timeout=60)
        after = client.read_flow_run(run.id)
    assert proc.returncode not in (0, None), (out, err)
    assert "Cancelled" in err and "not started" in err, err
    assert after.state.is_cancelled() and after.run_count == 0, after.state
