"""Each cloud's detector against the real metadata emulator over HTTP, including the
ways metadata services misbehave: expired tokens, outages, garbage, hangs."""

from __future__ import annotations

import logging
import time

import pytest

from spot_core.interruption import AwsDetector, AzureDetector, GceDetector, InterruptionWatcher
from spot_core.interruption.base import parse_rfc1123, parse_rfc3339
from spot_core.localcloud.metadata import MetadataEmulator

POLL = 0.05
TIMEOUT = 0.3
DETECTORS = {"aws": AwsDetector, "gcp": GceDetector, "azure": AzureDetector}


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def emulator():
    with MetadataEmulator() as emu:
        yield emu


def make(cloud: str, emulator: MetadataEmulator, **kwargs):
    return DETECTORS[cloud](emulator.url, timeout=TIMEOUT, **kwargs)


def warnings_from_detectors(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("spot_core.interruption")
    ]


@pytest.mark.parametrize("cloud", DETECTORS)
def test_nothing_pending_means_no_notice(emulator, cloud):
    assert make(cloud, emulator).poll(time.time()) == []


@pytest.mark.parametrize("cloud", DETECTORS)
def test_notice_detected_within_one_poll_interval(emulator, cloud):
    with InterruptionWatcher([make(cloud, emulator)], poll_interval=0.2) as watcher:
        time.sleep(0.05)
        visible = time.time()
        emulator.schedule_interruption(notice_seconds=60)
        notice = watcher.wait(timeout=2.0)
    assert notice is not None and notice.cloud == cloud and notice.is_interruption
    assert notice.detected_at - visible < 0.2 + TIMEOUT
    assert notice.deadline is not None and notice.deadline > visible


def test_aws_notice_carries_action_and_deadline(emulator):
    deadline = emulator.schedule_interruption(action="hibernate", notice_seconds=120)
    (notice,) = make("aws", emulator).poll(time.time())
    assert (notice.kind, notice.action, notice.deadline) == ("interruption", "hibernate", deadline)
    event = notice.to_event()
    assert parse_rfc3339(event["deadline"]) == deadline
    assert set(event) == {"event", "action", "deadline", "detected_at", "cloud"}


def test_aws_rebalance_is_reported_but_is_not_an_interruption(emulator):
    emulator.schedule_rebalance()
    with InterruptionWatcher([make("aws", emulator)], poll_interval=POLL) as watcher:
        assert watcher.wait(timeout=0.5) is None
        (notice,) = watcher.notices
    assert (notice.kind, notice.action, notice.deadline) == ("rebalance", "rebalance", None)


def test_gce_deadline_is_thirty_seconds_after_detection(emulator):
    emulator.schedule_interruption()
    (notice,) = make("gcp", emulator).poll(1_000.0)
    assert (notice.action, notice.deadline, notice.detected_at) == ("terminate", 1_030.0, 1_000.0)


def test_azure_deadline_is_not_before_and_other_events_are_ignored(emulator):
    deadline = emulator.schedule_interruption(notice_seconds=30)
    (notice,) = make("azure", emulator).poll(time.time())
    assert (notice.action, notice.deadline) == ("Preempt", deadline)
    assert parse_rfc1123(notice.raw["NotBefore"]) == deadline


def test_azure_non_preempt_events_are_not_interruptions(emulator):
    body = (
        '{"DocumentIncarnation": 3, "Events": [{"EventId": "e1", "EventType": "Reboot",'
        ' "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]}'
    )
    emulator.fail_requests(mode="garbage", body=body)
    assert make("azure", emulator).poll(time.time()) == []


def test_aws_token_is_reused_across_polls(emulator):
    detector = make("aws", emulator)
    for _ in range(3):
        detector.poll(time.time())
    assert [r.path for r in emulator.requests].count("/latest/api/token") == 1


def test_aws_expired_tokens_still_detect_via_one_retry(emulator):
    detector = make("aws", emulator)
    detector.poll(time.time())
    emulator.expire_tokens()
    emulator.schedule_interruption()
    emulator.clear_log()
    (notice,) = detector.poll(time.time())
    assert notice.cloud == "aws"
    first = [(r.method, r.status) for r in emulator.requests[:3]]
    assert first == [("GET", 401), ("PUT", 200), ("GET", 200)]


def test_aws_token_renewed_before_it_expires(monkeypatch):
    clock, mono = FakeClock(), FakeClock(0.0)
    with MetadataEmulator(clock=clock) as emulator:
        detector = AwsDetector(emulator.url, timeout=TIMEOUT, token_ttl=100, monotonic=mono)
        detector.poll(clock.now)
        clock.now += 95
        mono.now += 95
        emulator.clear_log()
        detector.poll(clock.now)
        statuses = [(r.method, r.status) for r in emulator.requests]
    assert statuses[0] == ("PUT", 200)
    assert 401 not in [status for _, status in statuses]


def test_aws_persistent_401_is_a_logged_failure_not_a_crash(emulator, caplog):
    emulator.fail_requests(401)
    assert make("aws", emulator).poll(time.time()) == []
    assert len(warnings_from_detectors(caplog)) == 1


def test_aws_works_without_tokens_required_too():
    with MetadataEmulator(require_token=False) as emulator:
        emulator.schedule_interruption()
        assert make("aws", emulator).poll(time.time())


@pytest.mark.parametrize("cloud", DETECTORS)
def test_endpoint_down_then_up(emulator, cloud, caplog):
    caplog.set_level(logging.INFO, logger="spot_core.interruption")
    with InterruptionWatcher([make(cloud, emulator)], poll_interval=POLL) as watcher:
        emulator.stop()
        time.sleep(POLL * 6)
        emulator.start()
        emulator.schedule_interruption()
        notice = watcher.wait(timeout=2.0)
    assert notice is not None and notice.cloud == cloud
    assert len(warnings_from_detectors(caplog)) == 1
    assert any("recovered" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cloud", DETECTORS)
def test_5xx_for_a_while_then_recovers(emulator, cloud):
    emulator.schedule_interruption()
    emulator.fail_requests(500, duration=0.3)
    with InterruptionWatcher([make(cloud, emulator)], poll_interval=POLL) as watcher:
        assert watcher.wait(timeout=0.15) is None
        notice = watcher.wait(timeout=2.0)
    assert notice is not None and notice.cloud == cloud


GARBAGE = {
    "aws": [
        "not json",
        "[1, 2]",
        '{"action": "explode", "time": "2026-11-30T10:00:00Z"}',
        '{"action": "terminate", "time": "soon"}',
        '{"action": "terminate"}',
    ],
    "gcp": ["MAYBE", "<html>"],
    "azure": [
        "not json",
        '{"Events": "none"}',
        "[]",
        '{"Events": [{"EventType": "Preempt", "EventId": "x", "NotBefore": "later"}]}',
        '{"Events": [{"EventType": "Preempt"}]}',
    ],
}


@pytest.mark.parametrize("cloud,body", [(c, b) for c, bodies in GARBAGE.items() for b in bodies])
def test_garbage_is_absorbed_and_logged_once(emulator, cloud, body, caplog):
    emulator.schedule_interruption()
    emulator.fail_requests(mode="garbage", body=body)
    detector = make(cloud, emulator)
    if cloud == "aws":  # a garbage token is still a token; make the token PUT succeed first
        emulator.recover()
        detector.poll(time.time())
        emulator.fail_requests(mode="garbage", body=body)
    assert [detector.poll(time.time()) for _ in range(5)] == [[]] * 5
    assert len(warnings_from_detectors(caplog)) == 1
    emulator.recover()
    assert detector.poll(time.time())


@pytest.mark.parametrize("cloud", DETECTORS)
def test_hanging_endpoint_costs_one_timeout_per_poll(emulator, cloud):
    detector = make(cloud, emulator)
    emulator.fail_requests(mode="hang", hang_seconds=5)
    started = time.monotonic()
    assert detector.poll(time.time()) == []
    assert time.monotonic() - started < TIMEOUT + 0.4


def test_hanging_endpoint_does_not_wedge_the_watcher(emulator):
    emulator.fail_requests(mode="hang", hang_seconds=5)
    watcher = InterruptionWatcher([make("aws", emulator)], poll_interval=POLL).start()
    time.sleep(TIMEOUT * 2)
    emulator.recover()
    emulator.schedule_interruption()
    assert watcher.wait(timeout=2.0) is not None
    started = time.monotonic()
    assert watcher.stop(timeout=2.0)
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("cloud", DETECTORS)
def test_handlers_fire_once_while_the_notice_stays_served(emulator, cloud):
    fired = []
    emulator.schedule_interruption()
    watcher = InterruptionWatcher([make(cloud, emulator)], poll_interval=0.01)
    watcher.add_handler(fired.append)
    with watcher:
        deadline = time.monotonic() + 3
        while len(emulator.requests) < 25 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert len(emulator.requests) >= 25
    assert len(fired) == 1 and len(watcher.notices) == 1


def test_a_new_azure_event_fires_again(emulator):
    fired = []
    watcher = InterruptionWatcher([make("azure", emulator)], poll_interval=POLL)
    watcher.add_handler(fired.append)
    with watcher:
        for _ in range(2):
            emulator.schedule_interruption()
            deadline = time.monotonic() + 2
            count = len(fired)
            while len(fired) == count and time.monotonic() < deadline:
                time.sleep(0.02)
    assert len(fired) == 2 and fired[0].identity != fired[1].identity


def test_failure_streak_logs_once_then_again_after_recovery(emulator, caplog):
    caplog.set_level(logging.INFO, logger="spot_core.interruption")
    detector = make("gcp", emulator)
    emulator.fail_requests(500)
    for _ in range(10):
        detector.poll(time.time())
    assert len(warnings_from_detectors(caplog)) == 1
    emulator.recover()
    detector.poll(time.time())
    assert sum("recovered" in r.getMessage() for r in caplog.records) == 1
    emulator.fail_requests(mode="garbage")
    for _ in range(10):
        detector.poll(time.time())
    assert len(warnings_from_detectors(caplog)) == 2
