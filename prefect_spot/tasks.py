"""``spot_task``: a Prefect task that checkpoints, and survives interruption notices, in place.

For tasks that run on spot workers (a flow run launched by the ``spot`` worker, or any
process on spot capacity)::

    @spot_task(retries=1, max_preemptions=3, checkpoint_every="5m")
    def train(data: str, checkpointer) -> dict:
        restored = checkpointer.restore()            # the latest checkpoint, or None
        for step in range(checkpointer.start_step, total):
            ...
            checkpointer.maybe_save(step + 1, make_payload)   # raises Preempted on notice

The function's ``checkpointer`` parameter is filled in (callers do not pass it) with a
Checkpointer on the job's store, already restored from its latest checkpoint. While it
runs, an interruption watcher polls the instance metadata endpoint
(``SPOT_METADATA_ENDPOINT``), the notice file (``SPOT_NOTICE_FILE``) and SIGTERM are
watched too; a notice makes the next ``maybe_save`` save an emergency checkpoint and
end the attempt as a preemption.

Budgets are separate: a preemption is retried under ``max_preemptions`` and never
consumes ``retries``; the function's own errors are retried under ``retries``. When the
capacity itself goes away, the spot worker reschedules the flow run and this task
resumes from the same store.

Where checkpoints go: ``checkpoint_storage`` (a ``CheckpointStorage``, its block name or
a URI; the task gets a folder under it keyed by flow run and task), else the store the
spot worker gives the flow run (``SPOT_CHECKPOINT_URI``).
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from spot_core.attempt_env import AttemptEnv
from spot_core.errors import ConfigError, Preempted
from spot_core.settings import SpotSettings, default, pop_aliases

from prefect_spot._jobs import slug
from prefect_spot._remote import CHECKPOINTER_PARAMETER
from prefect_spot.blocks import CheckpointStorage, resolve_storage


@dataclass
class _Tally:
    preemptions: int = 0
    user_failures: int = 0
    last: str = ""


_TALLIES: dict[uuid.UUID, _Tally] = {}
_LOCK = threading.Lock()


def preemptions_of(task_run_id: uuid.UUID) -> int:
    """How many preemptions a spot task run has survived in this process."""
    with _LOCK:
        return _TALLIES.get(task_run_id, _Tally()).preemptions


def spot_task(__fn: Callable | None = None, *, retries: int = 0,
              max_preemptions: int = default("max_preemptions"),
              checkpoint_storage: CheckpointStorage | str | None = None,
              checkpoint_every: float | str | None = default("checkpoint_every"),
              checkpoint_every_steps: int | None = default("checkpoint_every_steps"),
              notice_poll_interval: float | str = default("notice_poll_interval"),
              **task_kwargs: Any):
    """Decorate a function as a spot task (see the module docstring).

    ``max_preemptions``, ``checkpoint_every`` (seconds, a timedelta or ``"5m"``),
    ``checkpoint_every_steps`` and ``notice_poll_interval`` are knobs of
    ``spot_core.settings`` (their defaults and checks); the old names
    ``checkpoint_every_seconds`` and ``watch_poll_interval`` still work, deprecated.
    """
    renamed = pop_aliases(task_kwargs, where="spot_task")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"spot_task retries must be a whole number >= 0, got {retries!r}")
    settings = SpotSettings.build(where="spot_task", **{
        "max_preemptions": max_preemptions, "checkpoint_every": checkpoint_every,
        "checkpoint_every_steps": checkpoint_every_steps,
        "notice_poll_interval": notice_poll_interval, **renamed})
    max_preemptions = settings.max_preemptions
    if "retry_condition_fn" in task_kwargs:
        raise ConfigError("spot_task decides retries itself (preemptions under "
                          "max_preemptions, errors under retries); drop retry_condition_fn")

    def decorate(fn: Callable):
        from prefect import task

        if CHECKPOINTER_PARAMETER not in inspect.signature(fn).parameters:
            raise ConfigError(f"spot_task {fn.__name__} needs a `checkpointer` parameter; "
                              "it receives the restored Checkpointer")
        options = _Options(checkpoint_storage, settings.checkpoint_every,
                           settings.checkpoint_every_steps, settings.notice_poll_interval)
        wrapper = _wrap(fn, options)
        return task(wrapper, retries=retries + max_preemptions,
                    retry_condition_fn=_retry_condition(retries, max_preemptions),
                    **task_kwargs)

    return decorate(__fn) if __fn is not None else decorate


@dataclass(frozen=True)
class _Options:
    storage: CheckpointStorage | str | None
    every_seconds: float | None
    every_steps: int | None
    watch_poll_interval: float


def _wrap(fn: Callable, options: _Options) -> Callable:
    signature = inspect.signature(fn)
    visible = signature.replace(parameters=[p for p in signature.parameters.values()
                                            if p.name != CHECKPOINTER_PARAMETER])

    @functools.wraps(fn)
    def run_spot_task(*args: Any, **kwargs: Any) -> Any:
        from prefect.context import TaskRunContext

        context = TaskRunContext.get()
        with _checkpointer(context, options) as checkpointer:
            kwargs[CHECKPOINTER_PARAMETER] = checkpointer
            try:
                return fn(*args, **kwargs)
            except Preempted as exc:
                _count(context, "preempted", exc)
                raise
            except Exception as exc:
                _count(context, "user_failed", exc)
                raise

    run_spot_task.__signature__ = visible  # type: ignore[attr-defined]
    return run_spot_task


class _checkpointer:
    """A restored Checkpointer, with the watcher and the SIGTERM bridge around the call."""

    def __init__(self, context, options: _Options) -> None:
        from spot_core.checkpoint import Checkpointer, open_store

        env = AttemptEnv.from_environ()
        uri = _store_uri(context, options.storage, env)
        run_count = max(1, int(getattr(context.task_run, "run_count", 1) or 1))
        # Under the spot worker the attempt is the lease's (the worker fenced the store
        # for it); in place, each Prefect run of the task is the next attempt.
        attempt = env.attempt if os.environ.get("SPOT_ATTEMPT") else run_count
        store = open_store(uri)
        store.fence(attempt)
        self.checkpointer = Checkpointer(store, attempt=attempt,
                                         every_seconds=options.every_seconds,
                                         every_steps=options.every_steps,
                                         notice_file=env.notice_file)
        self._env, self._options = env, options
        self._watcher = None

    def __enter__(self):
        self.checkpointer.restore()
        if threading.current_thread() is threading.main_thread():
            # Prefect's own SIGTERM bridge would end the run without a save; for the
            # length of the call a SIGTERM is a notice instead (Prefect's is restored).
            self.checkpointer.attach_signals((signal.SIGTERM,))
        if self._env.metadata_endpoint:
            from spot_core.interruption import InterruptionWatcher, detector_for

            detector = detector_for(self._env.cloud or "aws", self._env.metadata_endpoint)
            self._watcher = InterruptionWatcher([detector], self._options.watch_poll_interval)
            self._watcher.add_handler(self._on_notice)
            self._watcher.start()
        return self.checkpointer

    def _on_notice(self, notice) -> None:
        if notice.is_interruption:  # a rebalance recommendation is not a reason to stop
            self.checkpointer.request_emergency_save(f"{notice.cloud} {notice.kind} notice")

    def __exit__(self, *exc: object) -> None:
        if self._watcher is not None:
            self._watcher.close()
        self.checkpointer.close()


def _store_uri(context, storage, env: AttemptEnv) -> str:
    resolved = resolve_storage(storage)
    if resolved is not None:
        task_run = context.task_run
        flow_run = str(task_run.flow_run_id or task_run.id)
        key = f"{flow_run[:8]}-{slug(context.task.name, 30)}-{slug(task_run.dynamic_key, 20)}"
        return resolved.job_uri(key)
    if env.checkpoint_uri:
        return env.checkpoint_uri
    raise ConfigError("spot_task has nowhere to checkpoint: pass checkpoint_storage= (a "
                      "CheckpointStorage, its block name, or a URI) or run it under the "
                      "spot worker, which sets SPOT_CHECKPOINT_URI")


def _count(context, kind: str, exc: BaseException) -> None:
    with _LOCK:
        tally = _TALLIES.setdefault(context.task_run.id, _Tally())
        if kind == "preempted":
            tally.preemptions += 1
        else:
            tally.user_failures += 1
        tally.last = kind
    if kind == "preempted":
        _emit_preempted(context, exc)


def _emit_preempted(context, exc: BaseException) -> None:
    try:
        from prefect.events import emit_event

        emit_event(event="spot.job.preempted",
                   resource={"prefect.resource.id": f"prefect.task-run.{context.task_run.id}",
                             "prefect.resource.name": context.task_run.name},
                   payload={"detail": str(exc)[:500], "in_place": True})
    except Exception:  # noqa: BLE001 - events never break the task
        pass


def _retry_condition(retries: int, max_preemptions: int):
    def should_retry(task, task_run, state) -> bool:
        with _LOCK:
            tally = _TALLIES.get(task_run.id, _Tally())
        if tally.last == "preempted":
            # The capacity itself is going away (the spot watcher served the notice
            # file): retrying here is pointless; the spot worker reschedules the run.
            if _capacity_going_away():
                return False
            return tally.preemptions <= max_preemptions
        return tally.user_failures <= retries

    return should_retry


def _capacity_going_away() -> bool:
    notice_file = os.environ.get("SPOT_NOTICE_FILE")
    return bool(notice_file) and os.path.exists(notice_file)
