"""The local cloud as a service: leases outlive the process that launched them."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from spot_core.controller import Controller, JobSpec
from spot_core.errors import CapacityUnavailable, ConfigError, InfrastructureError
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import TOKEN_ENV, TOKEN_FILE, LocalCloudServer, client_environ
from spot_core.model import JobStatus
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import open_provider
from spot_core.providers.base import LaunchSpec, LeaseState
from tests.support.spot_helpers import marked_processes, trace, train_command, wait_until

pytestmark = pytest.mark.timeout(120)
FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)


def _server(tmp_path, pattern):
    return LocalCloudServer.from_traces(
        [trace("us-east-1a_v100_1", pattern)],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=FAST,
    )


def test_a_lease_launched_by_one_client_is_watched_and_ended_by_others(tmp_path):
    with _server(tmp_path, "1" * 200) as server:
        launcher = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        pool = launcher.pools()[0]
        spec = LaunchSpec(
            "job",
            1,
            (sys.executable, "-c", "import time; time.sleep(60)"),
            (tmp_path / "ckpt").as_uri(),
        )
        lease = launcher.launch(spec, pool)
        launcher.close()  # the launching process goes away (an Airflow worker deferring)
        watcher = open_provider(**{"name": "local", **launcher.options})
        assert watcher.observe([lease])[lease.lease_id].state is LeaseState.RUNNING
        open_provider("local", url=server.url, workdir=server.cloud.workdir).terminate(lease)
        assert watcher.observe([lease])[lease.lease_id].state is LeaseState.TERMINATED
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)


def test_capacity_errors_cross_the_wire(tmp_path):
    with _server(tmp_path, "0" * 200) as server:
        client = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        with pytest.raises(CapacityUnavailable, match="no spot capacity"):
            client.launch(
                LaunchSpec("job", 1, ("true",), (tmp_path / "c").as_uri()), client.pools()[0]
            )


def test_controller_over_the_server_resumes_a_preempted_job(tmp_path):
    with _server(tmp_path, "1110" * 80) as server:
        provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        spec = JobSpec(
            "job-remote", train_command(steps=400), (tmp_path / "ckpt").as_uri(), provider.pools()
        )
        record = Controller(
            provider,
            provider.market,
            RetryPolicy(max_preemptions=10, capacity_wait_seconds=0.3, min_on_demand_seconds=1e9),
            poll_interval_seconds=0.05,
        ).run(spec)
    assert record.status is JobStatus.SUCCEEDED and record.preemptions >= 1
    assert 0 < record.ledger.spent < record.ledger.on_demand_equivalent


def test_server_as_a_subprocess_and_a_clear_error_when_it_is_gone(tmp_path, monkeypatch):
    proc = subprocess.Popen(
        [sys.executable, "-m", "spot_core.localcloud.server", "--workdir", str(tmp_path / "cloud")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        for name, value in client_environ(url, tmp_path / "cloud").items():
            monkeypatch.setenv(name, value)  # as a triggerer or a worker is given them
        client = open_provider("local")
        assert [p.zone for p in client.pools()] == ["us-east-1d", "us-east-2a", "us-west-2b"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not (tmp_path / "cloud" / TOKEN_FILE).exists(), "a stopped server left its token"
    with pytest.raises(InfrastructureError, match="not reachable"):
        open_provider("local", url=url)


def test_replay_starts_at_the_start_tick_when_the_first_client_connects(tmp_path):
    import time

    traces = [trace("zone-a", "1" * 200, tick_seconds=60.0)]
    with (
        LocalCloudServer.from_traces(
            traces,
            workdir=tmp_path / "held",
            time_scale=600.0,
            start_tick=50,
            start_on_first_client=True,
        ) as held,
        LocalCloudServer.from_traces(
            traces, workdir=tmp_path / "free", time_scale=600.0, start_tick=50
        ) as free,
    ):
        time.sleep(1.0)  # 10 ticks of replay at 600x, while no client is connected
        held_market = open_provider("local", url=held.url, workdir=held.cloud.workdir).market
        free_market = open_provider("local", url=free.url, workdir=free.cloud.workdir).market
        now = time.time()
        assert held_market.tick_at(now) == 50, "held at the start tick until a client came"
        assert free_market.tick_at(now) >= 59, "an unheld replay runs from its start"
        assert held.cloud.market.tick_origin == held_market.tick_origin, "clients agree"


# -- the server answers only its owner ----------------------------------------------------------
def _raw(url, method="GET", body=None, headers=None):
    """One request with exactly these headers: (status, JSON answer)."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _launch_body(tmp_path):
    import json

    marker = str(tmp_path / "launched")
    return json.dumps(
        {
            "pool": {
                "cloud": "aws",
                "region": "us-east-1",
                "zone": "us-east-1a",
                "instance_type": "p3.2xlarge",
                "market": "spot",
            },
            "command": ["touch", marker],
            "env": {},
            "endpoint_env": "X",
        }
    ).encode(), tmp_path / "launched"


def test_the_server_refuses_requests_without_its_token_and_non_json_posts(tmp_path):
    with _server(tmp_path, "1" * 200) as server:
        body, launched = _launch_body(tmp_path)
        good = {"Authorization": f"Bearer {server.token}"}
        assert _raw(server.url + "/config")[0] == 401
        status, answer = _raw(server.url + "/config", headers={"Authorization": "Bearer nope"})
        assert status == 401 and answer["error"] == "unauthorized"
        # A web page's cross-origin "simple" POST: text/plain, no Authorization header.
        assert (
            _raw(server.url + "/instances", "POST", body, {"Content-Type": "text/plain"})[0] == 401
        )
        status, answer = _raw(
            server.url + "/instances", "POST", body, {**good, "Content-Type": "text/plain"}
        )
        assert status == 415 and answer["error"] == "unsupported_media_type"
        assert _raw(server.url + "/instances", "POST", body, good)[0] == 415  # none declared
        assert not wait_until(launched.exists, timeout=1.0), "a refused request launched"
        status, view = _raw(
            server.url + "/instances", "POST", body, {**good, "Content-Type": "application/json"}
        )
        assert status == 200 and wait_until(launched.exists, timeout=10), view


def test_the_token_file_is_private_and_random(tmp_path):
    import stat

    with (
        _server(tmp_path, "1" * 200) as server,
        LocalCloudServer.from_traces(workdir=tmp_path / "other") as other,
    ):
        mode = stat.S_IMODE(server.token_file.stat().st_mode)
        assert mode == 0o600, oct(mode)
        assert server.token_file.read_text() == server.token
        assert len(server.token) >= 43 and server.token != other.token  # 32 random bytes


def test_a_lease_launched_with_the_token_never_sees_it(tmp_path, monkeypatch):
    with _server(tmp_path, "1" * 200) as server:
        monkeypatch.setenv(TOKEN_ENV, server.token)  # the launching process holds it
        provider = open_provider("local", url=server.url)
        spec = LaunchSpec(
            "job",
            1,
            (sys.executable, "-c", "import os; print(dict(os.environ))"),
            (tmp_path / "ckpt").as_uri(),
        )
        lease = provider.launch(spec, provider.pools()[0])
        assert wait_until(lambda: provider.observe([lease])[lease.lease_id].ended, timeout=30)
        log = open(lease.details["log"]).read()
        assert "LEASE_MARKER" in log or "SPOT_" in log, log[-500:]
        assert server.token not in log, "the token reached the lease's environment"
        assert server.token not in repr(provider.options) + repr(provider.cloud)


def test_a_client_without_the_token_or_with_a_wrong_one_gets_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with _server(tmp_path, "1" * 200) as server:
        with pytest.raises(ConfigError, match=TOKEN_ENV):
            open_provider("local", url=server.url)
        monkeypatch.setenv(TOKEN_ENV, "not-the-token")
        with pytest.raises(ConfigError, match="refused our token"):
            open_provider("local", url=server.url)


def test_the_servers_own_workdir_beats_another_servers_token_in_the_environment(
    tmp_path, monkeypatch
):
    """A process that talks to two local clouds (the session's in $SPOT_LOCAL_CLOUD_TOKEN
    and one of its own): naming a server's workdir reaches that server."""
    with _server(tmp_path / "a", "1" * 200) as mine, _server(tmp_path / "b", "1" * 200) as other:
        monkeypatch.setenv(TOKEN_ENV, other.token)
        provider = open_provider("local", url=mine.url, workdir=str(mine.cloud.workdir))
        assert provider.pools()
        monkeypatch.setenv(TOKEN_ENV, mine.token)  # no workdir: the environment's token
        assert open_provider("local", url=mine.url).pools()


# -- the server answers every request ------------------------------------------------------------
POOL = {
    "cloud": "aws",
    "region": "us-east-1",
    "zone": "us-east-1d",  # a default trace's
    "instance_type": "p3.2xlarge",
    "market": "spot",
}


def _launch(**fields) -> bytes:
    import json

    return json.dumps(
        {"pool": POOL, "command": ["true"], "env": {}, "endpoint_env": "X", **fields}
    ).encode()


def _wire(
    url: str,
    token: str,
    method: str,
    path: str,
    body: bytes = b"",
    length: int | None = None,
    timeout: float = 10.0,
) -> tuple[int | None, dict | None]:
    """One request over a raw socket, with any Content-Length (urllib checks its own):
    (status, JSON answer), or (None, None) when the server dropped the connection."""
    import json
    import socket

    host, port = url.removeprefix("http://").split(":")
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    if not answer:
        return None, None
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


BAD_REQUESTS = [  # (what, method, path, body, Content-Length, status)
    ("nested JSON", "POST", "/instances", b"[" * 100_000, None, 400),
    (
        "nested ids",
        "POST",
        "/instances/describe",
        b'{"ids": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        None,
        400,
    ),
    ("not JSON", "POST", "/instances", b"launch please", None, 400),
    ("NaN", "POST", "/instances/describe", b'{"ids": NaN}', None, 400),
    ("a list body", "POST", "/instances", b"[]", None, 400),
    ("command []", "POST", "/instances", _launch(command=[]), None, 400),
    ("command a string", "POST", "/instances", _launch(command="true"), None, 400),
    ("missing binary", "POST", "/instances", _launch(command=["/no/such/binary"]), None, 400),
    (
        "a zone with no trace",
        "POST",
        "/instances",
        _launch(pool={**POOL, "zone": "mars-1a"}),
        None,
        400,
    ),
    ("env a list", "POST", "/instances", _launch(env=["A=1"]), None, 400),
    ("env values not strings", "POST", "/instances", _launch(env={"A": 1}), None, 400),
    ("endpoint_env a number", "POST", "/instances", _launch(endpoint_env=5), None, 400),
    ("pool a string", "POST", "/instances", _launch(pool="us-east-1a"), None, 400),
    (
        "pool of unknown market",
        "POST",
        "/instances",
        _launch(pool={**POOL, "market": "x"}),
        None,
        400,
    ),
    ("no fields", "POST", "/instances", b"{}", None, 400),
    ("ids a string", "POST", "/instances/describe", b'{"ids": "i-1"}', None, 400),
    ("lines=abc", "GET", "/instances/i-1/log?lines=abc", b"", None, 400),
    ("lines=-5", "GET", "/instances/i-1/log?lines=-5", b"", None, 400),
    ("huge Content-Length", "POST", "/instances", b"{}", 10**12, 413),
    ("negative Content-Length", "POST", "/instances", b"{}", -1, 400),
]


def test_every_bad_request_gets_a_4xx_json_answer_and_no_traceback(tmp_path):
    """A real server process: each malformed, oversized or impossible request is answered
    with its 4xx and a JSON error naming the problem; nothing is launched, the server's
    stderr stays empty, and it serves a good request afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "spot_core.localcloud.server", "--workdir", str(tmp_path / "cloud")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        token = (tmp_path / "cloud" / TOKEN_FILE).read_text()
        for what, method, path, body, length, status in BAD_REQUESTS:
            answer = _wire(url, token, method, path, body, length)
            assert answer[0] == status, (what, answer)
            assert answer[1]["error"] and answer[1]["message"], (what, answer)
        assert _wire(url, token, "GET", "/config")[0] == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert err == "", err[-3000:]
    assert not marked_processes(str(tmp_path)), "a refused request launched something"


def test_two_hundred_clients_at_once_are_queued_and_all_answered(tmp_path):
    """The listen backlog: while the server process is busy (here: stopped), the kernel
    completes the connections of 200 clients at once into its queue, and once it runs
    again every one gets its 200. With socketserver's backlog of 5 the rest of the
    connects were dropped and waited out SYN retries (25 of 200 timed out). How fast each
    is answered: bench/README.md (``make bench-cloud-server``)."""
    import json
    import select
    import signal
    import socket

    proc = subprocess.Popen(
        [sys.executable, "-m", "spot_core.localcloud.server", "--workdir", str(tmp_path / "cloud")],
        stdout=subprocess.PIPE,
        text=True,
    )
    socks: list[socket.socket] = []
    try:
        url = proc.stdout.readline().strip()
        token = (tmp_path / "cloud" / TOKEN_FILE).read_text()
        host, port = url.removeprefix("http://").split(":")
        proc.send_signal(signal.SIGSTOP)
        for _ in range(200):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex((host, int(port)))
            socks.append(sock)
        pending = set(socks)
        give_up = time.monotonic() + 10.0
        while pending and time.monotonic() < give_up:
            _, writable, _ = select.select([], list(pending), [], 0.5)
            pending -= {
                s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            }
        assert not pending, f"{len(pending)} of 200 connects were not queued"
        proc.send_signal(signal.SIGCONT)
        request = (
            f"GET /config HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n"
        ).encode()
        statuses = []
        for sock in socks:
            sock.setblocking(True)
            sock.settimeout(30)
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            statuses.append(int(head.split()[1]))
            assert json.loads(body)["traces"]
        assert statuses == [200] * 200
    finally:
        proc.send_signal(signal.SIGCONT)
        for sock in socks:
            sock.close()
        proc.terminate()
        proc.wait(timeout=10)
