"""``@task.spot``: run a Python callable in place, on a worker that itself runs on spot.

The callable receives a ``Checkpointer`` already restored from the job's newest
checkpoint (``checkpointer`` and ``restored`` keyword arguments, if its signature
takes them). While it runs, an interruption watcher polls the node's metadata service
(or SIGTERM); on a notice the checkpointer's next ``maybe_save`` writes an emergency
checkpoint and raises ``Preempted``, and this operator records the preemption in the
task state store and raises a retryable error, so Airflow's next try (on another
worker) resumes from that checkpoint. A worker killed without notice leaves its
attempt open in the task state store; the next try closes it as lost and resumes from
the last periodic checkpoint.

Unlike ``SpotJobOperator`` (which relaunches inside one try), the in-place decorator
cannot outlive its own node, so each preemption is one Airflow try; ``retries`` defaults
to ``max_preemptions`` so that the preemption budget is what bounds them.
"""

from __future__ import annotations

import dataclasses
import inspect
import socket
import time
from typing import Any, Callable, Sequence

from airflow.providers.common.compat.sdk import DecoratedOperator, task_decorator_factory
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk.exceptions import AirflowException

from spot_core.errors import ConfigError, Preempted
from spot_core.model import Attempt, JobRecord, Market, Outcome, Pool
from spot_core.settings import SpotSettings, default, knob, pop_aliases

RECORD_KEY = "spot_task_record"
CLOUDS = knob("cloud").allowed


class SpotTaskPreempted(AirflowException):
    """The worker's spot capacity is going away; the state is saved; retry elsewhere."""

    retryable = True


class _SpotDecoratedOperator(DecoratedOperator, PythonOperator):
    """Runs the callable with a restored Checkpointer under an interruption watcher."""

    template_fields: Sequence[str] = ("templates_dict", "op_args", "op_kwargs", "checkpoint_uri",
                                      "metadata_endpoint")
    template_fields_renderers = {"templates_dict": "json", "op_args": "py", "op_kwargs": "py"}
    custom_operator_name = "@task.spot"

    def __init__(self, *, python_callable: Callable, op_args, op_kwargs,
                 checkpoint_uri: str, cloud: str = default("cloud"),
                 metadata_endpoint: str | None = None,
                 checkpoint_every: float | str | None = default("checkpoint_every"),
                 checkpoint_every_steps: int | None = default("checkpoint_every_steps"),
                 keep_checkpoints: int = default("keep_checkpoints"),
                 notice_poll_interval: float | str = default("notice_poll_interval"),
                 max_preemptions: int = default("max_preemptions"),
                 **kwargs: Any) -> None:
        renamed = pop_aliases(kwargs, where=kwargs.get("task_id", ""))
        kwargs.setdefault("retries", renamed.get("max_preemptions", max_preemptions))
        super().__init__(kwargs_to_upstream={"python_callable": python_callable,
                                             "op_args": op_args, "op_kwargs": op_kwargs},
                         python_callable=python_callable, op_args=op_args, op_kwargs=op_kwargs,
                         **kwargs)
        self.checkpoint_uri = checkpoint_uri
        self.metadata_endpoint = metadata_endpoint
        self._validate()
        self.settings = self._settings({
            "cloud": cloud, "checkpoint_every": checkpoint_every,
            "checkpoint_every_steps": checkpoint_every_steps,
            "keep_checkpoints": keep_checkpoints, "notice_poll_interval": notice_poll_interval,
            "max_preemptions": max_preemptions, **renamed})
        self.cloud = self.settings.cloud
        self.checkpoint_every = self.settings.checkpoint_every
        self.checkpoint_every_steps = self.settings.checkpoint_every_steps
        self.keep_checkpoints = self.settings.keep_checkpoints
        self.notice_poll_interval = self.settings.notice_poll_interval
        self.max_preemptions = self.settings.max_preemptions

    def _settings(self, values: dict[str, Any]) -> SpotSettings:
        """The decorator's knobs checked by the settings model (one line naming the task)."""
        try:
            return SpotSettings.build(where=self.task_id, **values)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    def _validate(self) -> None:
        uri = self.checkpoint_uri
        if not isinstance(uri, str) or not ("{{" in uri or uri.startswith(("file://", "s3://"))):
            raise ValueError(f"{self.task_id}: checkpoint_uri={uri!r} must start with file:// or "
                             "s3://, e.g. file:///data/checkpoints/etl")

    # -- the record in the task state store ------------------------------------------------
    def _load(self, context) -> JobRecord:
        store = context.get("task_state_store")
        stored = None if store is None else store.get(RECORD_KEY)
        if stored is not None:
            return JobRecord.from_dict(stored)
        ti = context["ti"]
        return JobRecord(job_id=f"{ti.dag_id}.{ti.task_id}.{ti.run_id}", created_at=time.time(),
                         checkpoint_uri=self.checkpoint_uri)

    @staticmethod
    def _save(context, record: JobRecord) -> None:
        store = context.get("task_state_store")
        if store is not None:
            store.set(RECORD_KEY, record.to_dict())

    def _close_lost_attempt(self, record: JobRecord, checkpoints) -> JobRecord:
        """An earlier try vanished mid-run (worker killed without notice)."""
        lost = record.current_attempt
        if lost is None:
            return record
        ref = checkpoints.latest()
        saved_at = ref.created_at if ref is not None and ref.attempt == lost.number else lost.started_at
        now = time.time()
        finished = dataclasses.replace(
            lost, ended_at=now, outcome=Outcome.PREEMPTED,
            checkpoint_step_end=None if ref is None else ref.step,
            lost_work_seconds=max(0.0, now - saved_at),
            message="the worker vanished without a notice (killed or reclaimed)")
        self.log.warning("attempt %d was lost without a notice; resuming from checkpoint step %s",
                         lost.number, finished.checkpoint_step_end)
        record = record.finish_attempt(finished)
        return record if ref is None else record.with_checkpoint(ref)

    def _pool(self) -> Pool:
        return Pool(cloud=self.cloud, region="-", zone=socket.gethostname(),
                    instance_type="airflow-worker", market=Market.SPOT)

    # -- execution ------------------------------------------------------------------------------
    def execute(self, context) -> Any:
        from spot_core.checkpoint import Checkpointer, open_store

        checkpoints = open_store(self.checkpoint_uri)
        record = self._close_lost_attempt(self._load(context), checkpoints)
        number = record.next_attempt_number
        checkpoints.fence(number)
        checkpointer = Checkpointer(checkpoints, attempt=number,
                                    **self.settings.checkpointer_options())
        restored = checkpointer.restore()
        start_step = None if restored is None else restored[0]
        record = record.start_attempt(Attempt(number=number, pool=self._pool(),
                                              started_at=time.time(),
                                              checkpoint_step_start=start_step))
        self._save(context, record)
        self.log.info("attempt %d starts from checkpoint step %s (%d preemption(s) so far)",
                      number, start_step, record.preemptions)
        self._inject(checkpointer, restored)
        watcher = self._watcher(checkpointer)
        try:
            result = super().execute(context)
        except Preempted as exc:
            record = self._finish(context, record, checkpoints, Outcome.PREEMPTED, str(exc))
            raise SpotTaskPreempted(f"{exc}; preemption {record.preemptions} of "
                                    f"{self.max_preemptions}: the next try resumes from "
                                    f"checkpoint step {record.latest_checkpoint and record.latest_checkpoint.step}"
                                    ) from exc
        except BaseException as exc:
            self._finish(context, record, checkpoints, Outcome.USER_FAILED,
                         f"{type(exc).__name__}: {exc}")
            raise
        finally:
            watcher.close()
            checkpointer.close()
        record = self._finish(context, record, checkpoints, Outcome.SUCCEEDED, "")
        context["ti"].xcom_push(key=RECORD_KEY, value=record.summary())
        return result

    def _inject(self, checkpointer, restored) -> None:
        parameters = inspect.signature(self.python_callable).parameters
        accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        for name, value in (("checkpointer", checkpointer), ("restored", restored)):
            if accepts_any or name in parameters:
                self.op_kwargs = {**self.op_kwargs, name: value}

    def _watcher(self, checkpointer):
        from spot_core.interruption import InterruptionWatcher, detector_for

        detector = detector_for(self.cloud, self.metadata_endpoint)
        watcher = InterruptionWatcher([detector], poll_interval=self.notice_poll_interval)

        def on_notice(notice) -> None:
            if notice.is_interruption:
                checkpointer.request_emergency_save(f"{notice.cloud} {notice.action} notice")

        watcher.add_handler(on_notice)
        return watcher.start()

    def _finish(self, context, record: JobRecord, checkpoints, outcome: Outcome,
                message: str) -> JobRecord:
        ref = checkpoints.latest()
        now = time.time()
        running = record.current_attempt
        saved_at = ref.created_at if ref is not None and ref.attempt == running.number \
            else running.started_at
        finished = dataclasses.replace(
            running, ended_at=now, outcome=outcome, message=message[:300],
            checkpoint_step_end=None if ref is None else ref.step,
            lost_work_seconds=0.0 if outcome is Outcome.SUCCEEDED else max(0.0, now - saved_at))
        record = record.finish_attempt(finished)
        if ref is not None:
            record = record.with_checkpoint(ref)
        self._save(context, record)
        return record


def spot_task(python_callable: Callable | None = None, multiple_outputs: bool | None = None,
              **kwargs: Any):
    """``@task.spot(checkpoint_uri=...)``: run the callable in place with checkpoints and notices.

    :param checkpoint_uri: ``file://`` or ``s3://`` store for this task's checkpoints.
    :param cloud: notice source: ``auto`` (probe), ``aws``, ``gcp``, ``azure`` or ``signal``.
    :param metadata_endpoint: metadata service URL (default: the cloud's own).
    :param checkpoint_every / checkpoint_every_steps: periodic checkpoint schedule
        (``checkpoint_every`` takes seconds, a ``timedelta`` or ``"5m"``).
    :param keep_checkpoints: checkpoints kept in the store.
    :param notice_poll_interval: how often the metadata service is polled for a notice.
    :param max_preemptions: preemptions to absorb; the default for ``retries``.

    Defaults and checks are the knobs' in ``spot_core.settings``.
    """
    return task_decorator_factory(python_callable=python_callable,
                                  multiple_outputs=multiple_outputs,
                                  decorated_operator_class=_SpotDecoratedOperator, **kwargs)
