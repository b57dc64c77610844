"""``SpotTaskRunner``: each task a job on spot capacity, under the controller.

It wraps Prefect's thread pool the way ``prefect_ray`` wraps Ray: the task run itself
(states, retries, caching, logs) stays in the flow's process, and the task's function
is replaced by a call that runs it as a spot job. The controller launches the function
in a fresh process on a lease, relaunches it from its latest checkpoint on another pool
(or on on-demand) when the capacity is reclaimed, and keeps the JobRecord; the future
resolves with the function's return value.

A function that declares ``checkpointer=None`` receives a ``Checkpointer`` restored
from the job's latest checkpoint; its ``maybe_save`` saves on schedule and, after an
interruption notice, saves at once and ends the attempt as a preemption.

Budgets are separate: preemptions spend the configuration's ``max_preemptions`` inside
one Prefect try of the task run (its ``run_count`` does not move); the function's own
errors fail the task run, so Prefect's ``retries`` apply to them (and a
retry resumes from the same checkpoints and the same JobRecord, kept in a keyed
artifact ``spot-record-<task run id>``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import cloudpickle
from prefect.futures import PrefectConcurrentFuture, PrefectFuture, PrefectFutureList
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from prefect_spot import _jobs, artifacts
from prefect_spot._remote import (
    CALL_KEY_ENV,
    CALL_PUBKEY_ENV,
    PUBKEY_TAG,
    CallExchange,
    Ed25519Seal,
    UntrustedObject,
    call_uri,
    new_call_key,
    wants_checkpointer,
)
from prefect_spot.blocks import (
    CheckpointStorage,
    SpotConfiguration,
    check_config_argument,
    resolve_config,
    resolve_storage,
    storage_from_uri,
)
from spot_core import jobs
from spot_core.checkpoint import open_store
from spot_core.errors import ConfigError, SpotError
from spot_core.model import JobRecord, JobStatus, Outcome
from spot_core.observer import observer_of
from spot_core.settings import TASK_RUNNER, SpotSettings, default, knobs_for, pop_aliases

logger = logging.getLogger(__name__)


class SpotJobFailed(SpotError):
    """The job ended without success for a reason other than the function's own error."""


def spot_record(future_or_task_run_id: PrefectFuture[Any] | uuid.UUID) -> JobRecord | None:
    """The JobRecord of a task run on a SpotTaskRunner, as kept in Prefect (a keyed
    artifact ``spot-record-<task run id>``, any process can read it)."""
    task_run_id = getattr(future_or_task_run_id, "task_run_id", future_or_task_run_id)
    return artifacts.load_record(artifacts.record_key(task_run_id))


class SpotTaskRunner(TaskRunner[PrefectConcurrentFuture[Any]]):
    """Runs tasks as spot jobs; see the module docstring.

    Args:
        config: a ``SpotConfiguration``, the name of a saved one, or None for defaults.
        checkpoint_storage: a ``CheckpointStorage``, a saved block's name, or a store
            URI; each task run gets a folder under it (default: a folder in ``workdir``).
        spot_tag: if set, only tasks with this tag run on spot; others run in threads here.
        checkpoint_every / checkpoint_every_steps: the Checkpointer's schedule
            (``checkpoint_every``: seconds, a timedelta or "5m"; knobs of
            ``spot_core.settings``).
        workdir: where the local cloud and (without ``checkpoint_storage``) the jobs'
            checkpoints and call payloads go. The call, its result and its error are
            exchanged through the job's checkpoint store (under ``<job uri>/call``),
            each object signed by its writer: with a per-call HMAC key that only this
            process and its local lease hold, or, on EC2, with Ed25519 keys whose public
            halves travel in user-data (the runner's) and in a tag on the lease's own
            instance (the lease's); see ``prefect_spot._remote``.
        max_workers: how many tasks run (and hold leases) at once.
    """

    def __init__(
        self,
        config: SpotConfiguration | str | None = None,
        *,
        checkpoint_storage: CheckpointStorage | str | None = None,
        spot_tag: str | None = None,
        checkpoint_every: float | str | None = default("checkpoint_every"),
        checkpoint_every_steps: int | None = default("checkpoint_every_steps"),
        workdir: str | Path | None = None,
        max_workers: int | None = None,
        **deprecated: Any,
    ) -> None:
        given = locals()  # first: the knobs as written (the settings model checks them)
        super().__init__()
        renamed = pop_aliases(deprecated, where="SpotTaskRunner")
        if deprecated:
            raise TypeError(f"SpotTaskRunner got unexpected argument(s) {sorted(deprecated)}")
        check_runner_arguments(config, checkpoint_storage, spot_tag, max_workers)
        schedule = SpotSettings.build(
            where="SpotTaskRunner",
            **{**{k.name: given[k.name] for k in knobs_for(TASK_RUNNER)}, **renamed},
        )
        self.config = config
        self.checkpoint_storage = checkpoint_storage
        self.spot_tag = spot_tag
        self.checkpoint_every = schedule.checkpoint_every_seconds
        self.checkpoint_every_steps = schedule.checkpoint_every_steps
        self.workdir = None if workdir is None else str(workdir)
        self.max_workers = max_workers
        self._threads: ThreadPoolTaskRunner[Any] = ThreadPoolTaskRunner(max_workers=max_workers)
        self._provider = None
        self._provider_lock = threading.Lock()
        self._resolved: tuple[SpotConfiguration, CheckpointStorage | None] | None = None
        self._own_workdir: tempfile.TemporaryDirectory | None = None

    def duplicate(self) -> SpotTaskRunner:
        return type(self)(
            self.config,
            checkpoint_storage=self.checkpoint_storage,
            spot_tag=self.spot_tag,
            checkpoint_every=self.checkpoint_every,
            checkpoint_every_steps=self.checkpoint_every_steps,
            workdir=self.workdir,
            max_workers=self.max_workers,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpotTaskRunner) and self._settings() == other._settings()

    def _settings(self) -> tuple:
        return (
            self.config,
            self.checkpoint_storage,
            self.spot_tag,
            self.checkpoint_every,
            self.checkpoint_every_steps,
            self.workdir,
            self.max_workers,
        )

    def __getstate__(self) -> dict[str, Any]:
        # Runners are cloudpickled when a flow run goes to a subprocess: ship the
        # configuration, not the lock, the provider or the scratch folder.
        state = self.__dict__.copy()
        for name in ("_provider_lock", "_provider", "_own_workdir", "_resolved"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._provider_lock = threading.Lock()
        self._provider = self._resolved = self._own_workdir = None

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> SpotTaskRunner:
        super().__enter__()
        self._threads.__enter__()
        if self.workdir is None:
            self._own_workdir = tempfile.TemporaryDirectory(prefix="spot-task-runner-")
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            self._threads.__exit__(exc_type, exc_value, traceback)
        finally:
            with self._provider_lock:
                provider, self._provider = self._provider, None
            if provider is not None:
                provider.close()  # terminates every lease it launched
            if self._own_workdir is not None:
                self._own_workdir.cleanup()
                self._own_workdir = None
            super().__exit__(exc_type, exc_value, traceback)

    @property
    def _root(self) -> Path:
        if self.workdir is not None:
            return Path(self.workdir)
        if self._own_workdir is None:  # made when the runner starts
            raise RuntimeError("SpotTaskRunner has no workdir before it is started")
        return Path(self._own_workdir.name)

    def _resolve(self) -> tuple[SpotConfiguration, CheckpointStorage | None]:
        if self._resolved is None:
            self._resolved = (resolve_config(self.config), resolve_storage(self.checkpoint_storage))
        return self._resolved

    def provider(self):
        """The provider, opened on first use (a cloud replaying a trace starts then)."""
        with self._provider_lock:
            if self._provider is None:
                config, _ = self._resolve()
                self._provider = _jobs.open_configured_provider(
                    config, workdir=str(self._root / "cloud")
                )
            return self._provider

    # -- submission ---------------------------------------------------------------------------
    def submit(
        self,
        task,
        parameters: dict[str, Any],
        wait_for: Iterable[PrefectFuture[Any]] | None = None,
        dependencies: dict[str, set[Any]] | None = None,
    ) -> PrefectConcurrentFuture[Any]:
        if not self._started:
            raise RuntimeError("The task runner must be started before submitting work.")
        if self.spot_tag is None or self.spot_tag in task.tags:
            task = self._on_spot(task)
        return self._threads.submit(task, parameters, wait_for, dependencies)

    def map(
        self,
        task,
        parameters: dict[str, Any],
        wait_for: Iterable[PrefectFuture[Any]] | None = None,
    ) -> PrefectFutureList[PrefectConcurrentFuture[Any]]:
        return super().map(task, parameters, wait_for)

    def _on_spot(self, task):
        """A copy of ``task`` whose function runs as a spot job."""
        fn = task.fn
        runner = self

        @functools.wraps(fn)
        def run_on_spot(*args: Any, **kwargs: Any) -> Any:
            return runner._run_job(task, fn, args, kwargs)

        run_on_spot.__signature__ = inspect.signature(fn)
        spot = copy.copy(task)
        spot.fn = run_on_spot
        spot.isasync = False
        return spot

    def _run_job(self, task, fn, args: tuple, kwargs: dict) -> Any:
        """Run ``fn(*args, **kwargs)`` as a spot job: its call through the job's store,
        driven by the controller in this one Prefect try, its result read back."""
        from prefect.context import TaskRunContext

        context = TaskRunContext.get()
        if context is None:  # the wrapper runs as the body of a Prefect task run
            raise RuntimeError("a spot task runs inside a Prefect task run")
        task_run = context.task_run
        config, storage = self._resolve()
        plugin = jobs.provider_plugin(config.provider)
        check_key_channel(config.provider)
        _jobs.check_store_for(
            config.provider,
            None if storage is None else storage.uri,
            "checkpoint_storage",
            config.provider_options,
        )
        job_id = jobs.job_id(f"{_jobs.slug(task.name, 30)}-{task_run.id.hex[-8:]}")
        checkpoint_uri, store_options = self._store(job_id, config, storage)
        # The call goes through the job's object store, not a local folder, so a lease on
        # another machine (an EC2 instance) reads it and writes its result back there.
        # Every object in it is signed by its writer and verified before it is unpickled.
        signer, key_env = _call_keys(plugin)
        exchange = CallExchange.open(call_uri(checkpoint_uri), signer, **store_options)
        exchange.put_payload(_pickle_call(fn, args, kwargs, self._checkpointer_kwargs()))
        record = self._record_for_try(task_run.id)
        provider = self.provider()
        spec = _jobs.job_spec(
            config,
            provider,
            job_id=job_id,
            checkpoint_uri=checkpoint_uri,
            command=(
                plugin.lease_python(config.provider_options),
                "-m",
                "prefect_spot._remote",
                exchange.uri,
            ),
            env={**self._lease_env(plugin), **key_env},
            created_at=None if record is None else record.created_at,
        )
        controller = self._controller(task_run, config, provider, record, storage, store_options)
        record = self._drive(controller, spec, record, provider)
        artifacts.publish(
            record,
            flow_run_id=task_run.flow_run_id,
            task_run_id=task_run.id,
            what=f"task run {task_run.name} on spot",
        )
        if _remote_lease(plugin):
            exchange = _verifying_with_lease_key(provider, record, exchange)
        return _result(record, exchange)

    def _store(
        self, job_id: str, config: SpotConfiguration, storage: CheckpointStorage | None
    ) -> tuple[str, dict[str, Any]]:
        """The job's store URI and the options (credentials included) that open it: under
        the CheckpointStorage, else a folder in ``workdir``."""
        if storage is None:
            return (self._root / "jobs" / job_id / "checkpoints").resolve().as_uri(), {}
        options: dict[str, Any] = dict(storage.options)
        # The storage's credentials, else the configuration's (one account, usually).
        options["session"] = storage.aws_session() or config.aws_session()
        return storage.job_uri(job_id), options

    @staticmethod
    def _controller(
        task_run: Any,
        config: SpotConfiguration,
        provider: Any,
        record: JobRecord | None,
        storage: CheckpointStorage | None,
        store_options: dict[str, Any],
    ) -> Any:
        """The job's controller: the record kept in a keyed artifact, a user failure
        counted against Prefect's retries, the task run's events and progress."""
        key = artifacts.record_key(task_run.id)
        ids = {"flow_run_id": task_run.flow_run_id, "task_run_id": task_run.id}
        return _jobs.controller_for(
            config,
            provider,
            max_user_retries=0 if record is None else record.user_failures,
            persist=lambda r: artifacts.save_record(key, r, **ids),
            related=[
                {
                    "prefect.resource.id": f"prefect.task-run.{task_run.id}",
                    "prefect.resource.role": "task-run",
                }
            ],
            progress=artifacts.JobProgress(**ids),
            stores=None if storage is None else functools.partial(open_store, **store_options),
        )

    @staticmethod
    def _drive(controller: Any, spec: Any, record: JobRecord | None, provider: Any) -> JobRecord:
        """The job driven here: preemptions are relaunched inside this one Prefect try
        (they never spend the task's retries); an exception (the flow cancelled, the
        process interrupted) stops the running attempt. Every spot task of this runner is
        watched through one shared observer: a mapped sweep's leases are described
        together, once per poll."""
        if record is not None and record.current_attempt is not None:
            # A lease an earlier process launched answers to that process's key, which died
            # with it: its result could never verify. Stop it; the next attempt resumes
            # from the checkpoints under this call's key.
            record = controller.stop(
                spec, record, "stopped: launched by a runner process that is gone"
            )
        return controller.run(spec, record, observer=observer_of(provider))

    @staticmethod
    def _lease_env(plugin: Any) -> dict[str, str]:
        """A lease on this machine imports what this process imports; a remote one has
        its own Python and packages (this machine's paths mean nothing there)."""
        if _remote_lease(plugin):
            return {}
        return {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    def _record_for_try(self, task_run_id: uuid.UUID) -> JobRecord | None:
        """The record of an earlier try of this task run (a Prefect retry), reopened."""
        record = spot_record(task_run_id)
        if record is None or record.status is not JobStatus.FAILED:
            return record
        return record.with_status(JobStatus.RUNNING)

    def _checkpointer_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.checkpoint_every is not None:
            kwargs["every_seconds"] = self.checkpoint_every
        if self.checkpoint_every_steps is not None:
            kwargs["every_steps"] = self.checkpoint_every_steps
        return kwargs


def check_runner_arguments(config: Any, storage: Any, spot_tag: Any, max_workers: Any) -> None:
    """SpotTaskRunner's own arguments, checked where they are written (one line each)."""
    check_config_argument(config, "SpotTaskRunner")
    storage_from_uri(storage, "SpotTaskRunner")
    if spot_tag is not None and (not isinstance(spot_tag, str) or not spot_tag.strip()):
        raise ConfigError(
            f"SpotTaskRunner spot_tag={spot_tag!r} must be a tag name (tasks "
            "with it run on spot) or None (every task runs on spot)"
        )
    if max_workers is not None and (
        isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
    ):
        raise ConfigError(
            f"SpotTaskRunner max_workers={max_workers!r} must be a whole number "
            ">= 1 (tasks holding leases at once) or None for the default"
        )


def _remote_lease(plugin: Any) -> bool:
    """Whether the provider's leases run on other machines than this one."""
    return jobs.Capability.ON_THIS_MACHINE not in plugin.capabilities


def check_key_channel(provider: str) -> None:
    """Refuse a provider whose leases have no safe way to authenticate the call.

    A lease on this machine gets the HMAC key in its process environment; a remote lease
    needs no secret (Ed25519: public keys in its environment, and on its own capacity: a
    tag on its instance, an annotation on its pod, ``LEASE_TAGS``). A provider with
    neither has no channel until it declares one."""
    plugin = jobs.provider_plugin(provider)
    if _remote_lease(plugin) and jobs.Capability.LEASE_TAGS not in plugin.capabilities:
        raise ConfigError(
            f"SpotTaskRunner cannot run tasks on provider {provider!r}: its leases are "
            "remote and publish no value of their own (capability lease_tags), so nothing "
            "can authenticate the pickled call and its result; use a provider that has one "
            "(`spot-pipelines providers`), or run the flow on the spot worker with spot_task"
        )


def _call_keys(plugin: Any) -> tuple[Any, dict[str, str]]:
    """(what signs the payload, what the lease's environment gets to verify it).

    On this machine: a per-call HMAC key, in the lease's process environment. Remote: a
    per-call Ed25519 private key kept in this process's memory; only its public half goes
    to the lease (user-data is readable with DescribeInstanceAttribute, so no secret may)."""
    if not _remote_lease(plugin):
        key = new_call_key()
        return key, {CALL_KEY_ENV: key.hex()}
    signer = Ed25519Seal.generate()
    return signer, {CALL_PUBKEY_ENV: signer.public_hex()}


def _verifying_with_lease_key(provider, record: JobRecord, exchange: CallExchange) -> CallExchange:
    """The exchange reading the last attempt's result or error with the public key its
    lease published on its own instance (tag ``spot-pipelines/call-pubkey``), which only
    that instance could set: a result another node wrote cannot verify."""
    last = record.attempts[-1] if record.attempts else None
    if last is None or last.outcome not in (Outcome.SUCCEEDED, Outcome.USER_FAILED):
        return exchange  # nothing will be read
    public = provider.instance_tag(last.pool.region, last.lease_id, PUBKEY_TAG)
    if public is None:
        raise UntrustedObject(
            f"attempt {last.number}'s instance {last.lease_id} published no {PUBKEY_TAG} "
            f"tag: its result or error under {exchange.uri} is refused unread; let the "
            "instance role tag its own instance (docs/aws-iam-policy.json, InstancePolicy) "
            "or the step pod annotate its own pod (deploy/kubernetes/rbac.yaml)"
        )
    try:
        verifier = Ed25519Seal.from_public_hex(public, f"tag {PUBKEY_TAG} of {last.lease_id}")
    except ConfigError as exc:
        raise UntrustedObject(f"{exc}; its result is refused unread") from None
    return exchange.verifying_with(verifier)


def _pickle_call(fn, args: tuple, kwargs: dict, checkpointer: dict[str, Any]) -> bytes:
    """Pickle the call; functions of modules a fresh interpreter cannot import go by value."""
    module = sys.modules.get(fn.__module__)
    by_value = module is not None and _needs_pickle_by_value(module)
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        if wants_checkpointer(fn):
            bound = inspect.signature(fn).bind_partial(*args, **kwargs)
            bound.arguments.pop("checkpointer", None)
            args, kwargs = bound.args, bound.kwargs
        return cloudpickle.dumps(
            {"fn": fn, "args": args, "kwargs": kwargs, "checkpointer": checkpointer}
        )
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def _needs_pickle_by_value(module) -> bool:
    name = module.__name__
    if name == "__main__":
        return True
    top = name.split(".")[0]
    if top in ("spot_core", "prefect_spot", "prefect"):
        return False
    path = getattr(module, "__file__", None) or ""
    return "site-packages" not in path and name not in sys.stdlib_module_names


def _result(record: JobRecord, exchange: CallExchange) -> Any:
    """The call's value (or its error, raised), then its objects deleted from the store."""
    value = _outcome(record, exchange)
    try:
        exchange.clear(a.number for a in record.attempts)
    except Exception as exc:  # noqa: BLE001 - leftovers cost storage, not the result
        logger.warning("could not delete the call objects under %s: %s", exchange.uri, exc)
    return value


def _outcome(record: JobRecord, exchange: CallExchange) -> Any:
    last = record.attempts[-1] if record.attempts else None
    if record.status is JobStatus.SUCCEEDED and last is not None:
        try:
            return exchange.result(last.number)
        except FileNotFoundError:
            raise SpotJobFailed(
                f"spot job {record.job_id} succeeded but attempt {last.number} "
                f"wrote no result to {exchange.uri}"
            ) from None
    report = None
    if last is not None and last.outcome is Outcome.USER_FAILED:
        report = exchange.error(last.number)
    if report is not None:
        if report["error"] is not None:
            raise report["error"]
        raise SpotJobFailed(f"the task failed on spot capacity:\n{report['traceback']}")
    raise SpotJobFailed(
        f"spot job {record.job_id} ended {record.status} after "
        f"{len(record.attempts)} attempt(s): "
        f"{last.message if last is not None else 'no attempt ran'}"
    )
