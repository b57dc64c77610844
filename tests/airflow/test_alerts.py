"""Pool alerts from SpotJobOperator against a real local cloud server: when an attempt
ends, a pool of the job whose spot price passes ``alert_spot_price`` reaches Airflow's
listener hook ``on_spot_alert`` (the Task SDK's pluggy listener manager, as a plugin's
``listeners`` would be registered) and the operator's ``on_spot_alert`` callback."""

from __future__ import annotations

import sys
from datetime import datetime

import pytest
from airflow.listeners import hookimpl
from airflow.sdk import DAG

from airflow_spot.operators.spot import SpotJobOperator
from tests.support.task_context import TI, StateStore


class Listener:
    def __init__(self):
        self.calls = []

    @hookimpl
    def on_spot_alert(self, alert, dag_id, run_id, task_id, map_index):
        self.calls.append((alert, dag_id, task_id, map_index))


@pytest.fixture
def listener():
    from airflow.sdk.listener import get_listener_manager

    found = Listener()
    manager = get_listener_manager()
    manager.add_listener(found)
    yield found
    manager.pm.unregister(found)


def _operator(cloud_url, tmp_path, **alerting) -> SpotJobOperator:
    with DAG("alerting", schedule=None, start_date=datetime(2026, 1, 1)):
        return SpotJobOperator(
            task_id="t",
            command=[sys.executable, "-c", "print('done')"],
            checkpoint_uri=(tmp_path / "ckpt").as_uri(),
            provider_options={"url": cloud_url},
            deferrable=False,
            poll_interval=0.1,
            capacity_wait=0.5,
            on_demand_fallback=True,
            **alerting,
        )


def test_a_pool_above_the_price_threshold_reaches_the_listener_and_the_callback(
    cloud_url, tmp_path, listener
):
    seen = []
    op = _operator(
        cloud_url,
        tmp_path,
        alert_spot_price=0.01,
        alert_interruption_rate=None,
        on_spot_alert=lambda alert, context: seen.append(alert),
    )
    op.execute({"task_state_store": StateStore(), "ti": TI()})
    pools = {p.key for p in op.hook.pools() if p.is_spot}
    assert seen and {a["pool_key"] for a in seen} == pools  # every spot pool costs > $0.01/h
    assert all(a["kind"] == "spot_price" and a["value"] > 0.01 == a["threshold"] for a in seen)
    assert [call[0] for call in listener.calls] == seen
    assert {call[1:] for call in listener.calls} == {(TI.dag_id, TI.task_id, TI.map_index)}


def test_no_threshold_no_alert(cloud_url, tmp_path, listener):
    seen = []
    op = _operator(
        cloud_url,
        tmp_path,
        alert_spot_price=None,
        alert_interruption_rate=None,
        on_spot_alert=lambda alert, context: seen.append(alert),
    )
    op.execute({"task_state_store": StateStore(), "ti": TI()})
    assert seen == [] and listener.calls == []


def test_a_bad_callback_or_threshold_is_refused_at_parse_time(cloud_url, tmp_path):
    with pytest.raises(ValueError, match="on_spot_alert=.*must be a function"):
        _operator(cloud_url, tmp_path, on_spot_alert="page me")
    with pytest.raises(ValueError, match="alert_spot_price"):
        _operator(cloud_url, tmp_path, alert_spot_price=-1)


def test_each_pool_alert_is_logged_once_while_every_task_still_hears_it(
    cloud_url, tmp_path, listener, caplog, monkeypatch
):
    """Three tasks ending together (the demo's mapped shards) logged each pool's alert
    three times; the log says it once, the callbacks hear it every time."""
    from airflow_spot import alerts

    monkeypatch.setattr(alerts, "_logged_at", {}, raising=False)  # a fresh process
    seen = []
    for n in range(3):
        op = _operator(
            cloud_url,
            tmp_path / str(n),
            alert_spot_price=0.01,
            alert_interruption_rate=None,
            on_spot_alert=lambda alert, context: seen.append(alert),
        )
        with caplog.at_level("WARNING", logger="airflow_spot.alerts"):
            op.execute({"task_state_store": StateStore(), "ti": TI()})
    logged = [r.getMessage() for r in caplog.records if "spot pool alert" in r.getMessage()]
    pools = {p.key for p in op.hook.pools() if p.is_spot}
    assert sorted(m.split(": ")[1] for m in logged) == sorted(pools), logged
    assert len(seen) >= 3 * len(pools)
