"""spot_task in place: a notice saves, the attempt ends as a preemption, and the retry
resumes; preemptions never consume the task's own retries."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from prefect import flow

from prefect_spot import spot_task
from prefect_spot.tasks import preemptions_of, record_of
from spot_core.checkpoint import open_store
from spot_core.errors import ConfigError, Preempted
from spot_core.model import Outcome


def _notice_once(flag: Path) -> bool:
    """True the first time: the moment this run 'receives' its interruption notice."""
    if flag.exists():
        return False
    flag.write_text("noticed")
    return True


def test_notice_saves_and_the_retry_resumes_without_using_user_retries(prefect_api, tmp_path):
    seen: list[int | None] = []

    @spot_task(
        retries=0,
        max_preemptions=2,
        checkpoint_storage=tmp_path.as_uri(),
        checkpoint_every_steps=1000,
    )
    def train(total: int, checkpointer) -> int:
        from prefect.context import TaskRunContext

        seen.append(checkpointer.start_step)
        for step in range(checkpointer.start_step, total):
            if step == 57 and _notice_once(tmp_path / "flag"):
                os.kill(os.getpid(), signal.SIGTERM)  # what the spot watcher forwards
            checkpointer.maybe_save(step + 1, lambda n=step + 1: {"step": str(n).encode()})
        train.last_run = TaskRunContext.get().task_run.id
        return total

    @flow
    def pipeline() -> int:
        return train(100)

    assert pipeline() == 100
    assert seen == [0, 58]  # the emergency checkpoint at step 58 was resumed from
    assert preemptions_of(train.last_run) == 1
    record = record_of(train.last_run)
    assert [a.outcome for a in record.attempts] == [Outcome.PREEMPTED, Outcome.SUCCEEDED]
    assert record.user_failures == 0 and record.attempts[1].checkpoint_step_start == 58
    stores = list(tmp_path.glob("*-train-*"))
    assert len(stores) == 1
    ref = open_store(stores[0].as_uri()).latest()
    assert ref.step == 58 and ref.metadata["emergency"].startswith("received SIGTERM")


def test_notice_file_saves_and_leaves_recovery_to_the_worker(prefect_api, tmp_path, monkeypatch):
    """The spot watcher's notice file means this node is going away: the task saves an
    emergency checkpoint and ends as preempted without retrying here (the spot worker
    reschedules the flow run elsewhere)."""
    notice = tmp_path / "notice.json"
    monkeypatch.setenv("SPOT_NOTICE_FILE", str(notice))
    starts: list[int] = []

    @spot_task(max_preemptions=3, checkpoint_storage=tmp_path.as_uri())
    def work(checkpointer) -> str:
        starts.append(checkpointer.start_step)
        for step in range(checkpointer.start_step, 40):
            if step == 10:
                notice.write_text('{"event": "interruption"}')
            checkpointer.maybe_save(step + 1, lambda: {"s": b"x"})
        return "done"

    @flow
    def pipeline():
        return work()

    with pytest.raises(Preempted, match="state saved at step 11"):
        pipeline()
    assert starts == [0]
    (store,) = tmp_path.glob("*-work-*")
    assert open_store(store.as_uri()).latest().step == 11


def test_user_errors_use_retries_and_preemption_budget_is_separate(prefect_api, tmp_path):
    calls: list[str] = []

    @spot_task(retries=1, max_preemptions=1, checkpoint_storage=tmp_path.as_uri())
    def flaky(checkpointer) -> str:
        calls.append("call")
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            checkpointer.maybe_save(1, lambda: {"s": b"1"})
        if len(calls) == 2:
            raise RuntimeError("the step's own bug")
        return "ok"

    @spot_task(retries=0, max_preemptions=3, checkpoint_storage=tmp_path.as_uri())
    def broken(checkpointer) -> str:
        calls.append("broken")
        raise RuntimeError("always broken")

    @flow
    def pipeline():
        return flaky(), broken(return_state=True)

    ok, state = pipeline()
    assert ok == "ok"  # preempted once, failed once (its one retry), then succeeded
    assert calls.count("call") == 3
    assert state.is_failed() and calls.count("broken") == 1  # preemption budget unused


def test_spot_task_needs_a_checkpointer_parameter():
    with pytest.raises(ConfigError, match="needs a `checkpointer` parameter"):

        @spot_task
        def no_checkpointer(x: int) -> int:
            return x

    with pytest.raises(ConfigError, match="max_preemptions"):
        spot_task(max_preemptions=-1)
