"""Every command's bad flags: exit code 2, one line on stderr naming the flag, no
traceback, and nothing created where the command ran (no checkpoint folder, no file).

Each row runs the real `spot-pipelines` in a fresh, empty working folder."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from spot_core.market import fixture_trace_paths

pytestmark = pytest.mark.timeout(120)

TRACE = str(fixture_trace_paths()[0])
# An absolute deadline 30 wall minutes ahead: 2 h of work cannot fit at --time-scale 1.
SOON = (datetime.now(UTC) + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%MZ")
SIM = (
    "--trace",
    TRACE,
    "--task-hours",
    "2",
    "--deadline-hours",
    "4",
    "--restart-overhead-hours",
    "0.1",
)

RUN_ROWS = [
    (["--max-spot-price", "nan"], "--max-spot-price"),
    (["--max-spot-price", "-1"], "--max-spot-price"),
    (["--max-spot-price", "inf"], "--max-spot-price"),
    (["--max-spot-price", "cheap"], "--max-spot-price"),
    (["--pools", ",,"], "--pools"),
    (["--pools", " , "], "--pools"),
    (["--deadline", "0s"], "--deadline"),
    (["--deadline", "2020-01-01T00:00Z"], "--deadline"),
    (["--deadline", "inf"], "--deadline"),
    (["--deadline", "9" * 400 + "h"], "--deadline"),
    (["--work", "2h"], "--work"),
    (["--deadline-policy", "greedy"], "--deadline-policy"),
    (["--total-steps", "-5"], "--total-steps"),
    (["--total-steps", "1.5"], "--total-steps"),
    (["--start-tick", "99999999"], "--start-tick"),
    (["--start-tick", "-1"], "--start-tick"),
    (["--start-tick", "x"], "--start-tick"),
    (["--time-scale", "inf"], "--time-scale"),
    (["--time-scale", "nan"], "--time-scale"),
    (["--time-scale", "1e400"], "--time-scale"),
    (["--time-scale", "0"], "--time-scale"),
    (["--capacity-wait", "inf"], "--capacity-wait"),
    (["--capacity-wait", "-5s"], "--capacity-wait"),
    (["--heartbeat-timeout", "0"], "--heartbeat-timeout"),
    (["--max-capacity-waits", "0"], "--max-capacity-waits"),
    (["--attempt-timeout", "nan"], "--attempt-timeout"),
    (["--job-id", ""], "--job-id"),  # given but empty: never "no job id"
    (["--work", "2h", "--deadline", "1h"], "--work 2h is more than --deadline 1h"),
    (["--time-scale", "1", "--work", "2h", "--deadline", SOON], "--work 2h is more than"),
    (["--time-scale", "1e12"], "--time-scale"),  # spun a core per trace tick
    (["--time-scale", "1e6"], "--time-scale"),  # one 195 s tick under a millisecond
    (["--poll-interval", "1e300"], "--poll-interval"),  # a traceback from Event.wait
    (["--deadline", "18250d", "--work", "1h", "--deadline-policy", "default"], "--deadline"),
    (["--max-preemptions", "99999999999999999999"], "--max-preemptions"),
]

SIMULATE_ROWS = [
    (["--task-hours", "nan"], "--task-hours"),
    (["--task-hours", "x"], "--task-hours"),
    (["--task-hours", "-1"], "--task-hours"),
    (["--deadline-hours", "inf"], "--deadline-hours"),
    (["--restart-overhead-hours", "-1"], "--restart-overhead-hours"),
    (["--on-demand-price", "cheap"], "--on-demand-price"),
    (["--on-demand-price", "-3"], "--on-demand-price"),
    (["--windows", "0"], "--windows"),
    (["--windows", "2", "--seed", "x"], "--seed"),
    (["--start-tick", "99999999"], "--start-tick"),
    (["--start-tick", "-1"], "--start-tick"),
    (["--windows", "2", "--start-tick", "0"], "--start-tick"),
    (["--windows", "99999999999999999999"], "--windows"),  # was a numpy traceback
    (["--windows", "2", "--seed", "-1"], "--seed"),
]

WATCH_ROWS = [
    (["--poll-interval", "inf"], "--poll-interval"),
    (["--poll-interval", "-1"], "--poll-interval"),
    (["--timeout", "nan"], "--timeout"),
    (["--grace-seconds", "inf"], "--grace-seconds"),
    (["--heartbeat-timeout", "inf"], "--heartbeat-timeout"),
    (["--cloud", "nope"], "cloud 'nope'"),
    (["--poll-interval", "1e300"], "--poll-interval"),  # killed the watcher thread
    (["--timeout", "1e300"], "--timeout"),
    (["--grace-seconds", "1e300"], "--grace-seconds"),
    (["--heartbeat-timeout", "2d"], "--heartbeat-timeout"),
]

DEMO_ROWS = [
    (["--steps", "-5"], "--steps"),
    (["--steps", "1e3"], "--steps"),
    (["--start-tick", "99999"], "--start-tick"),
    (["--start-tick", "-1"], "--start-tick"),
    (["--engine", "nope"], "--engine"),
    (["--steps", "99999999999999999999"], "--steps"),
]


def _windows(args: list[str]) -> list[str]:
    """Simulate needs windows: rows about other flags get two random ones."""
    return args if {"--windows", "--start-tick"} & set(args) else [*args, "--windows", "2"]


ROWS = (
    [("run", a, ["--", "true"], w) for a, w in RUN_ROWS]
    + [("simulate", a, [*SIM, *_windows(a)], w) for a, w in SIMULATE_ROWS]
    + [("watch", a, ["--", "true"], w) for a, w in WATCH_ROWS]
    + [("demo", a, [], w) for a, w in DEMO_ROWS]
)


@pytest.mark.parametrize(
    "command, args, more, flag", ROWS, ids=[f"{c} {' '.join(a)[:40]}" for c, a, _, _ in ROWS]
)
def test_a_bad_flag_is_one_line_naming_it_exit_2_and_nothing_created(
    tmp_path, command, args, more, flag
):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    words = [*more] if command == "simulate" else [*args, *more]
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", command, *words],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=cwd,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert flag in lines[0] and f"spot-pipelines {command}" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert not list(cwd.iterdir()), f"left behind: {sorted(p.name for p in cwd.iterdir())}"


def test_a_closed_stdout_ends_quietly(tmp_path):
    """`spot-pipelines simulate ... | head -c1`: no BrokenPipeError traceback. The reader
    here (`true`) leaves before the simulation prints, so the pipe is surely closed."""
    proc = subprocess.run(
        f"{sys.executable} -m spot_core.cli simulate {' '.join(SIM)} --windows 3 | true",
        shell=True,
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    assert proc.stderr == "", proc.stderr


@pytest.mark.parametrize("attempt", ["abc", "1" + "0" * 23, "0", "-1", "1.5"])
def test_a_bad_spot_attempt_is_one_line(tmp_path, attempt):
    """``SPOT_ATTEMPT`` is set by the providers; a hand-set bad one (a word, 10^23, which
    would fence the store there for ever) is one line naming it, not a raw ValueError."""
    env = {
        **os.environ,
        "SPOT_ATTEMPT": attempt,
        "SPOT_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "watch", "--", "true"],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
        env=env,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "SPOT_ATTEMPT" in lines[0] and "1,000,000" in lines[0], lines[0]
    assert not (tmp_path / "ckpt").exists()
