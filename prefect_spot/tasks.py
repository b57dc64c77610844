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

Budgets are separate and live in Prefect: each call of the function is an attempt that
the controller opens (``Controller.adopt`` on the worker this process runs on, an
``InPlaceProvider`` lease) and closes (``on_lease_end``: classified, billed, recorded),
and the JobRecord is kept in a keyed artifact per flow run and task
(``spot-record-<flow run>-<task>-<dynamic key>``), written before the retry decision
reads it. A preemption is retried under ``max_preemptions`` and never consumes
``retries``; the function's own errors are retried under ``retries``. When the capacity
itself goes away, the spot worker reschedules the flow run and this task resumes from
the same store and the same record.

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
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prefect_spot._jobs import slug
from prefect_spot._remote import CHECKPOINTER_PARAMETER
from prefect_spot.artifacts import (
    RECORD_TYPE,
    JobProgress,
    load_record,
    publish,
    record_key,
    save_record,
)
from prefect_spot.blocks import CheckpointStorage, resolve_storage, storage_from_uri
from prefect_spot.events import emit_job_event
from spot_core.attempt_env import AttemptEnv
from spot_core.errors import ConfigError, Preempted
from spot_core.jobs import InPlaceAttempt
from spot_core.model import JobRecord, Outcome
from spot_core.settings import SPOT_TASK, SpotSettings, default, knobs_for, pop_aliases


def record_of(task_run_id: uuid.UUID) -> JobRecord | None:
    """The JobRecord a spot task run keeps in Prefect (None before its first call)."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterTaskRunId,
        ArtifactFilterType,
    )
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                task_run_id=ArtifactFilterTaskRunId(any_=[task_run_id]),
                type=ArtifactFilterType(any_=[RECORD_TYPE]),
            ),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    # a record artifact always has its key (save_record); none: no record to read
    return None if not found or found[0].key is None else load_record(found[0].key)


def preemptions_of(task_run_id: uuid.UUID) -> int:
    """How many preemptions a spot task run has survived (read from its record)."""
    record = record_of(task_run_id)
    return 0 if record is None else record.preemptions


def spot_task(
    __fn: Callable | None = None,
    *,
    retries: int = 0,
    max_preemptions: int = default("max_preemptions"),
    checkpoint_storage: CheckpointStorage | str | None = None,
    checkpoint_every: float | str | None = default("checkpoint_every"),
    checkpoint_every_steps: int | None = default("checkpoint_every_steps"),
    notice_poll_interval: float | str = default("notice_poll_interval"),
    **task_kwargs: Any,
):
    """Decorate a function as a spot task (see the module docstring).

    ``max_preemptions``, ``checkpoint_every`` (seconds, a timedelta or ``"5m"``),
    ``checkpoint_every_steps`` and ``notice_poll_interval`` are knobs of
    ``spot_core.settings`` (their defaults and checks); the old names
    ``checkpoint_every_seconds`` and ``watch_poll_interval`` still work, deprecated.
    """
    given = locals()  # first: the knobs as written (the settings model checks them)
    renamed = pop_aliases(task_kwargs, where="spot_task")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"spot_task retries must be a whole number >= 0, got {retries!r}")
    settings = SpotSettings.build(
        where="spot_task", **{**{k.name: given[k.name] for k in knobs_for(SPOT_TASK)}, **renamed}
    )
    max_preemptions = settings.max_preemptions
    storage_from_uri(checkpoint_storage, "spot_task")  # a bad URI fails here, not at run time
    if "retry_condition_fn" in task_kwargs:
        raise ConfigError(
            "spot_task decides retries itself (preemptions under "
            "max_preemptions, errors under retries); drop retry_condition_fn"
        )

    def decorate(fn: Callable):
        from prefect import task

        if CHECKPOINTER_PARAMETER not in inspect.signature(fn).parameters:
            raise ConfigError(
                f"spot_task {fn.__name__} needs a `checkpointer` parameter; "
                "it receives the restored Checkpointer"
            )
        wrapper = _wrap(fn, settings, checkpoint_storage)
        return task(
            retries=retries + max_preemptions,
            retry_condition_fn=_retry_condition(retries, max_preemptions),
            **task_kwargs,
        )(wrapper)

    return decorate(__fn) if __fn is not None else decorate


def _wrap(
    fn: Callable, settings: SpotSettings, storage: CheckpointStorage | str | None
) -> Callable:
    signature = inspect.signature(fn)
    visible = signature.replace(
        parameters=[p for p in signature.parameters.values() if p.name != CHECKPOINTER_PARAMETER]
    )

    @functools.wraps(fn)
    def run_spot_task(*args: Any, **kwargs: Any) -> Any:
        from prefect.context import TaskRunContext

        attempt = _SpotTaskCall(TaskRunContext.get(), settings, storage)
        with attempt.checkpointed() as checkpointer:
            kwargs[CHECKPOINTER_PARAMETER] = checkpointer
            try:
                value = fn(*args, **kwargs)
            except Preempted as exc:
                attempt.ended(attempt.preempted(exc))
                if _capacity_going_away(wait=NOTICE_FILE_WAIT_SECONDS):
                    # The lease is going: under the spot worker's engine the flow run
                    # ends with no final state, and the worker reschedules it.
                    from prefect_spot._engine import relinquish

                    relinquish(exc)
                raise
            except Exception as exc:
                attempt.ended(attempt.failed(exc))
                raise
            except BaseException as exc:  # cancelled, interrupted: not the step's fault
                attempt.ended(attempt.stopped(exc))
                raise
        attempt.ended(attempt.succeeded())
        return value

    run_spot_task.__signature__ = visible  # type: ignore[attr-defined]
    return run_spot_task


class _SpotTaskCall(InPlaceAttempt):
    """One call of a spot task: ``spot_core.jobs.InPlaceAttempt`` with its record kept in
    Prefect (a keyed artifact, written before the task's retry condition reads it), the
    same ``spot.job.*`` events and progress artifact as a task runner's job, and, under
    the spot worker, the attempt number and notice file of the worker's lease."""

    def __init__(
        self, context: Any, settings: SpotSettings, storage: CheckpointStorage | str | None
    ) -> None:
        self.env = AttemptEnv.from_environ()
        task_run = context.task_run
        self.key = _record_key(context.task.name, task_run)
        self._ids = {"flow_run_id": task_run.flow_run_id, "task_run_id": task_run.id}
        self._related = [
            {
                "prefect.resource.id": f"prefect.task-run.{task_run.id}",
                "prefect.resource.role": "task-run",
            }
        ]
        self._progress = JobProgress(**self._ids)
        super().__init__(
            settings,
            job_id=self.key.removeprefix("spot-record-"),
            checkpoint_uri=_store_uri(context, storage, self.env),
            stores=_store_opener(storage),
            persist=self._save,
            listener=self._transition,
        )
        # Under the spot worker the capacity is its lease, already fenced as SPOT_ATTEMPT
        # in the same store: the attempt keeps that number.
        under_worker = bool(os.environ.get("SPOT_ATTEMPT")) and storage is None
        self.open(load_record(self.key), attempt=self.env.attempt if under_worker else None)

    def _save(self, record: JobRecord) -> None:
        save_record(self.key, record, **self._ids)

    def _transition(self, kind: str, record: JobRecord, detail: str) -> None:
        emit_job_event(kind, record, detail, related=self._related)
        self._progress(kind, record, detail)

    def ended(self, record: JobRecord) -> None:
        """Show the closed attempt on the flow run (tables, summary, chart)."""
        publish(record, **self._ids, what=f"spot task {self.spec.job_id}")

    @contextmanager
    def checkpointed(self) -> Iterator[Any]:
        """A restored Checkpointer, with the notice watcher and the SIGTERM bridge around
        the call."""
        checkpointer = self.checkpointer(notice_file=self.env.notice_file)
        watcher = None
        try:
            checkpointer.restore()
            if threading.current_thread() is threading.main_thread():
                # Prefect's own SIGTERM bridge would end the run without a save; for the
                # length of the call a SIGTERM is a notice instead (Prefect's is restored).
                checkpointer.attach_signals((signal.SIGTERM,))
            if self.env.metadata_endpoint:
                watcher = self.watch_notices(
                    checkpointer, cloud=self.env.cloud or "aws", endpoint=self.env.metadata_endpoint
                )
            yield checkpointer
        finally:
            if watcher is not None:
                watcher.close()
            checkpointer.close()


def _store_opener(storage):
    """Opens the job's store: with the storage block's options and credentials, or (under
    the spot worker, on the lease) with the machine's own (its instance role)."""
    resolved = resolve_storage(storage)
    if resolved is not None:
        return resolved.open_uri
    from spot_core.checkpoint import open_store

    return open_store


def _store_uri(context, storage, env: AttemptEnv) -> str:
    resolved = resolve_storage(storage)
    if resolved is not None:
        task_run = context.task_run
        flow_run = str(task_run.flow_run_id or task_run.id)
        key = f"{flow_run[:8]}-{slug(context.task.name, 30)}-{slug(task_run.dynamic_key, 20)}"
        return resolved.job_uri(key)
    if env.checkpoint_uri:
        return env.checkpoint_uri
    raise ConfigError(
        "spot_task has nowhere to checkpoint: pass checkpoint_storage= (a "
        "CheckpointStorage, its block name, or a URI) or run it under the "
        "spot worker, which sets SPOT_CHECKPOINT_URI"
    )


def _record_key(task_name: str, task_run) -> str:
    """One record per flow run and task call (the same across the flow run's reruns)."""
    flow_run = str(task_run.flow_run_id or task_run.id)
    return record_key(f"{flow_run}-{slug(task_name, 30)}-{slug(task_run.dynamic_key, 20)}")


def _retry_condition(retries: int, max_preemptions: int):
    def should_retry(task, task_run, state) -> bool:
        record = load_record(_record_key(task.name, task_run))
        if record is None or not record.attempts:
            return False
        last = record.attempts[-1]
        if last.outcome is Outcome.PREEMPTED:
            # The capacity itself is going away (the spot watcher served the notice
            # file): retrying here is pointless; the spot worker reschedules the run.
            if _capacity_going_away():
                return False
            return record.preemptions <= max_preemptions
        if last.outcome is Outcome.USER_FAILED:
            return record.user_failures <= retries
        return False

    return should_retry


NOTICE_FILE_WAIT_SECONDS = 3.0
"""How long a preempted task waits for the spot watcher's notice file before it counts the
notice as its own. Why wait: a node that goes down signals every process at once (an OS
shutdown, a container runtime that signals the whole group), so the step's SIGTERM can
come before the watcher has polled its own and written the file (within its
``--poll-interval``, 1 s by default); deciding at once would retry in place on a node
that is going away."""


def _capacity_going_away(wait: float = 0.0) -> bool:
    """Whether the spot watcher says this node is going away (its notice file exists);
    under a watcher, waits up to ``wait`` seconds for the file to appear."""
    notice_file = os.environ.get("SPOT_NOTICE_FILE")
    if not notice_file:
        return False
    deadline = time.monotonic() + wait
    while not os.path.exists(notice_file):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
