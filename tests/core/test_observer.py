"""The shared observer: many watched leases, one describe per poll, counted at the local
cloud server; a failed describe reaches every waiter (and the controller's failure
timeout still decides); an unwatched lease is no longer described."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from spot_core.controller import Controller, JobSpec, Next
from spot_core.errors import InfrastructureError
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import Market, Outcome
from spot_core.observer import SharedObserver, observer_key, shared_observer
from spot_core.providers import open_provider
from spot_core.providers.base import LaunchSpec, LeaseState, Observation
from tests.support.fault_proxy import FaultProxy
from tests.support.spot_helpers import marked_processes, trace, wait_until

pytestmark = pytest.mark.timeout(120)
FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)
POLL = 0.2
SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("observer-cloud")
    with LocalCloudServer.from_traces(
        [trace("us-east-1a_v100_1", "1" * 400)],
        time_scale=60.0,
        workdir=workdir / "cloud",
        config=FAST,
    ) as server:
        yield server
    assert wait_until(lambda: not marked_processes(str(workdir)), timeout=15)


@pytest.fixture(scope="module")
def leases(server, tmp_path_factory):
    """Three running leases (on-demand: the trace never takes them away)."""
    provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
    pool = provider.pools()[0].on(Market.ON_DEMAND)
    ckpt = tmp_path_factory.mktemp("observer-ckpt")
    launched = [
        provider.launch(LaunchSpec(f"job-{i}", 1, SLEEPER, (ckpt / str(i)).as_uri()), pool)
        for i in range(3)
    ]
    yield launched
    for lease in launched:
        provider.terminate(lease)


def _describes(server) -> int:
    return server.stats.to_dict()["requests"].get("POST /instances/describe", 0)


def _wait_all(observer, leases, after, timeout=10.0):
    """Each lease's observation, each waited for from its own thread (a worker's)."""
    found: dict[str, Observation] = {}

    def one(lease):
        found[lease.lease_id] = observer.wait(lease.lease_id, after, timeout)

    threads = [threading.Thread(target=one, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    return found


def test_many_waiters_share_one_describe_per_poll(server, leases):
    """Every waiter of a round gets the same describe, and the server sees one describe
    per poll (not one per lease), polls paced by the cadence, not by the waiters."""
    observer = SharedObserver(open_provider("local", url=server.url, workdir=server.cloud.workdir))
    before = _describes(server)  # before the first watch starts the polling thread
    started = time.monotonic()
    try:
        for lease in leases:
            observer.watch(lease, POLL)
        # Past the polls made before the waiters exist: a waiter that asked for "anything"
        # could get an older describe than one that started a poll later.
        after = observer.wait(leases[0].lease_id, 0.0, 10.0).at + POLL / 2
        for _ in range(5):  # five polls, each waiter asking for each
            found = _wait_all(observer, leases, after)
            assert {o.status.state for o in found.values()} == {LeaseState.RUNNING}
            assert len({o.at for o in found.values()}) == 1, "not one describe for all"
            after = next(iter(found.values())).at + POLL / 2
    finally:
        observer.close()
    elapsed = time.monotonic() - started
    # A describe may still be on its way to the server as the observer closes.
    wait_until(lambda: _describes(server) - before == observer.calls == observer.polls, 5)
    assert _describes(server) - before == observer.calls, (
        "the server saw describes the observer did not make"
    )
    assert observer.calls == observer.polls, "more than one describe per poll of 3 leases"
    assert 6 <= observer.polls <= elapsed / POLL + 2, (observer.polls, elapsed)


def test_a_failing_describe_reaches_every_waiter_then_recovers(server, leases):
    with FaultProxy(server.url, match="/describe") as proxy:
        observer = SharedObserver(
            open_provider("local", url=proxy.url, workdir=server.cloud.workdir)
        )
        try:
            proxy.mode = "503"  # before the first poll, which watching starts
            for lease in leases:
                observer.watch(lease, POLL)
            first = observer.wait(leases[0].lease_id, 0.0, 10.0)  # past the polls so far
            failed = _wait_all(observer, leases, after=first.at + POLL / 2)
            assert all(isinstance(o.error, InfrastructureError) for o in failed.values())
            assert len({o.at for o in failed.values()}) == 1  # the same failed describe
            proxy.mode = None
            again = _wait_all(observer, leases, after=max(o.at for o in failed.values()) + 0.01)
            assert {o.status.state for o in again.values()} == {LeaseState.RUNNING}
        finally:
            observer.close()


def test_the_controller_reads_a_shared_failure_against_its_failure_timeout(
    server, leases, tmp_path
):
    """An observation's error is a failed observation like any other: absorbed until
    ``observe_failure_timeout``, then the attempt ends as infrastructure_failed."""
    provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
    pool = provider.pools()[0].on(Market.ON_DEMAND)
    spec = JobSpec("job-obs-fail", SLEEPER, (tmp_path / "ckpt").as_uri(), (pool,))
    controller = Controller(provider, provider.market, observe_failure_timeout_seconds=30.0)
    nxt = controller.advance(spec, controller.new_record(spec))
    assert nxt.action == "watch"
    failed = Observation(nxt.lease.lease_id, error=InfrastructureError("describe: 503"), at=1.0)
    now = nxt.lease.started_at + 1
    held = controller.check(spec, nxt, now=now, observed=failed)
    assert held.action == "watch" and held.failing_since == now
    ended = controller.check(spec, held, now=now + 31, observed=failed)
    assert ended.action == "ended"
    assert ended.record.attempts[-1].outcome is Outcome.INFRASTRUCTURE_FAILED
    assert "503" in ended.record.attempts[-1].message
    assert provider.observe([nxt.lease])[nxt.lease.lease_id].ended  # terminated all the same


def test_an_unwatched_lease_is_no_longer_described(server, leases):
    observer = SharedObserver(open_provider("local", url=server.url, workdir=server.cloud.workdir))
    kept, dropped = leases[0], leases[1]
    try:
        observer.watch(kept, POLL)
        observer.watch(dropped, POLL)
        observer.watch(dropped, POLL)  # two drivers on one lease: it stays until both go
        first = _wait_all(observer, [kept, dropped], after=0.0)
        observer.unwatch(dropped.lease_id)
        assert dropped.lease_id in observer.watched()
        observer.unwatch(dropped.lease_id)
        assert observer.watched() == (kept.lease_id,)
        seen = server.stats.to_dict()["described"].get(dropped.lease_id, 0)
        later = max(o.at for o in first.values()) + 3 * POLL
        assert _wait_all(observer, [kept], after=later)[kept.lease_id].status is not None
        assert server.stats.to_dict()["described"].get(dropped.lease_id, 0) <= seen + 1
        gone = observer.wait(dropped.lease_id, after=0.0, timeout=1.0)
        assert gone.error is not None and "not watched" in str(gone.error)
    finally:
        observer.close()


def test_asyncio_waiters_in_one_loop_never_block_it(server, leases):
    """What a triggerer does: every waiter in one event loop; the loop keeps ticking
    while the describe runs in the observer's thread."""
    provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
    observer = shared_observer(observer_key("local", {"url": server.url}, "test"), provider)
    assert shared_observer(observer_key("local", {"url": server.url}, "test"), provider) is observer

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beat = asyncio.create_task(ticker())
        for lease in leases:
            observer.watch(lease, POLL)
        try:
            found = await asyncio.gather(
                *(observer.wait_async(each.lease_id, 0.0, 10.0) for each in leases)
            )
            found2 = await asyncio.gather(
                *(
                    observer.wait_async(each.lease_id, found[0].at + POLL / 2, 10.0)
                    for each in leases
                )
            )
        finally:
            for lease in leases:
                observer.unwatch(lease.lease_id)
            beat.cancel()
        return found, found2, ticks

    found, found2, ticks = asyncio.run(asyncio.wait_for(main(), 30))
    assert all(o.status.state is LeaseState.RUNNING for o in found + found2)
    assert len({o.at for o in found2}) == 1 and found2[0].at > found[0].at
    assert ticks >= 5, "the event loop stalled while the observer described"
    assert wait_until(lambda: not observer.watched(), timeout=2)


def test_a_stalled_describe_is_a_bounded_wait(server, leases):
    with FaultProxy(server.url, match="/describe", delay=3.0) as proxy:
        observer = SharedObserver(
            open_provider("local", url=proxy.url, workdir=server.cloud.workdir)
        )
        try:
            observer.watch(leases[0], POLL)
            proxy.mode = "slow"
            got = observer.wait(leases[0].lease_id, after=1e18, timeout=0.5)  # never fresh
            assert got.error is not None and getattr(got.error, "retryable", None) is True
            assert "in 0.5 s" in str(got.error)
        finally:
            proxy.mode = None
            observer.close()


def test_next_cannot_be_checked_against_another_leases_observation(server, leases, tmp_path):
    provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
    controller = Controller(provider, provider.market)
    from spot_core.model import JobRecord

    record = JobRecord(job_id="j", created_at=1.0, checkpoint_uri=(tmp_path / "c").as_uri())
    watch = Next("watch", record, until=2e9, lease=leases[0])
    with pytest.raises(ValueError, match="observation of lease"):
        controller.check(
            JobSpec("j", (), record.checkpoint_uri, ()),
            watch,
            observed=Observation(leases[1].lease_id),
        )
