"""PriceWindowTimetable is deterministic, serialisable and registered; the sensor pushes a pool."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spot_core.policy.price_window import HOURS_PER_WEEK, HourOfWeekProfile, hour_of_week


def _profile(cheap_hour: int = 3) -> HourOfWeekProfile:
    """Spot costs 1.0 $/h except hour ``cheap_hour`` of every day, where it costs 0.2."""
    prices, avail = [], []
    for slot in range(HOURS_PER_WEEK):
        prices.append(0.2 if slot % 24 == cheap_hour else 1.0)
        avail.append(1.0)
    return HourOfWeekProfile({"us-east-2a": prices}, {"us-east-2a": avail}, 3.0)


def test_timetable_places_runs_at_the_cheapest_hour_of_the_window():
    from airflow.timetables.base import TimeRestriction

    from airflow_spot.timetables.price_window import PriceWindowTimetable

    timetable = PriceWindowTimetable(
        profile=_profile(cheap_hour=3), job_hours=1, start_hour=0, end_hour=8
    )
    start = datetime(2026, 3, 2, tzinfo=UTC)
    restriction = TimeRestriction(earliest=start, latest=None, catchup=True)
    first = timetable.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
    assert first.data_interval.start == start
    assert first.data_interval.end == start + timedelta(hours=8)
    assert first.run_after == start + timedelta(hours=3)
    assert hour_of_week(first.run_after.timestamp()) % 24 == 3
    second = timetable.next_dagrun_info(
        last_automated_data_interval=first.data_interval, restriction=restriction
    )
    assert second.run_after == first.run_after + timedelta(days=1)
    again = timetable.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
    assert again == first  # deterministic


def test_timetable_round_trips_and_is_registered_through_the_plugin():
    from airflow import plugins_manager

    from airflow_spot.timetables.price_window import PriceWindowTimetable

    timetable = PriceWindowTimetable(profile=_profile(), job_hours=2, start_hour=1, end_hour=7)
    again = PriceWindowTimetable.deserialize(timetable.serialize())
    assert again == timetable and again.summary == timetable.summary
    assert "01:00-07:00 UTC" in timetable.summary
    path = f"{PriceWindowTimetable.__module__}.{PriceWindowTimetable.__qualname__}"
    assert path in plugins_manager.get_timetables_plugins()


def test_a_dag_with_the_timetable_serialises_for_the_scheduler():
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_spot.timetables.price_window import PriceWindowTimetable

    with DAG(
        "nightly",
        schedule=PriceWindowTimetable(profile=_profile(), job_hours=1),
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
    ) as dag:
        pass
    data = DagSerialization.to_dict(dag)
    restored = DagSerialization.from_dict(data)
    assert restored.timetable.summary == dag.timetable.summary


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start_hour": 8, "end_hour": 8}, "is not inside one day"),
        ({"job_hours": 9}, "must be > 0 and fit"),
    ],
)
def test_timetable_rejects_bad_windows(kwargs, message):
    from airflow_spot.timetables.price_window import PriceWindowTimetable

    with pytest.raises(ValueError, match=message):
        PriceWindowTimetable(**{"profile": _profile(), "job_hours": 1, **kwargs})


def test_sensor_poke_pushes_the_chosen_pool(tmp_path, monkeypatch):
    import json

    from airflow.sdk import DAG

    from airflow_spot.demo import cloud_server
    from airflow_spot.sensors.price_window import POOL_KEY, SpotPriceWindowSensor
    from spot_core.localcloud.server import client_environ
    from spot_core.market import fixture_prices_path
    from spot_core.market.fixtures import default_traces

    # The local cloud replays the shipped excerpt: its spot prices bound the thresholds.
    prices = [p for zone in json.loads(fixture_prices_path().read_text()).values() for p in zone]
    # Its own cloud, at a tick where every zone has spot capacity, replayed in real time
    # (a tick lasts 195 s): the answer cannot depend on how far the suite's shared cloud
    # has got (at a moment when no zone has capacity the sensor rightly waits).
    traces = default_traces()
    tick = next(
        t
        for t in range(200, min(tr.n_ticks for tr in traces))
        if all(tr.available[t] for tr in traces)
    )
    pushed = {}

    class TI:
        start_date = datetime.now(UTC)

        def xcom_push(self, key, value):
            pushed[key] = value

    with cloud_server(tmp_path / "cloud", start_tick=tick, time_scale=1.0) as url:
        for name, value in client_environ(url, tmp_path / "cloud").items():
            monkeypatch.setenv(name, value)

        def poke(task_id: str, max_price: float) -> bool:
            with DAG(f"sensor_{task_id}", schedule=None, start_date=datetime(2026, 1, 1)):
                sensor = SpotPriceWindowSensor(
                    task_id=task_id,
                    job_hours=1,
                    window_end=timedelta(hours=8),
                    max_price=max_price,
                    provider_options={"url": url},
                )
            return sensor.poke({"ti": TI()})

        assert poke("dear", 0.9 * min(prices)) is False, "every pool is above max_price: wait"
        assert pushed == {}
        assert poke("cheap", max(prices)) is True
    assert pushed[POOL_KEY]["pool"]["market"] == "spot"
    assert min(prices) <= pushed[POOL_KEY]["price"] <= max(prices)
