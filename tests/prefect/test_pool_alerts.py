"""A pool past the alert thresholds raises `spot.pool.alert` in Prefect (read back from
the server's events API) with the numbers that passed; thresholds left empty raise none."""

from __future__ import annotations

import time

from prefect import flow, get_client, task
from prefect.events.worker import EventsWorker

from prefect_spot import SpotConfiguration, SpotTaskRunner, spot_record
from spot_core.market.fixtures import default_traces

ZONE = "us-west-2b"  # has capacity from tick 600 in the shipped trace


@task
def square(x: int) -> int:
    return x * x


def _run(tmp_path, **thresholds):
    config = SpotConfiguration(provider_options={"start_tick": 600}, zones=[ZONE], **thresholds)

    @flow(task_runner=SpotTaskRunner(config, workdir=tmp_path))
    def pipeline():
        future = square.submit(7)
        return future.result(), spot_record(future)

    return pipeline()


def _alerts_for(job_id: str, want: int, timeout: float = 30) -> list[dict]:
    EventsWorker.drain_all(timeout=10)
    found: list[dict] = []
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            response = client.request(
                "POST",
                "/events/filter",
                json={
                    "filter": {
                        "event": {"name": ["spot.pool.alert"]},
                        "related": {"id": [f"spot.job.{job_id}"]},
                        "occurred": {"since": "2000-01-01T00:00:00Z"},
                    },
                    "limit": 50,
                },
            )
            found = response.json()["events"]
            if len(found) >= want:
                break
            time.sleep(1)
    return found


def test_a_pool_past_both_thresholds_raises_an_alert_per_threshold(prefect_api, tmp_path):
    value, record = _run(tmp_path, alert_spot_price=0.01, alert_interruption_rate=1e-6)
    assert value == 49
    pool = record.attempts[0].pool
    alerts = _alerts_for(record.job_id, want=2)
    # the trace's zone had interruptions in its look-back window, and any spot price
    # is above a cent an hour
    assert sorted(e["payload"]["kind"] for e in alerts) == ["interruption_rate", "spot_price"]
    for event in alerts:
        assert event["resource"]["prefect.resource.id"] == f"spot.pool.{pool.key}"
        assert event["resource"]["prefect.resource.role"] == "spot-pool"
        assert event["payload"]["value"] > event["payload"]["threshold"]
        assert ZONE in event["payload"]["message"]
    price = next(e for e in alerts if e["payload"]["kind"] == "spot_price")["payload"]
    assert price["threshold"] == 0.01
    trace_prices = {float(p) for t in default_traces() if t.zone == ZONE for p in t.spot_price}
    assert min(trace_prices) <= price["value"] <= max(trace_prices)


def test_no_alert_when_the_thresholds_are_off(prefect_api, tmp_path):
    value, record = _run(tmp_path, alert_spot_price=None, alert_interruption_rate=None)
    assert value == 49
    time.sleep(2)
    assert _alerts_for(record.job_id, want=1, timeout=3) == []


def test_an_automation_on_the_alert_pauses_a_work_pool(prefect_api, tmp_path):
    """The docs' example, run: Prefect's triggers and actions services see the alert and
    pause the work pool the automation names."""
    import uuid
    from datetime import timedelta

    from prefect.automations import Automation
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.events.actions import PauseWorkPool
    from prefect.events.schemas.automations import EventTrigger, Posture

    name = f"spot-alerted-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        work_pool = client.create_work_pool(WorkPoolCreate(name=name, type="process"))
    automation = Automation(
        name=f"pause {name} on a spot pool alert",
        trigger=EventTrigger(
            expect={"spot.pool.alert"},
            match={"prefect.resource.id": "spot.pool.*"},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[PauseWorkPool(source="selected", work_pool_id=work_pool.id)],
    ).create()
    try:
        time.sleep(2)  # the triggers service loads automations as they change
        _, record = _run(tmp_path, alert_spot_price=0.01)
        assert _alerts_for(record.job_id, want=1)
        paused = False
        deadline = time.monotonic() + 60
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline and not paused:
                paused = client.read_work_pool(name).is_paused
                time.sleep(1)
        assert paused, "the automation did not pause the work pool"
    finally:
        automation.delete()
