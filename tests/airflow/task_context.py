"""What the Task SDK hands an operator, for tests that call ``execute`` directly: a task
state store (the accessor's get/set over a dict) and a task instance that takes XComs."""

from __future__ import annotations


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
