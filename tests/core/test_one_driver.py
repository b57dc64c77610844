"""One live driver per job: a second driver of a job whose heartbeat another driver
renewed within its timeout is refused in one line naming that driver, and a step fenced
out by another driver's attempt never counts as the user's failure.

Real `spot-pipelines run` processes on the local cloud (a paused driver is a SIGSTOPped
one, as a laptop's suspended terminal or a stalled VM is), real file:// stores; the
controller-level rows use a real lease process and a heartbeat written as another
driver process would write it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_core.checkpoint import open_store
from spot_core.checkpoint.heartbeat import HEARTBEAT_KEY, DriverIdentity, Heartbeat
from spot_core.controller import Controller, JobSpec
from spot_core.errors import DriverConflict
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.model import Outcome
from spot_core.policy.retry import RetryPolicy
from spot_core.providers.local import LocalProvider
from tests.support.spot_helpers import marked_processes, trace, train_command, wait_until

pytestmark = pytest.mark.timeout(240)

HEARTBEAT = 60.0  # seconds: long enough that no beat in these tests goes stale by itself
SLACK = 60.0  # seconds: what a loaded machine may add to a wait
OTHER = DriverIdentity("f" * 32, "other-host", 4242)


def calm_trace(tmp_path: Path) -> Path:
    """One zone whose spot capacity never goes away (JSON traces count 1 as preempted)."""
    path = tmp_path / "us-east-1a_calm.json"
    path.write_text(
        json.dumps(
            {
                "metadata": {
                    "gap_seconds": 600,
                    "price_info": {"price": 0.9, "on_demand_price": 3.06},
                },
                "data": [0] * 5000,
            }
        )
    )
    return path


def start_run(
    tmp_path: Path, job_id: str, uri: str, *extra: str, steps: int = 100000
) -> subprocess.Popen:
    args = [
        "--trace",
        str(calm_trace(tmp_path)),
        "--job-id",
        job_id,
        "--checkpoint-uri",
        uri,
        "--heartbeat-timeout",
        f"{HEARTBEAT:g}s",
        "--json",
        *extra,
        "--",
        *train_command(steps=steps, step_seconds=0.02, every_steps=20),
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "spot_core.cli", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )


def wait_for_progress(store, proc: subprocess.Popen, above: int = 0) -> None:
    assert wait_until(
        lambda: (
            (store.latest() is not None and store.latest().step > above) or proc.poll() is not None
        ),
        timeout=SLACK,
    ), "no checkpoint in time"
    assert proc.poll() is None, proc.communicate(timeout=10)


def refusal(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=SLACK)
    assert proc.returncode == 2, (out[-2000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def final_record(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_second_run_of_a_live_job_is_refused_and_the_paused_first_one_finishes(tmp_path):
    """The issue's case: `run` paused (SIGSTOP), a second `run` of its job id started. The
    second is refused in one line naming the first (host, pid, age of its beat) and how
    to take over; it launches nothing and fences nothing, so the first, resumed, finishes
    with no attempt lost to it."""
    uri = (tmp_path / "ckpt").as_uri()
    store = open_store(uri)
    first = start_run(tmp_path, "twin", uri, steps=400)
    try:
        wait_for_progress(store, first)
        level = store.fence_level()
        first.send_signal(signal.SIGSTOP)
        second = start_run(tmp_path, "twin", uri, steps=400)
        line = refusal(second)
        assert f"{socket.gethostname()} pid {first.pid} renewed its heartbeat" in line, line
        age = float(re.search(r"heartbeat (\d+)s ago", line)[1])
        assert age < HEARTBEAT and "--take-over" in line and "twin" in line
        assert store.fence_level() == level, "the refused driver fenced the store"
    finally:
        first.send_signal(signal.SIGCONT)
    record = final_record(first)
    assert record["status"] == "succeeded" and record["user_failures"] == 0
    assert [a["outcome"] for a in record["attempts"]] == ["succeeded"]
    assert not marked_processes(str(tmp_path))


def test_take_over_starts_at_once_after_a_killed_driver(tmp_path):
    """SIGKILL leaves an unreleased beat: a re-run is refused until the beat's timeout,
    and with --take-over it starts at once, resumes from the dead run's checkpoint and
    finishes."""
    uri = (tmp_path / "ckpt").as_uri()
    store = open_store(uri)
    dead = start_run(tmp_path, "killed", uri)
    try:
        wait_for_progress(store, dead)
    finally:
        dead.kill()
        dead.wait(timeout=10)
    step = store.latest().step
    assert "--take-over" in refusal(start_run(tmp_path, "killed", uri, steps=300))
    record = final_record(start_run(tmp_path, "killed", uri, "--take-over", steps=300))
    assert record["status"] == "succeeded"
    assert record["attempts"][0]["checkpoint_step_start"] >= step
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=SLACK)


def test_a_rerun_after_a_finished_run_needs_no_take_over(tmp_path):
    """A driver that closes its attempt releases the beat: the same job id runs again at
    once (a finished or Ctrl-C'd run holds nothing)."""
    uri = (tmp_path / "ckpt").as_uri()
    assert final_record(start_run(tmp_path, "again", uri, steps=40))["status"] == "succeeded"
    assert final_record(start_run(tmp_path, "again", uri, steps=60))["status"] == "succeeded"


def test_a_resumed_driver_that_was_taken_over_stops_without_a_user_failure(tmp_path):
    """--take-over while the first driver was only paused (the misuse the flag's help
    warns about): the first one, resumed, finds its step fenced out. Its attempt closes
    as infrastructure_failed (never user_failed), it launches nothing more, and it ends
    in one line saying the job was taken over; the second finishes."""
    uri = (tmp_path / "ckpt").as_uri()
    store = open_store(uri)
    first = start_run(tmp_path, "taken", uri)
    wait_for_progress(store, first)
    first.send_signal(signal.SIGSTOP)
    try:
        second = start_run(tmp_path, "taken", uri, "--take-over", steps=1500)
        wait_for_progress(store, second, above=store.latest().step)
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=SLACK)
    assert first.returncode == 2, err[-2000:]
    assert re.search(r"(driven by another driver|was taken over)", err), err[-2000:]
    # with --json the events go to stderr, each an event line and its wrapped reason
    events = re.split(r"\n(?=\S)", err)
    closed = [
        " ".join(event.split())
        for event in events
        if "attempt 1 " in event and event.split()[1:2] != ["launched"]
    ]
    assert closed and "infrastructure_failed" in closed[0] and "fenced out" in closed[0], err
    assert "user_failed" not in out + err
    record = final_record(second)
    assert record["status"] == "succeeded" and record["user_failures"] == 0
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=SLACK)


# -- the controller itself ------------------------------------------------------------------
def written_ago(store, key: str, seconds: float) -> None:
    """Make a file store's object read as written ``seconds`` ago on the store's clock (its
    mtime: what ages are judged by, never the time written inside it)."""
    path = Path(store.backend.root) / key
    when = path.stat().st_mtime - seconds
    os.utime(path, (when, when))


def _controller(tmp_path, **options) -> tuple[Controller, JobSpec, LocalProvider]:
    provider = LocalProvider.from_traces(
        [trace("us-east-1a_calm", "1" * 4000, tick_seconds=600.0)],
        time_scale=600.0,
        workdir=tmp_path / "cloud",
        config=LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0),
    )
    spec = JobSpec(
        job_id="job",
        command=train_command(steps=100000, step_seconds=0.02, every_steps=5),
        checkpoint_uri=(tmp_path / "ckpt").as_uri(),
        pools=provider.pools(),
    )
    return _driver(provider, **options), spec, provider


def _driver(provider, **options) -> Controller:
    return Controller(
        provider,
        provider.market,
        RetryPolicy(max_user_retries=0),
        poll_interval_seconds=0.1,
        heartbeat_timeout_seconds=HEARTBEAT,
        **options,
    )


def test_a_fenced_out_step_is_an_infrastructure_failure_and_the_driver_stops(tmp_path):
    """Another driver process launches attempt 2 of the job while attempt 1 runs: attempt
    1's next save is fenced out and its step exits 1 with the FencedOut traceback. The
    attempt closes as infrastructure_failed (the user's budget, 0 retries here, is not
    touched), and the driver refuses to launch again."""
    controller, spec, provider = _controller(tmp_path)
    with provider:
        nxt = controller.advance(spec, controller.new_record(spec))
        store = open_store(spec.checkpoint_uri)
        assert wait_until(lambda: store.latest() is not None, timeout=SLACK)
        store.fence(2)  # what the other driver's launch of attempt 2 does
        Heartbeat(store, timeout=HEARTBEAT, identity=OTHER).renew(2, time.time())
        give_up = time.monotonic() + SLACK
        while nxt.action == "watch" and time.monotonic() < give_up:
            time.sleep(0.1)
            nxt = controller.check(spec, nxt)
        assert nxt.action == "ended"
        attempt = nxt.record.attempts[-1]
        assert attempt.outcome is Outcome.INFRASTRUCTURE_FAILED, attempt.message
        assert attempt.message.startswith("fenced out: attempt 2") and nxt.record.user_failures == 0
        with pytest.raises(DriverConflict, match="other-host pid 4242"):
            controller.advance(spec, nxt.record)
        assert store.fence_level() == 2
    assert not marked_processes(str(tmp_path))


@pytest.mark.parametrize(
    "beat, refused",
    [
        ("fresh", True),  # renewed 1 s ago by another process
        ("stale", False),  # older than the writer's own timeout: it is gone
        ("released", False),  # its driver closed the attempt
        ("mine", False),  # this process's own beat (a driver that resumes its job)
    ],
)
def test_a_launch_reads_who_holds_the_job(tmp_path, beat, refused):
    controller, spec, provider = _controller(tmp_path)
    store = open_store(spec.checkpoint_uri)
    now = time.time()
    writer = Heartbeat(
        store,
        timeout=5.0 if beat == "stale" else HEARTBEAT,
        identity=None if beat == "mine" else OTHER,
    )
    if beat == "released":
        writer.renew(1, now - 1)
        writer.release(1, now - 1)
    else:
        writer.renew(1, now - (10.0 if beat == "stale" else 1.0))
        written_ago(store, HEARTBEAT_KEY, 10.0 if beat == "stale" else 1.0)
    store.fence(1)
    with provider:
        if refused:
            with pytest.raises(
                DriverConflict,
                match=r"other-host pid 4242 renewed its heartbeat "
                r"1s ago \(attempt 1, timeout 60s\).*--take-over",
            ):
                controller.advance(spec, controller.new_record(spec))
            assert store.fence_level() == 1
            controller = _driver(provider, take_over=True)
        nxt = controller.advance(spec, controller.new_record(spec))
        assert nxt.action == "watch" and nxt.lease.attempt == 2
        controller.stop(spec, nxt.record, "test over")
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=SLACK)


def test_take_over_is_a_setting_of_every_job_surface():
    from spot_core.settings import BLOCK, CLI, OPERATOR, POD_OPERATOR, WORKER, knob

    assert knob("take_over").surfaces >= {CLI, OPERATOR, POD_OPERATOR, BLOCK, WORKER}
    assert knob("take_over").default is False
