"""The watcher's contract (dedupe, bounded stop, surviving bad handlers and detectors),
cloud selection, the SIGTERM detector, and the latency helper the benchmark uses."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from spot_core.errors import ConfigError
from spot_core.interruption import (
    AwsDetector,
    AzureDetector,
    GceDetector,
    InterruptionWatcher,
    Notice,
    SignalDetector,
    detector_for,
    probe_cloud,
)
from spot_core.interruption.notice_file import read_notice, write_notice
from spot_core.localcloud.metadata import MetadataEmulator
from spot_emulators.notice_latency import measure_detection_latency

POLL = 0.05
# What a loaded 2-core machine may add to a thread's wake-up or a socket timeout. The hangs
# the tests inject are far longer (30 s), so a bound of "timeout + LOAD_SLACK" still fails
# when the code waits for the hang instead of its own timeout.
LOAD_SLACK = 2.0
HANG = 30


@pytest.fixture
def emulator():
    with MetadataEmulator() as emu:
        yield emu


class ScriptedDetector:
    """A detector that serves a fixed list of answers: a stand-in source, not a mock."""

    name = "scripted"

    def __init__(self, answers):
        self.answers = list(answers)
        self.polls = 0

    def poll(self, now):
        self.polls += 1
        answer = self.answers[min(self.polls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return list(answer)


def notice(**overrides) -> Notice:
    fields = dict(
        kind="interruption", cloud="aws", action="terminate", deadline=100.0, detected_at=1.0
    )
    return Notice(**{**fields, **overrides})


def wait_for(predicate, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_poll_interval_must_be_positive():
    for bad in (0, -1.0):
        with pytest.raises(ConfigError, match="poll_interval"):
            InterruptionWatcher([], poll_interval=bad)


def test_notice_key_ignores_detection_time_and_raw():
    assert notice(detected_at=1.0, raw="a").key == notice(detected_at=2.0, raw="b").key
    assert notice(deadline=1.0).key != notice(deadline=2.0).key
    assert notice(deadline=1.0, identity="x").key == notice(deadline=2.0, identity="x").key


def test_to_event_formats_rfc3339_and_null_deadline():
    event = notice(deadline=None, detected_at=1_800_000_000.25).to_event()
    assert event == {
        "event": "interruption",
        "action": "terminate",
        "deadline": None,
        "detected_at": "2027-01-15T08:00:00.250Z",
        "cloud": "aws",
    }


def test_handler_exception_is_logged_and_others_still_run(caplog):
    seen = []

    def broken(n):
        raise RuntimeError("handler bug")

    detector = ScriptedDetector([[], [notice(deadline=1.0)], [notice(deadline=2.0)]])
    watcher = InterruptionWatcher([detector], poll_interval=0.01)
    watcher.add_handler(broken)
    watcher.add_handler(seen.append)
    with watcher:
        assert wait_for(lambda: len(seen) == 2)
    assert any("handler bug" in (r.exc_text or "") for r in caplog.records)


def test_detector_that_raises_does_not_kill_the_thread(caplog):
    detector = ScriptedDetector([RuntimeError("bug")] * 5 + [[notice()]])
    with InterruptionWatcher([detector], poll_interval=0.01) as watcher:
        assert watcher.wait(timeout=10.0) == notice()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1


def test_wait_is_bounded_and_ignores_rebalance():
    detector = ScriptedDetector([[notice(kind="rebalance", action="rebalance", deadline=None)]])
    with InterruptionWatcher([detector], poll_interval=POLL) as watcher:
        started = time.monotonic()
        assert watcher.wait(timeout=0.2) is None
        # A rebalance is no interruption: wait() runs out its timeout (never returns early)
        # and does not block past it.
        assert 0.15 < time.monotonic() - started < 0.2 + LOAD_SLACK
        assert [n.kind for n in watcher.notices] == ["rebalance"]


def test_stop_is_bounded_even_with_a_hanging_endpoint(emulator):
    emulator.fail_requests(mode="hang", hang_seconds=HANG)
    watcher = InterruptionWatcher([AwsDetector(emulator.url, timeout=0.3)], poll_interval=POLL)
    watcher.start()
    time.sleep(0.1)
    started = time.monotonic()
    watcher.stop(timeout=1.0)
    assert time.monotonic() - started < 1.0 + LOAD_SLACK  # not the endpoint's 30 s hang
    assert not watcher.running


def test_first_poll_happens_at_start(emulator):
    emulator.schedule_interruption()
    with InterruptionWatcher([GceDetector(emulator.url)], poll_interval=30) as watcher:
        assert watcher.wait(timeout=10.0) is not None


def test_poll_once_without_a_thread(emulator):
    emulator.schedule_interruption()
    watcher = InterruptionWatcher([AzureDetector(emulator.url)])
    assert len(watcher.poll_once()) == 1
    assert watcher.poll_once() == []


# --- selection ---------------------------------------------------------------------------


def test_unknown_cloud_names_the_choices():
    with pytest.raises(ConfigError, match="aws, gcp, azure, kubernetes, signal, auto"):
        detector_for("mars", "http://127.0.0.1:9")


@pytest.mark.parametrize(
    "endpoint", ["169.254.169.254", "ftp://x", "http://", "http://h:99999", "http://h/?q=1"]
)
def test_malformed_endpoint_is_a_config_error(endpoint):
    with pytest.raises(ConfigError, match="http://HOST"):
        detector_for("aws", endpoint)


def test_aliases_and_env_endpoint(monkeypatch, emulator):
    monkeypatch.setenv("SPOT_METADATA_ENDPOINT", emulator.url)
    detector = detector_for("GCE")
    assert isinstance(detector, GceDetector) and detector.endpoint == emulator.url


@pytest.mark.parametrize(
    "cloud,kind", [("aws", AwsDetector), ("gcp", GceDetector), ("azure", AzureDetector)]
)
def test_auto_picks_the_service_that_answers(cloud, kind):
    with MetadataEmulator(clouds=(cloud,)) as emulator:
        assert probe_cloud(emulator.url, timeout=0.3) == cloud
        assert isinstance(detector_for("auto", emulator.url), kind)


def test_auto_falls_back_to_signal_only_quickly(emulator):
    emulator.fail_requests(mode="hang", hang_seconds=HANG)
    started = time.monotonic()
    detector = detector_for("auto", emulator.url, probe_timeout=0.3)
    try:
        assert isinstance(detector, SignalDetector)
        # The three probes run in parallel: about one 0.3 s timeout, never the 30 s hang.
        assert time.monotonic() - started < 0.3 + LOAD_SLACK
    finally:
        detector.close()


# --- SIGTERM -----------------------------------------------------------------------------


def test_signal_detector_turns_a_signal_into_a_notice_and_restores_the_handler():
    previous = signal.getsignal(signal.SIGUSR1)
    detector = SignalDetector(signals=(signal.SIGUSR1,), notice_seconds=10)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert wait_for(lambda: len(detector._received) == 1)
        (n,) = detector.poll(time.time())
        assert (n.cloud, n.action, n.identity) == ("signal", "terminate", "SIGUSR1")
        assert n.deadline == pytest.approx(n.detected_at + 10)
        assert detector.poll(time.time()) == []
    finally:
        detector.close()
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_signal_detector_outside_main_thread_is_refused():
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_try_signal_detector()))
    thread.start()
    thread.join(5)
    assert isinstance(errors[0], ConfigError)


def _try_signal_detector():
    try:
        SignalDetector()
    except ConfigError as exc:
        return exc
    return None


SIGTERM_SCRIPT = textwrap.dedent("""
    import signal, sys
    from spot_core.interruption import InterruptionWatcher, SignalDetector
    detector = SignalDetector()
    watcher = InterruptionWatcher([detector], poll_interval=0.05)
    with watcher:
        print("ready", flush=True)
        notice = watcher.wait(timeout=10)
    watcher.close()
    print(notice.to_json() if notice else "none", flush=True)
    print("restored" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else "leaked")
""")


def test_sigterm_detector_in_a_subprocess():
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    event_line, restored = out.splitlines()
    event = json.loads(event_line)
    assert (event["event"], event["cloud"], event["action"]) == (
        "interruption",
        "signal",
        "terminate",
    )
    assert restored == "restored" and proc.returncode == 0
    assert time.time() - sent < 5


# --- notice file and latency helper ------------------------------------------------------


def test_notice_file_round_trip(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "notice.json"
    monkeypatch.setenv("SPOT_NOTICE_FILE", str(path))
    assert read_notice() is None
    write_notice(path, notice())
    assert read_notice() == notice().to_event()
    assert [p.name for p in path.parent.iterdir()] == ["notice.json"]


def test_measure_detection_latency_is_bounded_by_the_poll_interval():
    samples = measure_detection_latency(poll_interval=0.2, trials=3)
    assert len(samples) == 3
    assert all(0 <= s < 0.2 + 0.3 for s in samples)
