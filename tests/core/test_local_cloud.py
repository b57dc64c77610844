"""The trace-driven local spot cloud reclaims capacity the way a cloud does."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from spot_core.errors import CapacityUnavailable
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.model import Market
from spot_core.providers.base import LaunchSpec, LeaseState
from spot_core.providers.local import LocalProvider
from tests.support.spot_helpers import marked_processes, trace, wait_until

pytestmark = pytest.mark.timeout(60)


def _provider(tmp_path, *patterns, start_tick=0, **config):
    traces = [trace(f"us-east-1{chr(ord('a') + i)}_v100_1", p) for i, p in enumerate(patterns)]
    cfg = LocalCloudConfig(
        min_notice_wall_seconds=config.pop("notice", 0.5),
        grace_wall_seconds=config.pop("grace", 0.5),
    )
    return LocalProvider.from_traces(
        traces, time_scale=60.0, start_tick=start_tick, workdir=tmp_path / "cloud", config=cfg
    )


def _spec(tmp_path, *command):
    return LaunchSpec(
        job_id="job-1", attempt=1, command=command, checkpoint_uri=(tmp_path / "ckpt").as_uri()
    )


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "step.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_launch_into_unavailable_pool_fails_as_capacity_unavailable(tmp_path):
    with _provider(tmp_path, "0" * 50) as provider:
        pool = provider.pools()[0]
        with pytest.raises(CapacityUnavailable, match="no spot capacity"):
            provider.launch(_spec(tmp_path, "true"), pool)
        lease = provider.launch(
            _spec(tmp_path, sys.executable, "-c", "pass"), pool.on(Market.ON_DEMAND)
        )  # on-demand is always there
        assert wait_until(lambda: provider.observe([lease])[lease.lease_id].ended)
        assert provider.observe([lease])[lease.lease_id].exit_code == 0


def test_reclaim_serves_notice_then_sigterm_then_sigkill(tmp_path):
    """A step that ignores its notice is killed with everything it started."""
    step = _script(
        tmp_path,
        """
        import signal, subprocess, sys, time, os
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", "import time, signal; "
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"],
                         start_new_session=True)
        time.sleep(60)
    """,
    )
    # Available for two ticks (2 s at 60x on 60 s ticks), then gone.
    with _provider(tmp_path, "11" + "0" * 60) as provider:
        lease = provider.launch(_spec(tmp_path, sys.executable, step), provider.pools()[0])
        assert wait_until(lambda: len(marked_processes(str(tmp_path))) >= 3)
        assert wait_until(
            lambda: provider.observe([lease])[lease.lease_id].notice_at is not None, timeout=5
        )
        assert wait_until(lambda: provider.observe([lease])[lease.lease_id].ended, timeout=10)
        status = provider.observe([lease])[lease.lease_id]
        assert status.state is LeaseState.RECLAIMED
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)


def test_step_under_watch_sees_the_notice_and_exits_cleanly(tmp_path):
    step = _script(
        tmp_path,
        """
        import os, signal, sys, time, json
        got = []
        signal.signal(signal.SIGTERM, lambda *a: got.append(1))
        while not got:
            time.sleep(0.02)
        notice = json.load(open(os.environ["SPOT_NOTICE_FILE"]))
        sys.exit(143 if notice["event"] == "interruption" else 1)
    """,
    )
    with _provider(tmp_path, "11" + "0" * 60, notice=3.0) as provider:
        lease = provider.launch(_spec(tmp_path, sys.executable, step), provider.pools()[0])
        assert wait_until(lambda: provider.observe([lease])[lease.lease_id].ended, timeout=10)
        status = provider.observe([lease])[lease.lease_id]
        assert status.state is LeaseState.EXITED and status.exit_code == 143
        assert status.notice_at is not None


def test_on_demand_lease_is_never_reclaimed_and_bills_on_demand(tmp_path):
    with _provider(tmp_path, "1" + "0" * 60) as provider:
        pool = provider.pools()[0].on(Market.ON_DEMAND)
        lease = provider.launch(
            _spec(tmp_path, sys.executable, "-c", "import time; time.sleep(2.5)"), pool
        )
        assert wait_until(lambda: provider.observe([lease])[lease.lease_id].ended, timeout=10)
        status = provider.observe([lease])[lease.lease_id]
        assert status.exit_code == 0 and status.notice_at is None
        bill = provider.bill(lease, status.ended_at)
        assert bill.cost == pytest.approx(bill.on_demand_cost)
        assert bill.capacity_seconds == pytest.approx((status.ended_at - lease.started_at) * 60)


def test_spot_bill_follows_the_trace_price_per_tick(tmp_path):
    with _provider(tmp_path, "1" * 100) as provider:
        pool = provider.pools()[0]
        lease = provider.launch(_spec(tmp_path, sys.executable, "-c", "pass"), pool)
        bill = provider.bill(lease, lease.started_at + 3.0)  # 3 wall s = 3 trace minutes
        assert bill.capacity_seconds == pytest.approx(180.0)
        assert bill.cost == pytest.approx(0.9 * 180 / 3600)
        assert bill.on_demand_cost == pytest.approx(3.06 * 180 / 3600)


def test_terminate_and_close_leave_no_process(tmp_path):
    with _provider(tmp_path, "1" * 100) as provider:
        leases = [
            provider.launch(
                _spec(tmp_path, sys.executable, "-c", "import time; time.sleep(60)"),
                provider.pools()[0],
            )
            for _ in range(2)
        ]
        assert wait_until(lambda: len(marked_processes(str(tmp_path))) >= 4)
        provider.terminate(leases[0])
        assert provider.observe(leases)[leases[0].lease_id].state is LeaseState.TERMINATED
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)


def test_a_lease_whose_driver_stops_renewing_ends_itself(tmp_path):
    """The driver renews the heartbeat, then goes silent: the watcher ends the lease."""
    from spot_core.attempt_env import DRIVER_LOST_EXIT_CODE
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.heartbeat import Heartbeat

    spec = LaunchSpec(
        job_id="job-hb",
        attempt=1,
        heartbeat_timeout_seconds=1.5,
        command=(sys.executable, "-c", "import time; time.sleep(60)"),
        checkpoint_uri=(tmp_path / "ckpt").as_uri(),
    )
    heartbeat = Heartbeat(open_store(spec.checkpoint_uri))
    with _provider(tmp_path, "1" * 100) as provider:
        heartbeat.renew(1, time.time())
        lease = provider.launch(spec, provider.pools()[0])
        renew_until = time.monotonic() + 4.0
        while time.monotonic() < renew_until:  # renewed: alive well past the timeout
            heartbeat.renew(1, time.time())
            time.sleep(0.2)
        assert not provider.observe([lease])[lease.lease_id].ended
        assert wait_until(lambda: provider.observe([lease])[lease.lease_id].ended, timeout=10)
        status = provider.observe([lease])[lease.lease_id]
        assert status.state is LeaseState.TERMINATED
        assert status.exit_code == DRIVER_LOST_EXIT_CODE and "heartbeat" in status.message
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=10)


ORPHAN_MAKER = textwrap.dedent("""
    import sys
    from spot_core.providers.base import LaunchSpec
    from spot_core.providers.local import LocalProvider
    provider = LocalProvider.from_traces(workdir=sys.argv[1])
    spec = LaunchSpec(job_id=sys.argv[2], attempt=1, checkpoint_uri=sys.argv[3],
                      command=(sys.executable, "-c", "import time; time.sleep(120)"))
    print(provider.launch(spec, provider.pools()[0].on("on-demand")).lease_id, flush=True)
    sys.stdin.read()  # until the test SIGKILLs this process: its lease stays behind
""")


def test_cleanup_orphans_ends_the_leases_a_dead_process_left(tmp_path):
    """(Always with a job id here: other work on this machine may run local leases.)"""
    import os
    import subprocess

    dead, other = f"job-dead-{os.getpid()}", f"job-other-{os.getpid()}"
    makers = {
        job: subprocess.Popen(
            [
                sys.executable,
                "-c",
                ORPHAN_MAKER,
                str(tmp_path / f"cloud-{job}"),
                job,
                (tmp_path / job).as_uri(),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for job in (dead, other)
    }
    try:
        leases = {job: proc.stdout.readline().strip() for job, proc in makers.items()}
        for proc in makers.values():
            proc.kill()
            proc.wait(timeout=10)
        assert wait_until(lambda: len(marked_processes(str(tmp_path))) >= 4)
        with _provider(tmp_path, "1" * 100) as provider:
            assert provider.cleanup_orphans(job_id=dead) == [leases[dead]]
            assert wait_until(lambda: not marked_processes(str(tmp_path / dead)))
            assert marked_processes(str(tmp_path / other)), "another job's lease stays"
            assert provider.cleanup_orphans(job_id=other) == [leases[other]]
        assert wait_until(lambda: not marked_processes(str(tmp_path)))
    finally:
        for proc in makers.values():
            proc.kill()


def test_watch_poll_interval_reaches_each_leases_watcher_and_reopens(tmp_path):
    """At real time a watcher polling every 0.1 s costs five times what 1 s does (a
    benchmark with hundreds of leases sets 1); the option travels in the provider's
    options, so a trigger or worker that reopens the provider launches the same."""
    from spot_core.providers import open_provider

    provider = open_provider(
        "local", time_scale=60.0, workdir=str(tmp_path / "cloud"), watch_poll_interval=1.5
    )
    try:
        assert provider.options["watch_poll_interval"] == 1.5
        pool = provider.pools()[0].on(Market.ON_DEMAND)
        lease = provider.launch(_spec(tmp_path, "sleep", "30"), pool)
        commands = [
            Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            for pid in marked_processes(lease.lease_id)
        ]
        command = next(c for c in commands if b"watch" in c)
        assert command[command.index(b"--poll-interval") + 1] == b"1.5"
        provider.terminate(lease)
    finally:
        provider.cloud.shutdown()
