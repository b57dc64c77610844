"""Numbers bounded where they are read: attempt numbers (SPOT_ATTEMPT, a store's fence)
and the job's work against its deadline, each refused in one line naming the fix."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spot_core.attempt_env import AttemptEnv
from spot_core.bounds import MAX_ATTEMPT
from spot_core.checkpoint import Checkpointer, open_store
from spot_core.checkpoint.store import FENCE_KEY
from spot_core.errors import ConfigError
from spot_core.settings import SpotSettings


@pytest.fixture
def store(tmp_path):
    store = open_store((tmp_path / "ckpt").as_uri())
    store.save(1, {"a": b"1"}, attempt=1)
    return store


@pytest.mark.parametrize("attempt", ["abc", "1" + "0" * 23, "0", "-3", "2.0", "1e3"])
def test_a_bad_spot_attempt_is_one_config_error_and_fences_nothing(store, attempt):
    environ = {"SPOT_ATTEMPT": attempt, "SPOT_CHECKPOINT_URI": store.uri}
    with pytest.raises(
        ConfigError,
        match=r"SPOT_ATTEMPT=.* is not an attempt number from 1 "
        r"to 1,000,000",
    ) as info:
        Checkpointer.from_env(environ)
    assert "\n" not in str(info.value)
    assert store.fence_level() == 1


def test_spot_attempt_takes_whole_numbers_up_to_the_bound():
    assert AttemptEnv.from_environ({}).attempt == 1
    assert AttemptEnv.from_environ({"SPOT_ATTEMPT": " 7 "}).attempt == 7
    assert AttemptEnv.from_environ({"SPOT_ATTEMPT": str(MAX_ATTEMPT)}).attempt == MAX_ATTEMPT


@pytest.mark.parametrize("attempt", [10**23, MAX_ATTEMPT + 1])
def test_a_fence_or_save_past_the_bound_is_refused_and_the_store_stays_usable(store, attempt):
    with pytest.raises(ConfigError, match="attempt must be an int from 0 to 1,000,000"):
        store.fence(attempt)
    with pytest.raises(ConfigError, match="attempt must be an int from 0 to 1,000,000"):
        store.save(2, {"a": b"2"}, attempt=attempt)
    assert store.fence_level() == 1
    store.fence(2)
    store.save(2, {"a": b"2"}, attempt=2)
    assert store.latest().step == 2


def test_a_fence_left_at_10_to_the_23_by_an_older_version_does_not_fence_for_ever(store):
    (Path(store.backend.root) / FENCE_KEY).write_bytes(
        json.dumps({"attempt": 10**23, "fenced_at": 1.0}).encode()
    )
    assert store.fence_level() == 1  # read as corrupt (warned): committed attempts fence
    store.fence(2)  # the next attempt rewrites it
    store.save(2, {"a": b"2"}, attempt=2)
    assert store.latest().step == 2 and store.fence_level() == 2


def test_work_beyond_the_deadline_is_refused_on_every_surface_in_one_line():
    """The model's check, so the CLI, the operators, the block and the worker (which all
    build ``SpotSettings``) refuse it alike; an absolute deadline is checked where the job
    spec is built, against its capacity time."""
    with pytest.raises(
        ConfigError,
        match=r"^work=3h is more than deadline=2h: the job "
        r"cannot finish in time even on on-demand",
    ):
        SpotSettings.build(work="3h", deadline="2h")
    assert SpotSettings.build(work="2h", deadline="2h").work_capacity_seconds == 7200.0
    soon = datetime.now(UTC) + timedelta(hours=1)
    settings = SpotSettings.build(work="3h", deadline=soon)
    with pytest.raises(ConfigError, match=r"work=3h is more than deadline=.*of capacity time"):
        settings.deadline_spec(created_at=soon.timestamp() - 3600, capacity_per_wall=1.0)
    # the local cloud replays 3,600 trace seconds per wall second: 1 wall hour is plenty
    assert (
        settings.deadline_spec(created_at=soon.timestamp() - 3600, capacity_per_wall=3600.0)[
            "work_capacity_seconds"
        ]
        == 10800.0
    )


MEMORY_CAP = 1536 * 2**20  # bytes of address space for the planning rows below


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


@pytest.mark.parametrize(
    "command",
    [
        [
            "run",
            "--deadline",
            "365d",
            "--work",
            "1h",
            "--total-steps",
            "10",
            "--deadline-policy",
            "default",
            "--",
            "true",
        ],
        [
            "simulate",
            "--trace",
            "TRACE",
            "--task-hours",
            "1",
            "--deadline-hours",
            "336",
            "--restart-overhead-hours",
            "0.1",
            "--policy",
            "default",
            "--start-tick",
            "2000",
        ],
    ],
    ids=["run a year ahead", "simulate 14 days"],
)
def test_a_far_deadline_is_planned_in_bounded_memory(tmp_path, command):
    """The deadline policy's tables are sized from the work: a job of an hour with a
    deadline a year away (hundreds of GiB before), or 14 days in `simulate` (3 GB and
    minutes before), plans within 1.5 GiB of address space (memory and time:
    bench/README.md)."""
    from tests.support.spot_helpers import TRACES

    trace = TRACES / "aws-v100-2023-02" / "us-east-1a_v100_1.csv"
    words = [str(trace) if w == "TRACE" else w for w in command]
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", *words],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=_capped,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_work_past_what_a_plan_holds_is_refused_in_one_line():
    from spot_core.policy.deadline.base import PLAN_MAX_TICKS, Job
    from spot_core.policy.deadline.mdp import ForecastDP
    from spot_core.policy.deadline.replay import Replay
    from tests.support.spot_helpers import trace

    replay = Replay.from_traces(
        [trace("us-east-1a_v100_1", "1" * (PLAN_MAX_TICKS + 700), tick_seconds=600.0)]
    )
    tick = replay.tick_seconds
    job = Job(PLAN_MAX_TICKS * tick, (PLAN_MAX_TICKS + 600) * tick, 0.0)
    with pytest.raises(
        ConfigError,
        match=r"^deadline policy default: the work and two "
        r"restarts need 10,000 ticks .* a plan holds at most 10,000",
    ):
        ForecastDP().plan(replay.window(0, job))


@pytest.mark.parametrize(
    "variable, value", [("SPOT_HEARTBEAT_TIMEOUT", "1e300"), ("SPOT_CHECKPOINT_INTERVAL", "1e300")]
)
def test_an_absurd_seconds_variable_is_one_line(variable, value):
    with pytest.raises(
        ConfigError, match=f"{variable}='1e300' is not a number of seconds > 0 and at most 86400"
    ):
        AttemptEnv.from_environ({variable: value})


def test_an_interruption_watcher_refuses_a_wait_no_thread_can_make():
    from spot_core.interruption import InterruptionWatcher

    with pytest.raises(ConfigError, match="at most 86400"):
        InterruptionWatcher([], poll_interval=1e300)
