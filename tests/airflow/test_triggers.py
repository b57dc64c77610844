"""Every trigger round-trips serialize -> recreate, and the spot trigger watches a real lease."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time

import pytest

from airflow.triggers.base import BaseTrigger

from airflow_spot.triggers.price_window import SpotPriceWindowTrigger, window_decision
from airflow_spot.triggers.spot import SpotJobTrigger
from spot_core.model import JobRecord, Market, Offer, Pool


def _recreate(trigger: BaseTrigger) -> BaseTrigger:
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def _record() -> dict:
    return JobRecord(job_id="dag.train.run", created_at=1.0e9, checkpoint_uri="file:///c").to_dict()


LEASE = {"lease_id": "i-local-1", "pool": Pool("aws", "us-east-2", "us-east-2a", "p3.2xlarge").to_dict(),
         "job_id": "dag.train.run", "attempt": 1, "started_at": 1.0e9, "price_per_hour": 0.9,
         "details": {"log": "/tmp/x.log"}}

TRIGGERS = [
    SpotJobTrigger(provider="local", provider_options={"url": "http://127.0.0.1:1"},
                   record=_record(), lease=LEASE, end_by=2.0e9, poll_interval=0.5,
                   return_on_notice=False, not_before=1.0e9 + 3),
    SpotJobTrigger(provider="local", provider_options={}, record=_record(), end_by=2.0e9),
    SpotPriceWindowTrigger(provider="local", provider_options={"url": "http://127.0.0.1:1"},
                           zones=["us-east-2a"], profile=None, job_hours=2.0,
                           window_start=1.0e9, window_end=1.0e9 + 8 * 3600, max_price=0.5,
                           poll_interval=30.0),
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


def test_job_record_rides_in_the_trigger_kwargs():
    _, kwargs = TRIGGERS[0].serialize()
    assert JobRecord.from_dict(kwargs["record"]).job_id == "dag.train.run"


def _run(trigger) -> dict:
    async def first():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(first(), timeout=60))


def test_spot_trigger_reports_a_lease_that_ends(cloud_url):
    from airflow_spot.hooks.spot import SpotHook
    from spot_core.providers.base import LaunchSpec

    hook = SpotHook("local", {"url": cloud_url})
    provider = hook.get_provider()
    pool = next(p for p in provider.pools()
                if provider.market.offers([p], time.time())[0].available or not p.is_spot)
    lease = provider.launch(LaunchSpec(job_id="t", attempt=1, command=(
        sys.executable, "-c", "raise SystemExit(3)"), checkpoint_uri="file:///tmp/t"),
        pool.on(Market.ON_DEMAND))
    trigger = _recreate(SpotJobTrigger(provider="local", provider_options=hook.reopen_options,
                                       record=_record(), lease=lease.to_dict(),
                                       end_by=time.time() + 60, poll_interval=0.1))
    event = _run(trigger)
    assert event["status"] == "ended"
    assert event["lease_status"]["exit_code"] == 3
    assert event["record"]["job_id"] == "dag.train.run"


def test_spot_trigger_terminates_the_lease_when_its_time_is_up(cloud_url):
    from airflow_spot.hooks.spot import SpotHook
    from spot_core.providers.base import LaunchSpec

    hook = SpotHook("local", {"url": cloud_url})
    provider = hook.get_provider()
    pool = provider.pools()[0].on(Market.ON_DEMAND)
    lease = provider.launch(LaunchSpec(job_id="t2", attempt=1, command=(
        sys.executable, "-c", "import time; time.sleep(60)"), checkpoint_uri="file:///tmp/t"), pool)
    event = _run(SpotJobTrigger(provider="local", provider_options=hook.reopen_options,
                                record=_record(), lease=lease.to_dict(),
                                end_by=time.time() + 1.0, poll_interval=0.1))
    assert event["status"] == "timeout"
    assert provider.observe([lease])[lease.lease_id].ended


def test_wait_trigger_wakes_after_its_bounded_sleep():
    started = time.monotonic()
    event = _run(SpotJobTrigger(provider="local", provider_options={}, record=_record(),
                                end_by=time.time() + 0.3))
    assert event["status"] == "wake" and time.monotonic() - started >= 0.25


def _offer(zone: str, price: float, available: bool = True) -> Offer:
    return Offer(Pool("aws", zone[:-1], zone, "p3.2xlarge"), price, 3.06, available, 0.0)


def test_window_decision_starts_at_a_low_price_and_never_after_the_latest_start():
    common = {"profile": None, "job_hours": 1.0, "window_start": 0.0, "window_end": 7200.0,
              "max_price": 1.0, "poll_interval": 10.0}
    cheap = window_decision(now=10.0, offers=[_offer("us-east-2a", 0.9)], **common)
    assert cheap.start and cheap.zone == "us-east-2a"
    dear = window_decision(now=10.0, offers=[_offer("us-east-2a", 2.0)], **common)
    assert not dear.start and dear.recheck_at <= 20.0
    late = window_decision(now=3600.0, offers=[_offer("us-east-2a", 2.0)], **common)
    assert late.start and "latest start" in late.reason


def test_price_window_trigger_fires_when_the_local_market_is_cheap(cloud_url):
    from airflow_spot.hooks.spot import SpotHook

    hook = SpotHook("local", {"url": cloud_url})
    now = time.time()
    event = _run(SpotPriceWindowTrigger(provider="local", provider_options=hook.reopen_options,
                                        zones=None, profile=None, job_hours=1.0,
                                        window_start=now, window_end=now + 8 * 3600,
                                        max_price=1000.0, poll_interval=0.2))
    assert event["status"] == "start" and event["pool"]["market"] == "spot"
