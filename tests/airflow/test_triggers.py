"""Every trigger round-trips serialize -> recreate; the spot trigger drives the controller's
``check`` over a real lease on the local cloud (through a failing proxy, too)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
import threading
import time

import pytest
from airflow.triggers.base import BaseTrigger

from airflow_spot.triggers.price_window import SpotPriceWindowTrigger, window_decision
from airflow_spot.triggers.spot import SpotJobTrigger
from spot_core import jobs
from spot_core.controller import JobSpec, Next
from spot_core.model import JobRecord, Market, Offer, Outcome, Pool
from spot_core.settings import SpotSettings
from tests.support.fault_proxy import FaultProxy
from tests.support.spot_helpers import marked_processes, wait_until


def _recreate(trigger: BaseTrigger) -> BaseTrigger:
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def _record() -> dict:
    return JobRecord(job_id="dag.train.run", created_at=1.0e9, checkpoint_uri="file:///c").to_dict()


LEASE = {
    "lease_id": "i-local-1",
    "pool": Pool("aws", "us-east-2", "us-east-2a", "p3.2xlarge").to_dict(),
    "job_id": "dag.train.run",
    "attempt": 1,
    "started_at": 1.0e9,
    "price_per_hour": 0.9,
    "details": {"log": "/tmp/x.log"},
}
WATCH = {
    "action": "watch",
    "record": _record(),
    "until": 2.0e9,
    "lease": LEASE,
    "reason": "",
    "failing_since": None,
    "notice_at": None,
}
SLEEP = {**WATCH, "action": "sleep", "lease": None}

TRIGGERS = [
    SpotJobTrigger(
        provider="local",
        provider_options={"url": "http://127.0.0.1:1"},
        next=WATCH,
        checkpoint_uri="file:///c",
        controller_options={"poll_interval": 0.5, "heartbeat_timeout": 60.0},
        return_on_notice=False,
        not_before=1.0e9 + 3,
    ),
    SpotJobTrigger(provider="local", provider_options={}, next=SLEEP, checkpoint_uri="file:///c"),
    SpotJobTrigger(  # with the job's launch spec: it hands over on a notice itself
        provider="local",
        provider_options={"url": "http://127.0.0.1:1"},
        next=WATCH,
        checkpoint_uri="file:///c",
        controller_options={"poll_interval": 0.5, "handover": "on_notice"},
        launch=jobs.relaunch(
            SpotSettings.build(max_preemptions=2),
            JobSpec(
                job_id="dag.train.run",
                command=("python", "train.py"),
                checkpoint_uri="file:///c",
                pools=(Pool("aws", "us-east-2", "us-east-2a", "p3.2xlarge"),),
                env={"EPOCHS": "3"},
            ),
            max_user_retries=1_000_000,
        ).to_dict(),
    ),
    SpotPriceWindowTrigger(
        provider="local",
        provider_options={"url": "http://127.0.0.1:1"},
        zones=["us-east-2a"],
        profile=None,
        job_hours=2.0,
        window_start=1.0e9,
        window_end=1.0e9 + 8 * 3600,
        max_price=0.5,
        poll_interval=30.0,
    ),
]


@pytest.mark.parametrize("trigger", TRIGGERS, ids=lambda t: type(t).__name__)
def test_trigger_round_trips_through_serialize(trigger):
    path, kwargs = trigger.serialize()
    assert path == f"{type(trigger).__module__}.{type(trigger).__qualname__}"
    again = _recreate(trigger)
    assert type(again) is type(trigger)
    assert again.serialize() == (path, kwargs)


def test_trigger_kwargs_survive_airflow_serialization():
    """The kwargs go through Airflow's own encoder into the trigger table."""
    from airflow.serialization.serialized_objects import BaseSerialization

    for trigger in TRIGGERS:
        path, kwargs = trigger.serialize()
        assert BaseSerialization.deserialize(BaseSerialization.serialize(kwargs)) == kwargs


def test_the_controllers_next_rides_in_the_trigger_kwargs():
    _, kwargs = TRIGGERS[0].serialize()
    nxt = Next.from_dict(kwargs["next"])
    assert nxt.record.job_id == "dag.train.run" and nxt.lease.lease_id == "i-local-1"


def test_the_launch_spec_rides_in_the_kwargs_without_credentials():
    """A trigger's kwargs carry what relaunches the job (its spec, the policy's budgets),
    but a step environment holding a credential never rides there: that job's trigger
    only watches (its worker hands over)."""
    again = _recreate(TRIGGERS[2])
    assert again.relaunch.spec.command == ("python", "train.py")
    assert again.settings.max_preemptions == 2 and again.settings.handover == "on_notice"
    spec = JobSpec(
        job_id="j",
        command=("python", "train.py"),
        checkpoint_uri="file:///c",
        pools=(),
        env={"WANDB_API_KEY": "0123456789abcdef0123"},
    )
    assert jobs.relaunch(SpotSettings(), spec) is None


def _run(trigger, timeout: float = 60) -> dict:
    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(first(), timeout=timeout))


OPTIONS = {"poll_interval": 0.1, "heartbeat_timeout": 60.0, "observe_failure_timeout": 60.0}


def _launch(url: str, tmp_path, script: str, **options):
    """A watch Next from the controller: one on-demand attempt running ``script``."""
    from airflow_spot.hooks.spot import SpotHook

    hook = SpotHook("local", {"url": url})
    provider = hook.get_provider()
    pools = tuple(p.on(Market.ON_DEMAND) for p in provider.pools()[:1])
    spec = JobSpec(
        job_id=f"trig-{tmp_path.name}",
        command=(sys.executable, "-c", script),
        checkpoint_uri=(tmp_path / "ckpt").as_uri(),
        pools=pools,
    )
    controller = hook.controller(SpotSettings.build(**{**OPTIONS, **options}))
    nxt = controller.advance(spec, controller.new_record(spec))
    assert nxt.action == "watch", nxt
    trigger = SpotJobTrigger(
        provider="local",
        provider_options=hook.reopen_options,
        next=nxt.to_dict(),
        checkpoint_uri=spec.checkpoint_uri,
        controller_options={**OPTIONS, **options},
    )
    return _recreate(trigger), nxt, provider


def test_spot_trigger_fires_with_the_closed_record_when_the_lease_ends(cloud_url, tmp_path):
    trigger, nxt, _ = _launch(cloud_url, tmp_path, "raise SystemExit(3)")
    event = _run(trigger)
    assert event["status"] == "ended"
    record = Next.from_dict(event["next"]).record
    assert [a.outcome for a in record.attempts] == [Outcome.USER_FAILED]
    assert record.current_attempt is None and record.attempts[0].ended_at is not None


def test_spot_trigger_ends_the_attempt_at_its_time_limit(cloud_url, tmp_path):
    trigger, nxt, provider = _launch(
        cloud_url, tmp_path, "import time; time.sleep(60)", attempt_timeout=1.0
    )
    event = _run(trigger)
    record = Next.from_dict(event["next"]).record
    assert event["status"] == "ended" and "time limit" in record.attempts[-1].message
    assert provider.observe([nxt.lease])[nxt.lease.lease_id].ended
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)


def test_transient_observe_errors_do_not_end_the_attempt(cloud_url, tmp_path):
    """503s and reset connections while the trigger watches: the controller absorbs them
    (within observe_failure_timeout) and the attempt still ends as the step ends."""
    with FaultProxy(cloud_url, match="/describe") as proxy:
        trigger, nxt, _ = _launch(proxy.url, tmp_path, "import time; time.sleep(4)")

        def faults():
            for mode in ("503", "reset"):
                proxy.mode = mode
                time.sleep(1.0)
            proxy.mode = None

        injector = threading.Thread(target=faults, daemon=True)
        injector.start()
        event = _run(trigger)
        injector.join(timeout=10)
    record = Next.from_dict(event["next"]).record
    assert proxy.failed >= 4, "the faults never reached the trigger's observations"
    assert event["status"] == "ended"
    assert [a.outcome for a in record.attempts] == [Outcome.SUCCEEDED]


def test_killing_the_trigger_stops_its_lease_but_a_restart_does_not(cloud_url, tmp_path):
    """``on_kill`` (mark failed / clear) stops the lease; ``cleanup`` alone (a triggerer
    restart: no task instance state that left ``deferred``) leaves it running."""
    trigger, nxt, provider = _launch(cloud_url, tmp_path, "import time; time.sleep(60)")

    asyncio.run(asyncio.wait_for(_cancel_then(trigger, trigger.cleanup), 30))  # a restart
    assert not provider.observe([nxt.lease])[nxt.lease.lease_id].ended
    restarted = _recreate(trigger)  # what the next triggerer runs, from the kwargs alone
    asyncio.run(asyncio.wait_for(_cancel_then(restarted, restarted.on_kill, restarted.cleanup), 30))
    assert provider.observe([nxt.lease])[nxt.lease.lease_id].ended
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)


async def _cancel_then(trigger, *hooks):
    """Run the trigger a moment, cancel it as the triggerer does, then call ``hooks``."""
    task = asyncio.create_task(anext(trigger.run()))
    await asyncio.sleep(1.0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    for hook in hooks:
        await hook()


def test_sleep_trigger_wakes_after_its_bounded_sleep():
    started = time.monotonic()
    nxt = Next("sleep", JobRecord.from_dict(_record()), until=time.time() + 0.3)
    event = _run(
        SpotJobTrigger(
            provider="local", provider_options={}, next=nxt.to_dict(), checkpoint_uri="file:///c"
        )
    )
    assert event["status"] == "wake" and time.monotonic() - started >= 0.25


def _offer(zone: str, price: float, available: bool = True) -> Offer:
    return Offer(Pool("aws", zone[:-1], zone, "p3.2xlarge"), price, 3.06, available, 0.0)


def test_window_decision_starts_at_a_low_price_and_never_after_the_latest_start():
    common = {
        "profile": None,
        "job_hours": 1.0,
        "window_start": 0.0,
        "window_end": 7200.0,
        "max_price": 1.0,
        "poll_interval": 10.0,
    }
    cheap = window_decision(now=10.0, offers=[_offer("us-east-2a", 0.9)], **common)
    assert cheap.start and cheap.zone == "us-east-2a"
    dear = window_decision(now=10.0, offers=[_offer("us-east-2a", 2.0)], **common)
    assert not dear.start and dear.recheck_at <= 20.0
    late = window_decision(now=3600.0, offers=[_offer("us-east-2a", 2.0)], **common)
    assert late.start and "latest start" in late.reason


def _trace_prices() -> list[float]:
    """Every spot price of the trace the local cloud replays (the shipped excerpt)."""
    import json

    from spot_core.market import fixture_prices_path

    return [p for zone in json.loads(fixture_prices_path().read_text()).values() for p in zone]


def _window_trigger(cloud_url, max_price: float, window_end: float) -> SpotPriceWindowTrigger:
    from airflow_spot.hooks.spot import SpotHook

    hook = SpotHook("local", {"url": cloud_url})
    return SpotPriceWindowTrigger(
        provider="local",
        provider_options=hook.reopen_options,
        zones=None,
        profile=None,
        job_hours=1.0,
        window_start=time.time(),
        window_end=window_end,
        max_price=max_price,
        poll_interval=0.2,
    )


def test_price_window_trigger_fires_when_the_local_market_is_cheap(cloud_url):
    ceiling = max(_trace_prices())  # every spot price of the trace is at or below it
    event = _run(_window_trigger(cloud_url, ceiling, time.time() + 8 * 3600))
    assert event["status"] == "start" and event["pool"]["market"] == "spot"
    assert min(_trace_prices()) <= event["price"] <= ceiling
    assert "at or below max_price" in event["reason"]


def test_price_window_trigger_above_max_price_waits_for_the_latest_start(cloud_url):
    """Dearer than max_price everywhere: no start until only job_hours are left."""
    started = time.time()
    event = _run(
        _window_trigger(cloud_url, 0.9 * min(_trace_prices()), started + 3600 + 2.0)
    )  # latest start 2 s from now
    assert event["status"] == "start" and "latest start" in event["reason"], event
    assert time.time() - started >= 1.9, "started before the latest start, above max_price"
