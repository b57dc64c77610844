"""Many SpotJobTriggers in one event loop, as in a triggerer: one describe per poll for all
their leases (counted at the local cloud server), and each trigger still gets its own
lease's end (reclaimed ones preempted, finished ones succeeded)."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time

import pytest

from airflow_spot.hooks.spot import SpotHook
from airflow_spot.triggers.spot import SpotJobTrigger
from spot_core.controller import JobSpec, Next
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import Outcome
from spot_core.observer import shared_observer
from spot_core.settings import SpotSettings
from tests.support.spot_helpers import marked_processes, trace, wait_until

pytestmark = pytest.mark.timeout(180)
POLL = 0.5
OPTIONS = {"poll_interval": POLL, "heartbeat_timeout": 60.0, "observe_failure_timeout": 60.0}
FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)
RECLAIMED_ZONE, STEADY_ZONE = "us-east-1a", "us-east-1b"
FINISHES = (sys.executable, "-c", "import time; time.sleep(2)")
RUNS_ON = (sys.executable, "-c", "import time; time.sleep(120)")


def _recreate(trigger: SpotJobTrigger) -> SpotJobTrigger:
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def _trigger(
    hook: SpotHook, tmp_path, index: int, zone: str, command, options: dict = OPTIONS
) -> SpotJobTrigger:
    """A watch Next from the controller (one spot attempt in ``zone``), as a trigger row."""
    pools = tuple(p for p in hook.pools() if p.zone == zone)
    spec = JobSpec(
        job_id=f"many-{index}",
        command=command,
        pools=pools,
        checkpoint_uri=(tmp_path / f"ckpt-{index}").as_uri(),
    )
    controller = hook.controller(SpotSettings.build(**options))
    nxt = controller.advance(spec, controller.new_record(spec))
    assert nxt.action == "watch" and nxt.lease.pool.zone == zone, nxt
    return _recreate(
        SpotJobTrigger(
            provider="local",
            provider_options=hook.reopen_options,
            next=nxt.to_dict(),
            checkpoint_uri=spec.checkpoint_uri,
            controller_options=options,
            return_on_notice=False,
        )
    )


async def _first_events(triggers) -> list[dict]:
    async def first(trigger):
        async for event in trigger.run():
            return event.payload

    return await asyncio.gather(*(first(t) for t in triggers))


def test_triggers_in_one_loop_share_one_describe_per_poll(tmp_path, monkeypatch):
    # This test's own server: its token comes from its workdir.
    monkeypatch.delenv("SPOT_LOCAL_CLOUD_URL", raising=False)
    # 1 tick per wall second: the first zone is taken away after 8 s, the second never.
    traces = [
        trace(f"{RECLAIMED_ZONE}_v100_1", "1" * 8 + "0" * 400),
        trace(f"{STEADY_ZONE}_v100_1", "1" * 408),
    ]
    with LocalCloudServer.from_traces(
        traces, time_scale=60.0, workdir=tmp_path / "cloud", config=FAST
    ) as server:
        hook = SpotHook("local", {"url": server.url, "workdir": str(server.cloud.workdir)})
        triggers = [
            _trigger(
                hook,
                tmp_path,
                i,
                RECLAIMED_ZONE if i % 2 else STEADY_ZONE,
                RUNS_ON if i % 2 else FINISHES,
            )
            for i in range(8)
        ]
        observer = shared_observer(triggers[0].hook().cache_key, hook.get_provider())
        before = server.stats.to_dict()
        started = time.monotonic()
        events = asyncio.run(asyncio.wait_for(_first_events(triggers), 90))
        elapsed = time.monotonic() - started

        def made() -> int:
            return server.stats.to_dict()["requests"]["POST /instances/describe"] - before[
                "requests"
            ].get("POST /instances/describe", 0)

        # A describe may still be on its way to the server as the last trigger ends.
        wait_until(lambda: not observer.watched() and made() == observer.calls, timeout=5)
        describes = made()

    assert describes == observer.calls, "a trigger described its lease by itself"
    assert describes <= elapsed / POLL + 3, (
        f"{describes} describes in {elapsed:.1f} s at one poll per {POLL} s for 8 triggers"
    )
    outcomes = []
    for index, event in enumerate(events):
        assert event["status"] == "ended", event
        record = Next.from_dict(event["next"]).record
        assert record.job_id == f"many-{index}"
        outcomes.append(record.attempts[-1].outcome)
    assert outcomes == [Outcome.SUCCEEDED, Outcome.PREEMPTED] * 4
    assert wait_until(lambda: not observer.watched(), timeout=5), "a lease stayed watched"
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)


def test_triggers_in_one_loop_renew_one_driver_beat_and_a_dropped_job_ends_alone(
    tmp_path, monkeypatch
):
    """heartbeat_uri: the triggers of one process renew one object for all their jobs
    (each job's heartbeat points at it). A trigger that goes away while the process lives
    on (cancelled, its task state unknown) drops out of that object at the next renewal,
    and its lease ends itself after the heartbeat timeout while the others run on."""
    monkeypatch.delenv("SPOT_LOCAL_CLOUD_URL", raising=False)
    timeout = 4.0
    options = {
        **OPTIONS,
        "heartbeat_timeout": timeout,
        "heartbeat_uri": (tmp_path / "drivers").as_uri(),
    }
    traces = [trace(f"{STEADY_ZONE}_v100_1", "1" * 2000)]
    with LocalCloudServer.from_traces(
        traces, time_scale=60.0, workdir=tmp_path / "cloud", config=FAST
    ) as server:
        hook = SpotHook("local", {"url": server.url, "workdir": str(server.cloud.workdir)})
        triggers = [_trigger(hook, tmp_path, i, STEADY_ZONE, RUNS_ON, options) for i in range(4)]
        leases = [Next.from_dict(t.next).lease for t in triggers]
        provider = hook.get_provider()

        def beat() -> dict:
            (path,) = (tmp_path / "drivers" / "drivers").glob("*.json")
            return json.loads(path.read_text())

        def running() -> list[bool]:
            return [not provider.observe([lease])[lease.lease_id].ended for lease in leases]

        async def scenario() -> tuple[dict, float]:
            tasks = [asyncio.create_task(_first_events([t])) for t in triggers]
            await asyncio.sleep(3 * timeout / 4 + 1)  # a few renewal rounds
            listed = beat()
            tasks[0].cancel()
            cancelled_at = time.monotonic()
            while time.monotonic() - cancelled_at < timeout + 20 and running()[0]:
                await asyncio.sleep(0.25)
            ended_after = time.monotonic() - cancelled_at
            assert running()[1:] == [True] * 3, "the other jobs' leases run on"
            assert set(beat()["jobs"]) == {"many-1", "many-2", "many-3"}
            for task in tasks[1:]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return listed, ended_after

        listed, ended_after = asyncio.run(asyncio.wait_for(scenario(), 120))
        assert listed["jobs"] == {f"many-{i}": 1 for i in range(4)}
        assert listed["sequence"] >= 2, "renewed while the triggers ran"
        for i in range(4):
            pointer = json.loads((tmp_path / f"ckpt-{i}" / "heartbeat" / "driver.json").read_text())
            assert pointer["driver"] == listed["driver"] and pointer["job"] == f"many-{i}"
        assert timeout - 1 <= ended_after < timeout + 20, ended_after
        for lease in leases[1:]:
            provider.terminate(lease)
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)
