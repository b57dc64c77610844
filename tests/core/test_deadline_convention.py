"""The settings' one time convention for deadline-bound jobs (``spot_core.settings``):
``deadline``, ``work`` and ``restart_overhead`` count in the provider's capacity time (trace
time on the local cloud), an absolute deadline is wall time; and the CLI, one of the
surfaces that build their JobSpec with ``SpotSettings.deadline_spec``, runs the shared
greedy scenario (``spot_helpers.DEADLINE_ZONES``) as the engines do."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from spot_core.errors import ConfigError
from spot_core.model import JobRecord
from spot_core.settings import SpotSettings, wall_deadline
from tests.support.spot_helpers import (
    DEADLINE_KNOBS,
    DEADLINE_SCALE,
    check_greedy_record,
    deadline_traces,
    marked_processes,
    train_command,
)


def test_durations_count_in_capacity_time_and_absolute_times_in_wall_time():
    settings = SpotSettings.build(**DEADLINE_KNOBS)
    on_local = settings.deadline_spec(created_at=1000.0, capacity_per_wall=300.0)
    assert on_local == {
        "deadline_at": 1000.0 + 16800.0 / 300.0,
        "work_capacity_seconds": 1800.0,
        "restart_overhead_capacity_seconds": 1800.0,
        "total_steps": 40,
        "deadline_policy": "greedy",
    }
    on_ec2 = settings.deadline_spec(created_at=1000.0, capacity_per_wall=1.0)
    assert on_ec2["deadline_at"] == 1000.0 + 16800.0
    when = datetime(2026, 12, 1, 8, tzinfo=UTC)
    for given in (
        when,
        "2026-12-01T08:00Z",
        "2026-12-01T08:00:00",
        datetime(2026, 12, 1, 8),
        "2026-12-01T09:00+01:00",
    ):
        absolute = SpotSettings.build(deadline=given).deadline_at
        assert absolute == when, given
        for scale in (1.0, 3600.0):
            assert (
                wall_deadline(absolute, created_at=0.0, capacity_per_wall=scale) == when.timestamp()
            )
    assert SpotSettings.build(deadline=timedelta(hours=2)).deadline_capacity_seconds == 7200.0
    assert wall_deadline(None, created_at=5.0, capacity_per_wall=1.0) is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"deadline": "tomorrow"},
            "train: deadline='tomorrow' is neither a duration (90m, 12h, "
            "2d) nor an ISO time (2026-12-01T08:00Z)",
        ),
        ({"deadline": "0s"}, "train: deadline='0s' must be > 0s"),
        ({"work": "1h"}, "train: work=1h needs deadline=DURATION too"),
        (
            {"deadline": "2h", "work": "1h", "deadline_policy": "nope"},
            "train: deadline_policy='nope' is not one of",
        ),
    ],
)
def test_bad_deadline_values_are_one_line(values, message):
    with pytest.raises(ConfigError) as info:
        SpotSettings.build(where="train", **values)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.timeout(120)
def test_the_cli_runs_greedy_on_the_same_scenario(tmp_path):
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in DEADLINE_KNOBS.items()]
    traces = [f"--trace={path}" for path in deadline_traces(tmp_path / "traces")]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "run",
            *traces,
            f"--time-scale={DEADLINE_SCALE}",
            *flags,
            "--capacity-wait=0.5",
            "--poll-interval=0.1",
            "--json",
            "--",
            *train_command(steps=40, step_seconds=0.05, every_steps=10),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = JobRecord.from_dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    check_greedy_record(record)
    assert not marked_processes(str(tmp_path))


def test_every_job_surface_takes_the_deadline_knobs():
    """The CLI, both Airflow operators, the Prefect block (so SpotTaskRunner's config) and
    the worker's variables; the table tests of each engine check each surface against
    these knobs (default, description, refusals)."""
    from spot_core.settings import BLOCK, CLI, OPERATOR, POD_OPERATOR, WORKER, knobs_for

    wanted = {"deadline", "work", "total_steps", "restart_overhead", "deadline_policy"}
    for surface in (CLI, OPERATOR, POD_OPERATOR, BLOCK, WORKER):
        assert wanted <= {k.name for k in knobs_for(surface)}, surface
