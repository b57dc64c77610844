"""What the Task SDK hands an operator, for tests that call ``execute`` directly: a task
state store (the accessor's get/set over a dict) and a task instance that takes XComs;
and what Airflow does across deferrals, with the operator's real trigger."""

from __future__ import annotations

import asyncio


class StateStore:
    def __init__(self):
        self.data = {}

    def get(self, key, default=None):
        return self.data.get(key, default)

    def set(self, key, value, *, retention=None):
        assert value is not None
        self.data[key] = value


class TI:
    dag_id, task_id, run_id, map_index = "d", "t", "manual__1", -1

    def __init__(self):
        self.xcom = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


async def first_event(trigger):
    """The payload of the first event ``trigger`` fires."""
    async for event in trigger.run():
        return event.payload


def drive_deferrals(op, context, *, event_timeout: float = 120, max_deferrals: int = 20):
    """Run the operator as Airflow does across deferrals, with the real trigger."""
    from airflow.sdk.exceptions import TaskDeferred

    try:
        return op.execute(context)
    except TaskDeferred as deferred:
        pending = deferred
    for _ in range(max_deferrals):
        payload = asyncio.run(asyncio.wait_for(first_event(pending.trigger), timeout=event_timeout))
        try:
            return getattr(op, pending.method_name)(context, payload)
        except TaskDeferred as deferred:
            pending = deferred
    raise AssertionError("the operator kept deferring")
