"""``@task.spot``: run a Python callable in place, on a worker that itself runs on spot.

The callable receives a ``Checkpointer`` already restored from the job's newest
checkpoint (``checkpointer`` and ``restored`` keyword arguments, if its signature
takes them). While it runs, an interruption watcher polls the node's metadata service
(or SIGTERM); on a notice the checkpointer's next ``maybe_save`` writes an emergency
checkpoint and raises ``Preempted``.

It is a thin driver of the controller through ``spot_core.jobs.InPlaceAttempt`` (the same
in-place attempt as Prefect's ``spot_task``): it opens each attempt on the worker this
call runs on, closes it (classified, billed, recorded) when the call ends, and the
JobRecord lives in the task state store.

Budgets. A preemption does not spend an Airflow try: the task raises
``AirflowRescheduleException`` and goes ``up_for_reschedule``, which Airflow 3.3 re-queues
(on any worker) with the same ``try_number``. ``max_preemptions`` bounds these reruns;
past it a preemption fails the try like any error, and Airflow's ``retries`` apply. A
failure of the callable's own code spends a try. A worker killed without notice fails
its try (Airflow's supervisor decides that); the next try closes the vanished attempt as
preempted and resumes from the last periodic checkpoint.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import DecoratedOperator, task_decorator_factory
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowRescheduleException,
)

from airflow_spot.hooks.connections import aws_access, check_conn_id
from airflow_spot.records import TASK_RECORD_KEY, persister, stored_record
from spot_core.checkpoint.uri import parse_store_uri
from spot_core.errors import ConfigError, Preempted
from spot_core.jobs import InPlaceAttempt, job_id
from spot_core.model import JobRecord
from spot_core.settings import DECORATOR, SpotSettings, default, knobs_for, pop_aliases

if TYPE_CHECKING:
    from spot_core.adaptors.aws import AwsAccess

RECORD_KEY = TASK_RECORD_KEY
# How soon a preempted task is re-queued: long enough for Airflow to see it go.
RESCHEDULE_DELAY_SECONDS = 1.0


class SpotTaskPreempted(AirflowException):
    """Preempted past ``max_preemptions``: the state is saved; Airflow's retries apply."""

    retryable = True


class _SpotDecoratedOperator(DecoratedOperator, PythonOperator):
    """Runs the callable with a restored Checkpointer under an interruption watcher."""

    template_fields: Sequence[str] = (
        "templates_dict",
        "op_args",
        "op_kwargs",
        "checkpoint_uri",
        "metadata_endpoint",
    )
    template_fields_renderers = {"templates_dict": "json", "op_args": "py", "op_kwargs": "py"}
    custom_operator_name = "@task.spot"

    def __init__(
        self,
        *,
        python_callable: Callable,
        op_args,
        op_kwargs,
        checkpoint_uri: str,
        cloud: str = default("cloud"),
        metadata_endpoint: str | None = None,
        checkpoint_every: float | str | None = default("checkpoint_every"),
        checkpoint_every_steps: int | None = default("checkpoint_every_steps"),
        keep_checkpoints: int = default("keep_checkpoints"),
        notice_poll_interval: float | str = default("notice_poll_interval"),
        max_preemptions: int = default("max_preemptions"),
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        given = locals()  # first: the knobs as written (the settings model checks them)
        # No ``retries`` default from max_preemptions: preemptions reschedule without a try.
        check_conn_id(aws_conn_id, "aws_conn_id", kwargs.get("task_id", "@task.spot"))
        renamed = pop_aliases(kwargs, where=kwargs.get("task_id", ""))
        super().__init__(
            kwargs_to_upstream={
                "python_callable": python_callable,
                "op_args": op_args,
                "op_kwargs": op_kwargs,
            },
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            **kwargs,
        )
        self.checkpoint_uri = checkpoint_uri
        self.metadata_endpoint = metadata_endpoint
        self.aws_conn_id = aws_conn_id
        self._aws: AwsAccess | None = (
            None  # the AWS connection's access, resolved on the worker when used
        )
        self._validate()
        self.settings = self._settings(
            {**{k.name: given[k.name] for k in knobs_for(DECORATOR)}, **renamed}
        )
        self.cloud = self.settings.cloud
        self.checkpoint_every = self.settings.checkpoint_every_seconds
        self.checkpoint_every_steps = self.settings.checkpoint_every_steps
        self.keep_checkpoints = self.settings.keep_checkpoints
        self.notice_poll_interval = self.settings.notice_poll_interval_seconds
        self.max_preemptions = self.settings.max_preemptions

    def _settings(self, values: dict[str, Any]) -> SpotSettings:
        """The decorator's knobs checked by the settings model (one line naming the task)."""
        try:
            return SpotSettings.build(where=self.task_id, **values)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    def _validate(self, error: type[Exception] = ValueError) -> None:
        """checkpoint_uri and metadata_endpoint, by the store's own URI check; a templated
        value is checked as rendered (``error``: ValueError at parse time, a failure
        without retries at run time)."""
        uri = self.checkpoint_uri
        if not (isinstance(uri, str) and "{{" in uri):
            try:
                parse_store_uri(uri)
            except ConfigError as exc:
                raise error(f"{self.task_id}: checkpoint_uri: {exc}") from None
            if not str(uri).startswith(("file://", "s3://")):
                raise error(
                    f"{self.task_id}: checkpoint_uri={uri!r} must start with file:// "
                    "or s3://, e.g. file:///data/checkpoints/etl"
                )
        endpoint = self.metadata_endpoint
        if endpoint is not None and not (
            isinstance(endpoint, str)
            and ("{{" in endpoint or endpoint.startswith(("http://", "https://")))
        ):
            raise error(
                f"{self.task_id}: metadata_endpoint={endpoint!r} must be an http:// "
                "URL (e.g. http://169.254.169.254) or None for the cloud's own"
            )

    # -- the record in the task state store, the attempt through the controller ---------------
    def _open_store(self, uri: str):
        """The task's store, reached with the AWS connection (boto3's chain without one)."""
        from spot_core.checkpoint import open_store

        if self.aws_conn_id is None:
            return open_store(uri)
        if self._aws is None:
            self._aws = aws_access(self.aws_conn_id)
        return open_store(uri, session=self._aws)

    def _attempt(self, context) -> InPlaceAttempt:
        """This call as an attempt of the task's job (its record in the task state store)."""
        ti = context["ti"]
        index = getattr(ti, "map_index", -1)
        return InPlaceAttempt(
            self.settings,
            job_id=job_id(
                ti.dag_id, ti.task_id, None if index is None or index < 0 else index, ti.run_id
            ),
            checkpoint_uri=self.checkpoint_uri,
            stores=self._open_store,
            persist=persister(context, RECORD_KEY),
            cloud=self.cloud,
        )

    # -- execution ------------------------------------------------------------------------------
    def execute(self, context) -> Any:
        self._validate(AirflowFailException)  # templated fields as rendered for this run
        attempt = self._attempt(context)
        record = attempt.open(stored_record(context, RECORD_KEY, self.task_id))
        checkpointer = attempt.checkpointer()
        restored = checkpointer.restore()
        lease = attempt.lease
        if lease is None:  # never: open() set it, checkpointer() needs it
            raise ValueError("InPlaceAttempt.open() first")
        self.log.info(
            "attempt %d starts from checkpoint step %s (%d preemption(s) so far, try %s)",
            lease.attempt,
            None if restored is None else restored[0],
            record.preemptions,
            context["ti"].try_number,
        )
        self._inject(checkpointer, restored)
        watcher = attempt.watch_notices(
            checkpointer, cloud=self.cloud, endpoint=self.metadata_endpoint
        )
        try:
            result = super().execute(context)
        except Preempted as exc:
            self._rerun_elsewhere(attempt.preempted(exc), exc)
        except BaseException as exc:
            attempt.failed(exc)
            raise
        finally:
            watcher.close()
            checkpointer.close()
        context["ti"].xcom_push(key=RECORD_KEY, value=attempt.succeeded().summary())
        return result

    def _rerun_elsewhere(self, record: JobRecord, exc: Preempted) -> None:
        """Within the preemption budget: reschedule (same try number, another worker);
        past it: fail the try, so Airflow's own retries decide."""
        step = record.latest_checkpoint and record.latest_checkpoint.step
        if record.preemptions <= self.max_preemptions:
            self.log.warning(
                "preemption %d of %d: rescheduled without spending a try; the "
                "rerun resumes from checkpoint step %s",
                record.preemptions,
                self.max_preemptions,
                step,
            )
            raise AirflowRescheduleException(
                datetime.now(UTC) + timedelta(seconds=RESCHEDULE_DELAY_SECONDS)
            ) from exc
        raise SpotTaskPreempted(
            f"{exc}; preemption {record.preemptions} is past "
            f"max_preemptions={self.max_preemptions}: the try fails and "
            f"Airflow's retries apply (checkpoint step {step} is kept)"
        ) from exc

    def _inject(self, checkpointer, restored) -> None:
        parameters = inspect.signature(self.python_callable).parameters
        accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        for name, value in (("checkpointer", checkpointer), ("restored", restored)):
            if accepts_any or name in parameters:
                self.op_kwargs = {**self.op_kwargs, name: value}


def spot_task(
    python_callable: Callable | None = None, multiple_outputs: bool | None = None, **kwargs: Any
):
    """``@task.spot(checkpoint_uri=...)``: run the callable in place with checkpoints and notices.

    :param checkpoint_uri: ``file://`` or ``s3://`` store for this task's checkpoints.
    :param cloud: notice source: ``auto`` (probe), ``aws``, ``gcp``, ``azure`` or ``signal``.
    :param metadata_endpoint: metadata service URL (default: the cloud's own).
    :param checkpoint_every / checkpoint_every_steps: periodic checkpoint schedule
        (``checkpoint_every`` takes seconds, a ``timedelta`` or ``"5m"``).
    :param keep_checkpoints: checkpoints kept in the store.
    :param notice_poll_interval: how often the metadata service is polled for a notice.
    :param max_preemptions: preemptions rerun (rescheduled) without spending an Airflow try;
        past it a preemption fails the try and ``retries`` apply.
    :param aws_conn_id: Airflow AWS connection for an ``s3://`` checkpoint store (resolved
        through the amazon provider's hook on the worker); None: boto3's default chain.

    Defaults and checks are the knobs' in ``spot_core.settings``.
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_SpotDecoratedOperator,
        **kwargs,
    )
