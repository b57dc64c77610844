"""Deadline policies from Prefect: a SpotConfiguration's deadline knobs reach the
controller through SpotTaskRunner and the spot worker, in the settings' time convention,
and a bad combination is refused when the block or job variables are validated.

The job runs on an in-process local cloud replaying a hand-built trace
(``spot_helpers.DEADLINE_ZONES``): greedy's plan waits for zone a's spot instead of the
safety net's immediate on-demand launch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow
from pydantic import ValidationError

from prefect_spot import SpotConfiguration, SpotTaskRunner, _jobs, spot_record
from prefect_spot.task_runners import SpotJobFailed
from prefect_spot.workers import SpotJobConfiguration, SpotJobVariables
from tests.support.prefect_helpers import (
    count_to,
    deploy_example_flow,
    final_record,
    running_worker,
    wait_completed,
)
from tests.support.spot_helpers import (
    DEADLINE_KNOBS,
    DEADLINE_SCALE,
    DEADLINE_TICK,
    check_greedy_record,
    deadline_traces,
    marked_processes,
)

pytestmark = pytest.mark.timeout(180)


def _options(tmp_path) -> dict:
    return {"traces": deadline_traces(tmp_path / "traces"), "time_scale": DEADLINE_SCALE}


def test_greedy_from_the_task_runner_waits_for_spot_and_meets_its_deadline(
    prefect_api, tmp_path, monkeypatch
):
    monkeypatch.delenv("SPOT_LOCAL_CLOUD_URL", raising=False)  # this test's own cloud
    config = SpotConfiguration(
        provider_options=_options(tmp_path), capacity_wait=0.5, poll_interval=0.1, **DEADLINE_KNOBS
    )
    runner = SpotTaskRunner(config, checkpoint_every_steps=10, workdir=tmp_path)

    @flow(task_runner=runner)
    def pipeline():
        future = count_to.submit(40, 0.05)
        return future.result(), spot_record(future)

    try:
        result, record = pipeline()
    except SpotJobFailed as exc:  # say what the step was doing: its lease's own log
        logs = "".join(
            log.read_text(errors="replace")[-2000:]
            for log in sorted((tmp_path / "cloud").glob("*.log"))
        )
        raise AssertionError(f"{exc}\nlease logs:\n{logs}") from exc
    assert result["total"] == 40
    check_greedy_record(record)
    assert not marked_processes(str(tmp_path))


def test_worker_job_with_a_greedy_deadline_policy_waits_for_spot(prefect_api, tmp_path):
    """Deadline knobs as job variables of a deployment (seconds, as the work-pool form
    takes durations): the flow run's job follows greedy's plan. The deadline is 28 ticks
    (56 wall seconds) of trace time, room for a flow run's start on a busy machine."""
    from prefect import get_client
    from prefect.deployments import run_deployment

    pool = "spot-deadline"
    deployment_id = deploy_example_flow(
        pool,
        "deadline",
        {
            "deadline": 28 * DEADLINE_TICK,
            "work": 3 * DEADLINE_TICK,
            "restart_overhead": 3 * DEADLINE_TICK,
            "total_steps": 10,
            "deadline_policy": "greedy",
            "provider_options": _options(tmp_path),
            "checkpoint_root": (tmp_path / "ckpt").as_uri(),
            "capacity_wait": 0.5,
        },
        source=Path(__file__).parent,
        entrypoint="spot_test_flows.py:naps",
    )
    with running_worker(pool, tmp_path / "worker.log"):
        run = run_deployment(
            deployment_id, timeout=0, parameters={"seconds": 1.0, "marks": str(tmp_path / "marks")}
        )
        with get_client(sync_client=True) as client:
            run = wait_completed(client, run.id, timeout=120)
        record = final_record(run.id)
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    assert run.state.is_completed(), f"{run.state!r}\n{logs[-4000:]}"
    check_greedy_record(record)


def test_the_worker_builds_the_job_spec_in_capacity_time(tmp_path, monkeypatch):
    """Job variables -> job configuration -> the JobSpec the worker drives: the deadline
    is 28 ticks of trace time from the job's creation (56 wall seconds here), work and
    restart overhead stay capacity seconds, and a resumed job keeps its deadline."""
    monkeypatch.delenv("SPOT_LOCAL_CLOUD_URL", raising=False)
    variables = SpotJobVariables(provider_options=_options(tmp_path), **DEADLINE_KNOBS)
    configuration = SpotJobConfiguration(
        **variables.model_dump(exclude={"name", "labels", "command", "env"})
    )
    config = configuration.spot_configuration()
    provider = _jobs.open_configured_provider(config, workdir=str(tmp_path / "cloud"))
    try:
        spec = _jobs.job_spec(
            config,
            provider,
            job_id="flow-run-x",
            command=["true"],
            checkpoint_uri=(tmp_path / "ckpt").as_uri(),
            created_at=1000.0,
        )
    finally:
        provider.close()
    assert spec.deadline_at == 1000.0 + 28 * DEADLINE_TICK / DEADLINE_SCALE
    assert (
        spec.work_capacity_seconds,
        spec.restart_overhead_capacity_seconds,
        spec.total_steps,
        spec.deadline_policy,
    ) == (1800.0, 1800.0, 40, "greedy")


def test_an_iso_deadline_is_wall_time_whatever_the_scale_and_saves(prefect_api):
    config = SpotConfiguration(deadline="2026-12-01T08:00Z", work="1h", deadline_policy="greedy")
    settings = config.settings()
    for scale in (1.0, 3600.0):
        assert (
            settings.deadline_spec(created_at=0.0, capacity_per_wall=scale)["deadline_at"]
            == 1796112000.0
        )
    config.save("deadline-iso", overwrite=True)
    loaded = SpotConfiguration.load("deadline-iso")
    assert (loaded.deadline, loaded.work, loaded.deadline_policy) == (
        config.deadline,
        3600.0,
        "greedy",
    )


@pytest.mark.parametrize("model", [SpotConfiguration, SpotJobVariables])
@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"deadline_policy": "greedy", "work": "1h"}, "work=1h needs deadline=DURATION too"),
        (
            {"deadline_policy": "greedy", "deadline": "2h"},
            "deadline_policy='greedy' needs deadline and work",
        ),
        (
            {"deadline_policy": "psychic", "deadline": "2h", "work": "1h"},
            "deadline_policy='psychic' is not one of",
        ),
        ({"deadline": "tomorrow"}, "deadline='tomorrow' is neither a duration"),
    ],
)
def test_a_bad_combination_is_refused_in_one_line(model, knobs, message):
    with pytest.raises(ValidationError) as info:
        model(**knobs)
    (error,) = info.value.errors()
    text = str(error["ctx"]["error"]) if "ctx" in error else error["msg"]
    assert message in text and "\n" not in text, text
