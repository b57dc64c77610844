"""The metadata emulator answers like the clouds' documented services, over real HTTP."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from spot_core.localcloud.metadata import MetadataEmulator

TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"
ACTION = "/latest/meta-data/spot/instance-action"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def call(url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, str, dict]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with NO_PROXY.open(request, timeout=2) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def emulator(clock: FakeClock):
    with MetadataEmulator(clock=clock) as emu:
        yield emu


def token(emulator: MetadataEmulator, ttl: str = "60") -> str:
    status, body, headers = call(emulator.url + "/latest/api/token", "PUT", {TTL: ttl})
    assert status == 200 and headers[TTL] == ttl
    return body


def test_binds_loopback_on_an_ephemeral_port(emulator):
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", emulator.url)
    assert not emulator.url.endswith(":0")


def test_get_without_token_is_401_when_tokens_are_required(emulator):
    assert call(emulator.url + ACTION)[0] == 401


def test_get_with_unknown_token_is_401(emulator):
    assert call(emulator.url + ACTION, headers={TOKEN: "forged"})[0] == 401


def test_imdsv1_get_without_token_allowed_when_not_required(clock):
    with MetadataEmulator(clock=clock, require_token=False) as emulator:
        assert call(emulator.url + ACTION)[0] == 404
        assert call(emulator.url + ACTION, headers={TOKEN: "forged"})[0] == 401


@pytest.mark.parametrize("headers", [{}, {TTL: "0"}, {TTL: "21601"}, {TTL: "abc"}, {TTL: "-5"}])
def test_token_put_with_missing_or_out_of_range_ttl_is_400(emulator, headers):
    assert call(emulator.url + "/latest/api/token", "PUT", headers)[0] == 400


@pytest.mark.parametrize("ttl", ["1", "21600"])
def test_token_ttl_bounds_are_inclusive(emulator, ttl):
    assert token(emulator, ttl)


def test_token_put_through_a_proxy_is_refused(emulator):
    headers = {TTL: "60", "X-Forwarded-For": "10.0.0.1"}
    assert call(emulator.url + "/latest/api/token", "PUT", headers)[0] == 403


def test_token_expires_after_its_ttl(emulator, clock):
    tok = token(emulator, "10")
    assert call(emulator.url + ACTION, headers={TOKEN: tok})[0] == 404
    clock.now += 10
    assert call(emulator.url + ACTION, headers={TOKEN: tok})[0] == 401


def test_expire_tokens_revokes_issued_tokens(emulator):
    tok = token(emulator)
    emulator.expire_tokens()
    assert call(emulator.url + ACTION, headers={TOKEN: tok})[0] == 401
    assert call(emulator.url + ACTION, headers={TOKEN: token(emulator)})[0] == 404


def test_nothing_pending_is_404(emulator):
    tok = token(emulator)
    for path in (
        ACTION,
        "/latest/meta-data/events/recommendations/rebalance",
        "/latest/meta-data/spot/termination-time",
    ):
        assert call(emulator.url + path, headers={TOKEN: tok})[0] == 404


def test_instance_action_becomes_visible_at_its_time_in_rfc3339(emulator, clock):
    deadline = emulator.schedule_interruption(at=clock.now + 5, action="stop", notice_seconds=120)
    tok = token(emulator)
    assert call(emulator.url + ACTION, headers={TOKEN: tok})[0] == 404
    clock.now += 5
    status, body, _ = call(emulator.url + ACTION, headers={TOKEN: tok})
    doc = json.loads(body)
    assert status == 200 and doc["action"] == "stop"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["time"])
    assert doc["time"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock.now + 120))
    assert deadline == clock.now + 120


def test_rebalance_recommendation_shape(emulator, clock):
    emulator.schedule_rebalance()
    status, body, _ = call(
        emulator.url + "/latest/meta-data/events/recommendations/rebalance",
        headers={TOKEN: token(emulator)},
    )
    assert status == 200
    assert json.loads(body) == {
        "noticeTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock.now))
    }


def test_clear_withdraws_notices(emulator):
    emulator.schedule_interruption()
    emulator.clear()
    assert call(emulator.url + ACTION, headers={TOKEN: token(emulator)})[0] == 404


def test_gce_preempted_flag_and_flavor_header(emulator, clock):
    url = emulator.url + "/computeMetadata/v1/instance/preempted"
    assert call(url)[0] == 403
    status, body, headers = call(url, headers={"Metadata-Flavor": "Google"})
    assert (status, body, headers["Metadata-Flavor"]) == (200, "FALSE", "Google")
    emulator.schedule_interruption()
    assert call(url, headers={"Metadata-Flavor": "Google"})[1] == "TRUE"


def test_azure_scheduled_events_shape(emulator, clock):
    url = emulator.url + "/metadata/scheduledevents?api-version=2020-07-01"
    assert call(url)[0] == 400
    assert call(emulator.url + "/metadata/scheduledevents", headers={"Metadata": "true"})[0] == 400
    empty = json.loads(call(url, headers={"Metadata": "true"})[1])
    assert empty["Events"] == [] and isinstance(empty["DocumentIncarnation"], int)
    emulator.schedule_interruption(notice_seconds=30)
    doc = json.loads(call(url, headers={"Metadata": "true"})[1])
    (event,) = doc["Events"]
    assert event["EventType"] == "Preempt" and event["EventId"]
    assert {"ResourceType", "Resources", "EventStatus", "NotBefore"} <= set(event)
    assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", event["NotBefore"])
    assert doc["DocumentIncarnation"] > empty["DocumentIncarnation"]


def test_clouds_can_be_restricted(clock):
    with MetadataEmulator(clock=clock, clouds=("gcp",)) as emulator:
        assert call(emulator.url + "/latest/api/token", "PUT", {TTL: "60"})[0] == 404


def test_fail_requests_status_count_then_recovers(emulator):
    emulator.fail_requests(503, count=2)
    url = emulator.url + "/computeMetadata/v1/instance/preempted"
    flavor = {"Metadata-Flavor": "Google"}
    assert [call(url, headers=flavor)[0] for _ in range(3)] == [503, 503, 200]


def test_fail_requests_for_a_duration_uses_the_emulator_clock(emulator, clock):
    emulator.fail_requests(500, duration=10)
    url = emulator.url + "/computeMetadata/v1/instance/preempted"
    assert call(url, headers={"Metadata-Flavor": "Google"})[0] == 500
    clock.now += 10
    assert call(url, headers={"Metadata-Flavor": "Google"})[0] == 200


def test_fail_requests_garbage_answers_200_with_nonsense(emulator):
    emulator.fail_requests(mode="garbage")
    status, body, _ = call(emulator.url + ACTION)
    assert status == 200
    with pytest.raises(ValueError):
        json.loads(body)


def test_hang_is_released_by_stop():
    emulator = MetadataEmulator().start()
    emulator.fail_requests(mode="hang", hang_seconds=30)
    request = urllib.request.Request(emulator.url + ACTION)
    started = time.monotonic()
    with pytest.raises((urllib.error.URLError, TimeoutError)):
        NO_PROXY.open(request, timeout=0.3)
    assert time.monotonic() - started < 1.5
    started = time.monotonic()
    emulator.stop()
    assert time.monotonic() - started < 3


def test_restart_reuses_the_port_and_stopped_means_refused():
    emulator = MetadataEmulator().start()
    url = emulator.url
    emulator.stop()
    with pytest.raises(urllib.error.URLError):
        NO_PROXY.open(url + ACTION, timeout=1)
    emulator.start()
    try:
        assert emulator.url == url
        assert call(url + ACTION)[0] == 401
    finally:
        emulator.stop()


def test_request_log_records_what_clients_sent(emulator):
    token(emulator)
    (record,) = emulator.requests
    assert (record.method, record.path, record.status) == ("PUT", "/latest/api/token", 200)
    assert record.headers[TTL.lower()] == "60"


def test_runs_as_a_subprocess_and_prints_its_url_first():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spot_core.localcloud.metadata",
            "--port",
            "0",
            "--interrupt-after",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        status, body, _ = call(
            url + "/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"}
        )
        assert (status, body) == (200, "TRUE")
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0
