"""The local cloud as a service: leases outlive the process that launched them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spot_core.controller import Controller, JobSpec
from spot_core.errors import CapacityUnavailable, InfrastructureError
from spot_core.model import JobStatus
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import open_provider
from spot_core.providers.base import LaunchSpec, LeaseState
from spot_core.localcloud.server import TOKEN_FILE, LocalCloudServer, client_environ
from spot_core.localcloud.cloud import LocalCloudConfig

from spot_helpers import marked_processes, trace, train_command, wait_until

pytestmark = pytest.mark.timeout(120)
FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)


def _server(tmp_path, pattern):
    return LocalCloudServer.from_traces([trace("us-east-1a_v100_1", pattern)], time_scale=60.0,
                                        workdir=tmp_path / "cloud", config=FAST)


def test_a_lease_launched_by_one_client_is_watched_and_ended_by_others(tmp_path):
    with _server(tmp_path, "1" * 200) as server:
        launcher = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        pool = launcher.pools()[0]
        spec = LaunchSpec("job", 1, (sys.executable, "-c", "import time; time.sleep(60)"),
                          (tmp_path / "ckpt").as_uri())
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
            client.launch(LaunchSpec("job", 1, ("true",), (tmp_path / "c").as_uri()),
                          client.pools()[0])


def test_controller_over_the_server_resumes_a_preempted_job(tmp_path):
    with _server(tmp_path, "1110" * 80) as server:
        provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        spec = JobSpec("job-remote", train_command(steps=400), (tmp_path / "ckpt").as_uri(),
                       provider.pools())
        record = Controller(provider, provider.market, RetryPolicy(
            max_preemptions=10, capacity_wait_seconds=0.3, min_on_demand_seconds=1e9),
            poll_interval=0.05).run(spec)
    assert record.status is JobStatus.SUCCEEDED and record.preemptions >= 1
    assert 0 < record.ledger.spent < record.ledger.on_demand_equivalent


def test_server_as_a_subprocess_and_a_clear_error_when_it_is_gone(tmp_path, monkeypatch):
    proc = subprocess.Popen([sys.executable, "-m", "spot_core.localcloud.server", "--workdir",
                             str(tmp_path / "cloud")], stdout=subprocess.PIPE, text=True)
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
    with LocalCloudServer.from_traces(traces, workdir=tmp_path / "held", time_scale=600.0,
                                      start_tick=50, start_on_first_client=True) as held, \
            LocalCloudServer.from_traces(traces, workdir=tmp_path / "free", time_scale=600.0,
                                         start_tick=50) as free:
        time.sleep(1.0)  # 10 ticks of replay at 600x, while no client is connected
        held_market = open_provider("local", url=held.url, workdir=held.cloud.workdir).market
        free_market = open_provider("local", url=free.url, workdir=free.cloud.workdir).market
        now = time.time()
        assert held_market.tick_at(now) == 50, "held at the start tick until a client came"
        assert free_market.tick_at(now) >= 59, "an unheld replay runs from its start"
        assert held.cloud.market.tick_origin == held_market.tick_origin, "clients agree"
