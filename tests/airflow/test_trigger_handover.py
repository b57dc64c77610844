"""Handover in the triggerer: no worker wakes between the two attempts.

A deferrable ``SpotJobOperator`` hands its trigger the job's launch spec and policy
(``launch``): on the interruption notice the trigger's controller launches the
replacement itself, while the task stays deferred, adopts it once the old lease ends and
watches it on; the one event carries both attempts closed. A trigger handed a job in the
middle of a handover (the replacement launched on the notice by a worker; the old lease
still running) adopts it the same way."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import sys
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred

from airflow_spot.hooks.spot import SpotHook
from airflow_spot.operators import controller_driver
from airflow_spot.operators.spot import RECORD_KEY, SpotJobOperator
from airflow_spot.triggers.spot import SpotJobTrigger
from spot_core.checkpoint import open_store
from spot_core.checkpoint.resumed import read_resumed
from spot_core.controller import JobSpec, Next
from spot_core.errors import FencedOut
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer, client_environ
from spot_core.model import JobRecord, Outcome
from spot_core.settings import SpotSettings
from tests.support import SUPPORT
from tests.support.spot_helpers import marked_processes, trace, wait_until
from tests.support.task_context import TI, StateStore, first_event

pytestmark = pytest.mark.timeout(120)
STEP = SUPPORT / "handover_step.py"
ZONES = {"us-east-1a_v100_1": "111" + "0" * 400, "us-east-1b_v100_1": "00" + "1" * 400}
OPTIONS = {
    "poll_interval": 0.05,
    "heartbeat_timeout": 60.0,
    "observe_failure_timeout": 60.0,
    "handover": "on_notice",
}


def _run(trigger: SpotJobTrigger, timeout: float = 90) -> dict:
    async def first() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger fired nothing")

    return asyncio.run(asyncio.wait_for(first(), timeout=timeout))


def test_a_trigger_adopts_the_replacement_and_watches_it_on(tmp_path, monkeypatch):
    result = tmp_path / "result.json"
    with LocalCloudServer.from_traces(
        [trace(name, pattern) for name, pattern in ZONES.items()],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=2.0),
    ) as server:
        for name, value in client_environ(server.url, tmp_path / "cloud").items():
            monkeypatch.setenv(name, value)
        hook = SpotHook("local", {"url": server.url})
        provider = hook.get_provider()
        spec = JobSpec(
            job_id="trig-handover",
            command=(sys.executable, str(STEP), "300", "0.02", "1.5", str(result)),
            checkpoint_uri=(tmp_path / "ckpt").as_uri(),
            pools=provider.pools(),
        )
        controller = hook.controller(SpotSettings.build(**OPTIONS))
        nxt = controller.advance(spec, controller.new_record(spec))
        while nxt.action == "watch" and (
            nxt.record.current_attempt is None or nxt.record.current_attempt.replacement is None
        ):  # the worker watches the notice and launches the replacement on it
            time.sleep(0.05)
            nxt = controller.check(spec, nxt)
        assert nxt.action == "watch" and nxt.record.current_attempt.replacement, nxt
        trigger = SpotJobTrigger(
            provider="local",
            provider_options=hook.reopen_options,
            next=nxt.to_dict(),
            checkpoint_uri=spec.checkpoint_uri,
            controller_options=OPTIONS,
        )
        path, kwargs = trigger.serialize()  # as the triggerer gets it
        module, _, name = path.rpartition(".")
        event = _run(getattr(importlib.import_module(module), name)(**kwargs))
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)
    assert event["status"] == "ended", event
    record = Next.from_dict(event["next"]).record
    old, new = record.attempts[0], record.attempts[1]
    # one event for both attempts: the replacement was adopted and watched in the trigger
    assert old.outcome is Outcome.PREEMPTED and new.outcome is Outcome.SUCCEEDED
    assert new.started_at < old.ended_at and old.replacement["state"] == "adopted"
    store = open_store(spec.checkpoint_uri)
    emergency = [r for r in store.list() if r.attempt == old.number and "emergency" in r.metadata]
    resumed = read_resumed(store, new.number)
    assert emergency and resumed is not None and resumed.step == emergency[0].step
    assert json.loads(result.read_text())["total"] == sum(range(300))


@contextlib.contextmanager
def _cloud(tmp_path, monkeypatch) -> Iterator[LocalCloudServer]:
    """The local cloud of these tests (zone a's spot reclaimed after 3 s with a 1 s
    notice and 2 s of grace), its clients' environment set."""
    monkeypatch.delenv("SPOT_LOCAL_CLOUD_URL", raising=False)  # this test's own cloud
    with LocalCloudServer.from_traces(
        [trace(name, pattern) for name, pattern in ZONES.items()],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=2.0),
    ) as server:
        for name, value in client_environ(server.url, tmp_path / "cloud").items():
            monkeypatch.setenv(name, value)
        yield server


def _deferred(tmp_path, monkeypatch, url: str, context: dict) -> tuple[SpotJobOperator, dict]:
    """A deferrable SpotJobOperator run until it defers: the operator and the trigger row
    the triggerer reads (its class path and kwargs, through JSON as stored)."""
    # the trigger's hold on its event (see MIN_DEFER_SECONDS): a second is enough here
    monkeypatch.setattr(controller_driver, "MIN_DEFER_SECONDS", 1.0)
    result = str(tmp_path / "result.json")
    with DAG("trigger_handover", schedule=None, start_date=datetime(2026, 1, 1)):
        op = SpotJobOperator(
            task_id="train",
            command=[sys.executable, str(STEP), "300", "0.02", "1.5", result],
            checkpoint_uri=(tmp_path / "ckpt").as_uri(),
            deferrable=True,
            provider_options={"url": url},
            **OPTIONS,
        )
    with pytest.raises(TaskDeferred) as deferred:  # the worker launches, then defers
        op.execute(context)
    path, kwargs = deferred.value.trigger.serialize()
    return op, {"path": path, "kwargs": json.loads(json.dumps(kwargs))}


def _trigger(row: dict) -> SpotJobTrigger:
    module, _, name = row["path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**row["kwargs"])


def _replacement(nxt: Next | None) -> dict | None:
    running = None if nxt is None else nxt.record.current_attempt
    return None if running is None else running.replacement


def test_a_deferred_task_hands_over_in_the_trigger_without_waking_a_worker(tmp_path, monkeypatch):
    result = tmp_path / "result.json"
    with _cloud(tmp_path, monkeypatch) as server:
        store = StateStore()
        context = {"task_state_store": store, "ti": TI()}
        op, row = _deferred(tmp_path, monkeypatch, server.url, context)
        first = Next.from_dict(row["kwargs"]["next"]).record
        assert first.current_attempt is not None and first.current_attempt.replacement is None
        assert row["kwargs"]["launch"]["spec"]["command"][1] == str(STEP)  # what it relaunches
        event = asyncio.run(asyncio.wait_for(first_event(_trigger(row)), timeout=90))
        woke_at = time.time()  # the worker resumes only now, with the trigger's one event
        assert event["status"] == "ended", event
        summary = op.execute_complete(context, event)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)
    assert summary["status"] == "succeeded", summary
    record = JobRecord.from_dict(store.data[RECORD_KEY])
    old, new = record.attempts[0], record.attempts[1]
    assert old.outcome is Outcome.PREEMPTED and new.outcome is Outcome.SUCCEEDED
    # launched by the trigger's controller on the notice, before the old lease ended,
    # and adopted there: both attempts closed before the worker woke once
    assert old.replacement is not None and old.replacement["state"] == "adopted"
    assert old.notice_at is not None and old.notice_at <= old.replacement["launched_at"]
    assert old.replacement["launched_at"] < old.ended_at
    assert new.started_at < old.ended_at and new.ended_at < woke_at
    # resumed from the old attempt's emergency checkpoint, not an older one
    ckpt = open_store(op.checkpoint_uri)
    emergency = [r for r in ckpt.list() if r.attempt == old.number and "emergency" in r.metadata]
    resumed = read_resumed(ckpt, new.number)
    assert len(emergency) == 1 and resumed is not None and resumed.step == emergency[0].step
    assert new.checkpoint_step_start == emergency[0].step
    assert json.loads(result.read_text())["total"] == sum(range(300))
    # a zombie of the old attempt cannot save after the handover
    with pytest.raises(FencedOut):
        ckpt.save(301, {"state.json": b"{}"}, attempt=old.number)


def test_a_triggerer_restart_mid_handover_launches_no_second_replacement(tmp_path, monkeypatch):
    """The trigger's record lives in its memory until its event; a triggerer that restarts
    after the trigger launched the replacement resumes from the kwargs (the Next before the
    notice). It finds the launched replacement in the job's store and records it, rather
    than launching a second lease that would wait, fence and write beside the first."""
    with _cloud(tmp_path, monkeypatch) as server:
        store = StateStore()
        context = {"task_state_store": store, "ti": TI()}
        op, row = _deferred(tmp_path, monkeypatch, server.url, context)
        first = _trigger(row)

        async def until_launched() -> dict:
            task = asyncio.create_task(first_event(first))
            while _replacement(first._current) is None:
                assert not task.done(), task.result()
                await asyncio.sleep(0.05)
            task.cancel()  # the triggerer restarts: this trigger is cancelled ...
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await first.cleanup()  # ... and cleans up (the task is still deferred)
            launched = _replacement(first._current)
            assert launched is not None
            return launched

        launched = asyncio.run(asyncio.wait_for(until_launched(), timeout=60))
        # the next triggerer runs the same row
        event = asyncio.run(asyncio.wait_for(first_event(_trigger(row)), timeout=90))
        assert event["status"] == "ended", event
        summary = op.execute_complete(context, event)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)
    assert summary["status"] == "succeeded", summary
    record = JobRecord.from_dict(store.data[RECORD_KEY])
    assert len(record.attempts) == 2 and record.attempts[1].outcome is Outcome.SUCCEEDED
    assert record.attempts[1].lease_id == launched["lease"]["lease_id"]  # the first's, adopted
    assert json.loads((tmp_path / "result.json").read_text())["total"] == sum(range(300))
