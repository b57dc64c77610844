"""`spot-pipelines watch --heartbeat-timeout`: a real watcher process, a real training step
(tests/support/checkpoint_train_loop.py) and a real file:// store holding the driver's
heartbeat. Renewed beats keep the step alive; once they stop, the step saves an emergency
checkpoint and the watcher exits with the driver-lost code, ending the lease."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from spot_core.attempt_env import DRIVER_LOST_EXIT_CODE, PREEMPTED_EXIT_CODE
from spot_core.checkpoint import open_store
from spot_core.checkpoint.heartbeat import Heartbeat
from spot_core.interruption.driver import Freshness, read_interval
from spot_core.localcloud.metadata import MetadataEmulator
from tests.support import SUPPORT

pytestmark = pytest.mark.timeout(90)

TRAIN_LOOP = SUPPORT / "checkpoint_train_loop.py"
TIMEOUT = 2.0  # the heartbeat timeout under test, seconds
BOUND = 30  # seconds: every process wait in this file is bounded by this


@pytest.fixture
def emulator():
    with MetadataEmulator() as emu:
        yield emu


def start_watch(
    emulator,
    uri: str,
    *extra: str,
    attempt: int = 1,
    env: dict | None = None,
    steps: int = 100000,
    child: list[str] | None = None,
) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPOT_")}
    base.update(
        {
            "SPOT_CHECKPOINT_URI": uri,
            "SPOT_ATTEMPT": str(attempt),
            "PYTHONPATH": os.pathsep.join(sys.path),
        },
        **(env or {}),
    )
    command = [
        sys.executable,
        "-m",
        "spot_core.cli",
        "watch",
        "--cloud",
        "aws",
        "--endpoint",
        emulator.url,
        "--poll-interval",
        "0.1",
        "--grace-seconds",
        "10",
        *extra,
        "--",
        *(child or [sys.executable, str(TRAIN_LOOP), str(steps), "0.01"]),
    ]
    return subprocess.Popen(
        command, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen, timeout: float = BOUND) -> tuple[int, list[dict], str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    events = [json.loads(line) for line in out.splitlines() if line.startswith('{"event"')]
    return proc.returncode, events, out, err


class Renewer:
    """The driver: renews the job's heartbeat every ``every`` seconds until stopped."""

    def __init__(self, store, attempt: int = 1, every: float = 0.25) -> None:
        self.heartbeat, self.attempt, self.every = Heartbeat(store), attempt, every
        self._stop = threading.Event()
        self.heartbeat.renew(attempt, time.time())  # the first beat, before the launch
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.heartbeat.renew(self.attempt, time.time())

    def __enter__(self) -> Renewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_renewed_heartbeat_keeps_the_step_alive_and_a_stale_one_stops_it(emulator, tmp_path):
    uri = f"file://{tmp_path / 'store'}"
    store = open_store(uri)
    with Renewer(store):
        proc = start_watch(emulator, uri, "--heartbeat-timeout", f"{TIMEOUT:g}s")
        time.sleep(3 * TIMEOUT)  # well past the timeout: the renewals keep it alive
        assert proc.poll() is None, finish(proc)[3]
        assert store.latest() is not None, "the step made progress meanwhile"
        stopped_renewing = time.monotonic()
    code, events, out, err = finish(proc)
    took = time.monotonic() - stopped_renewing
    assert code == DRIVER_LOST_EXIT_CODE, err[-2000:]
    assert TIMEOUT - 0.5 <= took < TIMEOUT + 8, took  # the last renewal was <= 0.25 s before
    (event,) = events
    assert (event["event"], event["action"]) == ("driver_lost", "stop")
    assert set(event) == {"event", "action", "deadline", "detected_at", "cloud"}
    assert "preempted" in out, "the step got SIGTERM and stopped through its Checkpointer"
    newest = store.latest()
    assert saved_on_stop(newest.metadata), newest.metadata


def saved_on_stop(metadata):
    """The watcher stops a step as on a notice: it writes the notice file, then sends
    SIGTERM; the step's emergency checkpoint names whichever of the two it saw first."""
    reason = str(metadata.get("emergency", ""))
    return reason == "received SIGTERM" or reason.startswith("notice file ")


@pytest.mark.parametrize("beats", ["none", "other-attempt"])
def test_without_renewals_for_this_attempt_the_step_is_stopped_after_the_timeout(
    emulator, tmp_path, beats
):
    """The clock starts with the watcher; beats of another attempt do not count."""
    uri = f"file://{tmp_path / 'store'}"
    store = open_store(uri)
    started = time.monotonic()
    if beats == "none":
        proc = start_watch(emulator, uri, env={"SPOT_HEARTBEAT_TIMEOUT": f"{TIMEOUT:g}"})
        code, events, _, err = finish(proc)
    else:
        with Renewer(store, attempt=3):
            proc = start_watch(
                emulator, uri, attempt=2, env={"SPOT_HEARTBEAT_TIMEOUT": f"{TIMEOUT:g}"}
            )
            code, events, _, err = finish(proc)
    assert code == DRIVER_LOST_EXIT_CODE, err[-2000:]
    assert TIMEOUT <= time.monotonic() - started < TIMEOUT + 10
    assert [e["event"] for e in events] == ["driver_lost"]


def test_a_watcher_without_a_timeout_never_opens_the_store(emulator, tmp_path):
    store_dir = tmp_path / "never-opened"
    proc = start_watch(
        emulator,
        f"file://{store_dir}",
        env={"SPOT_HEARTBEAT_TIMEOUT": ""},
        child=[sys.executable, "-c", f"import time; time.sleep({TIMEOUT + 1})"],
    )
    code, events, _, err = finish(proc)
    assert code == 0, err[-2000:]
    assert events == []
    assert not store_dir.exists(), "no timeout: the watcher never touches the store"


def test_an_interruption_still_wins_and_keeps_the_preempted_code(emulator, tmp_path):
    """With a live driver, a real notice ends the step as before (not as driver lost)."""
    uri = f"file://{tmp_path / 'store'}"
    store = open_store(uri)
    with Renewer(store):
        proc = start_watch(emulator, uri, "--heartbeat-timeout", "30")
        deadline = time.monotonic() + BOUND
        while store.latest() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        emulator.schedule_interruption(notice_seconds=60)
        code, events, _, err = finish(proc)
    assert code == 3, err[-2000:]  # the train loop's own "preempted" code passes through
    assert [e["event"] for e in events] == ["interruption"]
    assert code not in (DRIVER_LOST_EXIT_CODE, PREEMPTED_EXIT_CODE - 128)


def test_freshness_counts_only_changes_seen_on_this_clock():
    class Beat:
        def __init__(self, attempt, sequence):
            self.attempt, self.sequence = attempt, sequence

    fresh = Freshness(started_at=100.0, attempt=2)
    fresh.observe(Beat(2, 7), 101.0)  # first sight: proves nothing
    assert fresh.age(105.0) == 5.0
    fresh.observe(Beat(2, 7), 106.0)  # unchanged
    fresh.observe(None, 107.0)  # unreadable: no change
    fresh.observe(Beat(3, 99), 108.0)  # another attempt's beat: ignored
    assert fresh.age(108.0) == 8.0
    fresh.observe(Beat(2, 8), 109.0)  # renewed
    assert fresh.age(110.0) == 1.0
    assert read_interval(2.0) == 0.5 and read_interval(3600.0) == 10.0
