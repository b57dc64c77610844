"""``SpotWorker`` (type ``spot``): runs flow runs on spot capacity and recovers them.

Each flow run is one job, driven through the controller's lifecycle API (``advance`` /
``check`` / ``stop``); the worker itself never classifies, bills or closes an attempt.
The controller launches the flow run's command on a lease in the best-ranked pool (pool
diversification, a spot price cap, a preemption budget, on-demand fallback); the lease
id is the run's infrastructure id. When the capacity is reclaimed, the worker does not
leave the run ``Crashed``: it reschedules it (``AwaitingRetry``) and gives back the flow
retries the preempted runs used up, so the work pool hands it out again, the next
attempt resumes from the run's checkpoint store (``SPOT_CHECKPOINT_URI``:
``checkpoint_root``/<flow run id>) and ``@flow(retries=...)`` stays for the flow's own
errors.

With the ``handover`` setting (``on_notice`` by default where the provider can hold two
leases) the controller launches the replacement on the notice instead: it boots beside
the old attempt but does not start the flow run's engine (``prefect_spot._engine``) until
this worker says so. Once the old attempt is closed the worker keeps driving the same flow
run (no ``AwaitingRetry``, no second submission): it gives back the flow retries the old
attempt used, puts the run back to ``Pending`` (the state a fresh engine starts from, as
before any infrastructure starts), names the new lease as the run's infrastructure id and
writes the replacement's go in the job's store (``spot_core.checkpoint.handover``).

Kills: a cancelled flow run's lease is terminated (``kill_infrastructure``, and the
watching worker stops the attempt); a worker that is shut down stops the attempts it
watches; a worker that is killed outright stops renewing the job's heartbeat, and the
node's watcher ends the lease after the heartbeat timeout. A run such a worker leaves
``Running`` with its lease gone (the node handed it back on a reclaim, and nobody set
the next state) is adopted by another worker of the pool (``orphans``).

The JobRecord lives in Prefect: a keyed artifact ``spot-record-<flow run id>`` (each
save a new version, written before the controller acts on it) holds it between
attempts, so another worker can continue the job; a table artifact of the attempts and
a markdown summary are attached to the flow run.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import shlex
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from prefect.client.schemas.objects import FlowRun
from prefect.workers.base import BaseJobConfiguration, BaseVariables, BaseWorker, BaseWorkerResult
from prefect_aws import AwsCredentials
from prefect_kubernetes.credentials import KubernetesClusterConfig
from pydantic import BaseModel, Field, field_validator, model_validator

from prefect_spot import _jobs
from prefect_spot._engine import GO_MARGIN
from prefect_spot._settings import ProviderName, normalise, settings_of, spot_field
from prefect_spot.artifacts import JobProgress, load_record, publish, record_key, save_record
from prefect_spot.blocks import AWS_FIELD_HELP, BLOCK_FIELDS, CLUSTER_FIELD_HELP, SpotConfiguration
from prefect_spot.credentials import check_cluster_config, fingerprint
from prefect_spot.workers import orphans
from prefect_spot.workers.cancelling import CancellingRuns
from spot_core import batched, jobs
from spot_core.bounds import MAX_WAIT_SECONDS
from spot_core.checkpoint import parse_store_uri
from spot_core.checkpoint.handover import mark_go
from spot_core.controller import FINAL_STATUSES, pending_replacement, provider_stores
from spot_core.errors import ConfigError
from spot_core.jobs import LeaseStatus, Observation
from spot_core.model import JobRecord, JobStatus, Lease, Outcome
from spot_core.observer import SharedObserver, observer_key, shared_observer, wait_timeout
from spot_core.settings import WORKER, knobs_for

RESCHEDULE_AFTER = (
    Outcome.PREEMPTED,
    Outcome.INFRASTRUCTURE_FAILED,
    Outcome.DRAINED,
    Outcome.DISRUPTED,
)
ORPHAN_PAGE = 200
"""Running flow runs read per API call when looking for orphans."""
GO_API_SECONDS = 60.0
"""What a handover's replacement allows, past the notice's deadline and the worker's
polls, for the worker's API calls before its go (``prefect_spot._engine``)."""


def _check_store_uri(value: str | None) -> str | None:
    if value in (None, ""):
        return None
    try:
        return parse_store_uri(value).uri
    except ConfigError as exc:
        raise ValueError(f"checkpoint_root: {exc}") from exc


WORKER_FIELDS = {k.name for k in knobs_for(WORKER)}


def _check_settings(values):
    """The settings model's checks (the provider's options without touching the cloud);
    a remote provider needs an ``s3://`` checkpoint_root (its instances cannot see the
    worker's disk); a cluster block only on kubernetes, instead of kubeconfig options."""
    check_cluster_config(
        values.provider, values.provider_options, values.cluster_config, "spot worker"
    )
    settings_of(values, WORKER_FIELDS, "spot worker")
    try:
        _jobs.check_store_for(
            values.provider, values.checkpoint_root, "checkpoint_root", values.provider_options
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc
    return values


class _SpotFields:
    """Field definitions shared by the variables (the UI form) and the job configuration:
    each a knob of ``spot_core.settings`` (its default and help), plus checkpoint_root."""

    provider = spot_field("provider")
    provider_options = spot_field("provider_options")
    zones = spot_field("zones")
    instance_types = spot_field("instance_types")
    max_spot_price = spot_field("max_spot_price")
    max_preemptions = spot_field("max_preemptions")
    on_demand_fallback = spot_field("on_demand_fallback")
    return_to_spot = spot_field("return_to_spot")
    min_on_demand = spot_field("min_on_demand")
    capacity_wait = spot_field("capacity_wait")
    max_capacity_waits = spot_field("max_capacity_waits")
    max_infrastructure_retries = spot_field("max_infrastructure_retries")
    max_disruptions = spot_field("max_disruptions")
    deadline = spot_field("deadline")
    work = spot_field("work")
    total_steps = spot_field("total_steps")
    restart_overhead = spot_field("restart_overhead")
    deadline_policy = spot_field("deadline_policy")
    attempt_timeout = spot_field("attempt_timeout")
    poll_interval = spot_field("poll_interval")
    heartbeat_timeout = spot_field("heartbeat_timeout")
    heartbeat_uri = spot_field("heartbeat_uri")
    take_over = spot_field("take_over")
    handover = spot_field("handover")
    observe_failure_timeout = spot_field("observe_failure_timeout")
    alert_interruption_rate = spot_field("alert_interruption_rate")
    alert_spot_price = spot_field("alert_spot_price")
    # As prefect-aws' ECS worker: an empty block (the default) is boto3's default chain.
    aws_credentials = Field(
        default_factory=AwsCredentials,
        title="AWS Credentials",
        description=AWS_FIELD_HELP.format(
            what="EC2, SQS and the checkpoint_root store; in a "
            "deployment's job variables reference the saved block "
            '(`{"$ref": {"block_document_id": ...}}`), never its keys'
        ),
    )
    # As prefect-kubernetes' worker (its `cluster_config`): empty is the default kubeconfig.
    cluster_config = Field(
        default=None,
        title="Kubernetes Cluster Config",
        description=CLUSTER_FIELD_HELP + " In a deployment's job "
        'variables reference the saved block (`{"$ref": '
        '{"block_document_id": ...}}`), never its kubeconfig.',
    )
    checkpoint_root = Field(
        default=None,
        description="Checkpoint store (`file:///abs/path` "
        "or `s3://bucket/prefix`); each flow run gets a folder, passed "
        "to it as SPOT_CHECKPOINT_URI. Empty: a folder on the worker "
        "(local provider only; `ec2` needs `s3://`, `kubernetes` `s3://` "
        "or a path on a volume its pod_template mounts).",
    )


class _SpotValues(BaseModel):
    """The spot fields, their checks and the SpotConfiguration they make (a mixin of the
    job configuration and the variables)."""

    provider: ProviderName = _SpotFields.provider
    provider_options: dict[str, Any] = _SpotFields.provider_options
    zones: list[str] = _SpotFields.zones
    instance_types: list[str] = _SpotFields.instance_types
    max_spot_price: float | None = _SpotFields.max_spot_price
    max_preemptions: int = _SpotFields.max_preemptions
    on_demand_fallback: bool = _SpotFields.on_demand_fallback
    return_to_spot: bool = _SpotFields.return_to_spot
    min_on_demand: float = _SpotFields.min_on_demand
    capacity_wait: float = _SpotFields.capacity_wait
    max_capacity_waits: int = _SpotFields.max_capacity_waits
    max_infrastructure_retries: int = _SpotFields.max_infrastructure_retries
    max_disruptions: int = _SpotFields.max_disruptions
    deadline: float | datetime | None = _SpotFields.deadline
    work: float | None = _SpotFields.work
    total_steps: int | None = _SpotFields.total_steps
    restart_overhead: float = _SpotFields.restart_overhead
    deadline_policy: str | None = _SpotFields.deadline_policy
    attempt_timeout: float = _SpotFields.attempt_timeout
    poll_interval: float = _SpotFields.poll_interval
    heartbeat_timeout: float = _SpotFields.heartbeat_timeout
    heartbeat_uri: str | None = _SpotFields.heartbeat_uri
    take_over: bool = _SpotFields.take_over
    handover: str | None = _SpotFields.handover
    observe_failure_timeout: float = _SpotFields.observe_failure_timeout
    alert_interruption_rate: float | None = _SpotFields.alert_interruption_rate
    alert_spot_price: float | None = _SpotFields.alert_spot_price
    checkpoint_root: str | None = _SpotFields.checkpoint_root
    aws_credentials: AwsCredentials = _SpotFields.aws_credentials
    cluster_config: KubernetesClusterConfig | None = _SpotFields.cluster_config

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        return normalise(data, WORKER_FIELDS, "spot worker")

    _check_root = field_validator("checkpoint_root")(
        classmethod(lambda cls, value: _check_store_uri(value))
    )
    _check_fields = model_validator(mode="after")(lambda self: _check_settings(self))

    def spot_configuration(self) -> SpotConfiguration:
        return SpotConfiguration(
            **{name: getattr(self, name) for name in BLOCK_FIELDS},
            aws_credentials=self.aws_credentials,
            cluster_config=self.cluster_config,
        )


class SpotJobConfiguration(_SpotValues, BaseJobConfiguration):
    def prepare_for_flow_run(
        self, flow_run, deployment=None, flow=None, work_pool=None, worker_name=None, worker_id=None
    ) -> None:
        # Prefect's engine in the lease's main process, so a spot_task can turn the
        # notice's SIGTERM into an emergency checkpoint, and end a preempted run without
        # a final state (prefect_spot._engine).
        # On a remote lease (ec2) the instance's own Python runs it (`agent_python`).
        python = jobs.plugin(self.provider).lease_python(self.provider_options)
        self.command = self.command or f"{shlex.quote(python)} -m prefect_spot._engine"
        super().prepare_for_flow_run(flow_run, deployment, flow, work_pool, worker_name, worker_id)


class SpotJobVariables(_SpotValues, BaseVariables):
    pass


class SpotWorkerResult(BaseWorkerResult):
    """The lease of the last attempt, its exit code, and the job's record summary."""

    record: dict[str, Any] | None = None


class SpotWorker(BaseWorker[SpotJobConfiguration, SpotJobVariables, SpotWorkerResult]):
    type = "spot"
    job_configuration = SpotJobConfiguration
    job_configuration_variables = SpotJobVariables
    _description = (
        "Run flow runs on spot capacity: pool diversification, price cap, "
        "preemption budget, on-demand fallback; preempted runs are rescheduled "
        "and resume from their checkpoints."
    )
    _documentation_url = (
        "https://github.com/spot-pipelines/spot-pipelines/blob/main/docs/prefect.md"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._providers: dict[str, Any] = {}
        self._providers_lock = threading.Lock()
        self._records: dict[str, JobRecord] = {}
        self._cancelling = CancellingRuns()
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._driving: set[Any] = set()  # ids of the flow runs this worker drives now
        self._next_orphan_check = 0.0
        self._looks = orphans.Looks()  # Running runs other workers may drive
        self._adopter = f"{self.name}/{uuid.uuid4().hex[:12]}"  # whose claim on an orphan

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await super().__aexit__(*exc_info)
        finally:
            await anyio.to_thread.run_sync(self._close_providers)

    def _close_providers(self) -> None:
        with self._providers_lock:
            providers, self._providers = list(self._providers.values()), {}
        for provider in providers:
            provider.close()  # terminates every lease still held
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def _scratch_dir(self) -> Path:
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="spot-worker-")
        return Path(self._scratch.name)

    @staticmethod
    def _provider_key(configuration: SpotJobConfiguration) -> str:
        """The provider's reopen identity: name, options, the credentials' fingerprint."""
        config = configuration.spot_configuration()
        return observer_key(
            config.provider,
            config.provider_options,
            fingerprint(config.aws_credentials),
            fingerprint(config.cluster_config),
        )

    def _observer(self, configuration: SpotJobConfiguration, provider) -> SharedObserver:
        """The worker's one observer for ``provider``: every flow run it watches there is
        described in the same call each poll."""
        return shared_observer(self._provider_key(configuration), provider)

    def _provider(self, configuration: SpotJobConfiguration):
        """One provider per distinct provider configuration and credentials blocks, for the
        worker's lifetime."""
        config = configuration.spot_configuration()
        key = self._provider_key(configuration)
        with self._providers_lock:
            if key not in self._providers:
                self._providers[key] = _jobs.open_configured_provider(
                    config, workdir=str(self._scratch_dir() / f"cloud-{len(self._providers)}")
                )
            return self._providers[key]

    # -- running a flow run -------------------------------------------------------------------
    async def run(
        self,
        flow_run: FlowRun,
        configuration: SpotJobConfiguration,
        # Prefect types it TaskStatus[int] (a process id); the id we report is a lease's
        task_status: anyio.abc.TaskStatus[str] | None = None,  # type: ignore[override]
    ) -> SpotWorkerResult:
        """Drive the flow run's job through the controller until it settles or is handed
        back to the work pool (rescheduled after a preemption)."""
        self._driving.add(flow_run.id)
        try:
            return await self._drive(flow_run, configuration, task_status)
        finally:
            self._driving.discard(flow_run.id)

    def _job(
        self, flow_run: FlowRun, configuration: SpotJobConfiguration, provider: Any
    ) -> tuple[Any, Any, JobRecord]:
        """The flow run's job: its spec (the flow run's command on a lease, with the
        environment a lease may get), its controller (the record kept in Prefect, each
        exit code read with the flow run's state) and its record. Blocking."""
        config = configuration.spot_configuration()
        stored = self._load_record(flow_run)
        # A handover's replacement waits for this worker's go past the notice's deadline:
        # two polls to see the old lease end and close it, and the API calls before the go.
        go_margin = min(
            2 * config.settings().poll_interval_seconds + GO_API_SECONDS, MAX_WAIT_SECONDS
        )
        env = {k: v for k, v in configuration.env.items() if v is not None}
        spec = _jobs.job_spec(
            config,
            provider,
            job_id=jobs.job_id(f"flow-run-{flow_run.id}"),
            command=shlex.split(configuration.command),
            checkpoint_uri=self._checkpoint_uri(configuration, flow_run),
            env=_jobs.lease_env(
                config.provider,
                {**env, GO_MARGIN: f"{go_margin:g}"},
                self.get_flow_run_logger(flow_run),
            ),
            created_at=None if stored is None else stored.created_at,
        )
        controller = _jobs.controller_for(
            config,
            _FlowRunExit(provider, flow_run.id),
            related=_related(flow_run),
            persist=lambda r: self._remember(flow_run, r),
            progress=JobProgress(flow_run_id=flow_run.id),
        )
        record = stored or controller.persist(controller.new_record(spec))
        return spec, controller, record

    async def _drive(
        self,
        flow_run: FlowRun,
        configuration: SpotJobConfiguration,
        task_status: anyio.abc.TaskStatus[str] | None,
    ) -> SpotWorkerResult:
        provider = await anyio.to_thread.run_sync(self._provider, configuration)
        spec, controller, record = await anyio.to_thread.run_sync(
            self._job, flow_run, configuration, provider
        )
        runs_before = await self._runs_before(flow_run, record)
        started = _Started(task_status)
        nxt = await anyio.to_thread.run_sync(controller.advance, spec, record)
        try:
            while nxt.action != "finished":
                if nxt.action == "sleep":
                    self.get_flow_run_logger(flow_run).info("waiting: %s", nxt.reason)
                    await anyio.sleep(max(0.0, nxt.until - time.time()))
                elif nxt.action == "watch":
                    started(nxt.lease.lease_id)
                    nxt = await self._watch(
                        controller, self._observer(configuration, provider), spec, nxt, flow_run
                    )
                    continue
                else:  # ended
                    handed_back = await self._after_attempt(
                        controller, spec, nxt.record, flow_run, runs_before
                    )
                    if handed_back is not None:
                        started(handed_back.identifier)
                        return handed_back
                handing_over = pending_replacement(nxt.record) is not None
                nxt = await anyio.to_thread.run_sync(controller.advance, spec, nxt.record)
                if handing_over and nxt.action == "watch":  # the replacement was adopted
                    started(nxt.lease.lease_id)
                    taken, runs_before = await self._take_over(
                        controller, spec, nxt, flow_run, runs_before
                    )
                    if taken is not None:
                        return taken
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._stop_on_exit(controller, spec, nxt.record, flow_run)
            raise
        started("")
        return await self._finish(flow_run, nxt.record)

    async def _stop_on_exit(self, controller, spec, record: JobRecord, flow_run: FlowRun) -> None:
        """The worker is stopping (shut down, or an error): end every lease the job holds
        (the running attempt's, and in a handover its replacement's) and close them. A
        flow run the ended leases leave ``Pending`` (a handover's, whose new engine never
        started) or ``Running`` (an engine that handed the run back on a reclaim notice,
        expecting this worker to reschedule it) would stay so, with its attempt closed
        and so never adopted by another worker: it ends ``Crashed``, as a run whose
        infrastructure was lost does."""
        # The record last persisted (it may name a lease, a handover's replacement, that
        # the Next this worker holds does not yet)
        latest = self._records.get(str(flow_run.id)) or record
        if latest.status in FINAL_STATUSES or (
            latest.current_attempt is None and pending_replacement(latest) is None
        ):
            return
        await anyio.to_thread.run_sync(
            controller.stop, spec, latest, "stopped: the worker shut down"
        )
        from prefect.states import Crashed

        try:
            current = await self.client.read_flow_run(flow_run.id)
            state = current.state
            if state is not None and (state.is_pending() or state.is_running()):
                await self.client.set_flow_run_state(
                    flow_run.id,
                    Crashed(
                        message="the spot worker stopped while it drove the flow run; "
                        "its spot leases were ended"
                    ),
                    force=True,
                )
        except Exception:  # noqa: BLE001 - the original error is the one to raise
            self.get_flow_run_logger(flow_run).warning(
                "could not mark the flow run Crashed", exc_info=True
            )

    async def _watch(self, controller, observer: SharedObserver, spec, nxt, flow_run: FlowRun):
        """Check the lease every poll until the attempt ends, with its status from the
        worker's shared observer (one describe per poll for all its flow runs) and the
        checks of one poll run in one thread hop (``spot_core.batched``); a flow run
        cancelled meanwhile stops the attempt (the controller terminates and closes
        it)."""
        lease, poll = nxt.lease, controller.poll_interval_seconds
        observer.watch(lease, poll)
        self._cancelling.watch(flow_run.id)
        try:
            after = time.time()
            while nxt.action == "watch":
                observed = await observer.wait_async(lease.lease_id, after, wait_timeout(poll))
                if await self._cancelling.is_cancelling(self.client, flow_run.id):
                    record = await anyio.to_thread.run_sync(
                        controller.cancel, spec, nxt.record, "stopped: the flow run was cancelled"
                    )
                    return dataclasses.replace(
                        nxt, action="ended", record=record, lease=None, reason="cancelled"
                    )
                with anyio.CancelScope(shield=True):  # as run_sync: a started check completes
                    nxt = await batched.to_thread(_check, controller, spec, nxt, observed)
                after = observed.at + poll / 2  # the next poll's, not this one
        finally:
            self._cancelling.unwatch(flow_run.id)
            observer.unwatch(lease.lease_id)
        return nxt

    async def _after_attempt(
        self, controller, spec, record: JobRecord, flow_run: FlowRun, runs_before: int
    ) -> SpotWorkerResult | None:
        """After an attempt closed: a result if the flow run leaves this worker now
        (cancelled, or rescheduled for its next attempt), else None (advance here)."""
        last = record.attempts[-1]
        self.get_flow_run_logger(flow_run).info(
            "attempt %d ended %s: %s", last.number, last.outcome, last.message
        )
        if await self._cancelled(flow_run, since=last.started_at):
            record = await anyio.to_thread.run_sync(
                controller.cancel, spec, record, "the flow run was cancelled"
            )
            await self._publish(flow_run, record)
            return SpotWorkerResult(
                identifier=last.lease_id or "", status_code=0, record=record.summary()
            )
        if last.outcome not in RESCHEDULE_AFTER:
            return None
        if await self._completed(flow_run):
            # The flow run finished before its lease's end was seen (a notice raced its
            # exit): its work is done and rescheduling it would run it again.
            self.get_flow_run_logger(flow_run).info(
                "the flow run completed before attempt %d's lease ended; not rescheduled",
                last.number,
            )
            if pending_replacement(record) is not None:  # nor handed over: end that lease
                record = await anyio.to_thread.run_sync(
                    controller.stop, spec, record, "the flow run completed; no handover"
                )
            await self._publish(flow_run, record)
            return SpotWorkerResult(
                identifier=last.lease_id or "", status_code=0, record=record.summary()
            )
        if pending_replacement(record) is not None:
            return None  # advance adopts the replacement launched on the notice
        following = await anyio.to_thread.run_sync(controller.decide, spec, record)
        if following.action not in ("launch", "wait"):
            return None  # advance settles the job (budget spent)
        await self._refund_flow_retries(flow_run, runs_before)
        await self._reschedule(flow_run, record, last)
        await self._publish(flow_run, record)
        return SpotWorkerResult(
            identifier=last.lease_id or "", status_code=0, record=record.summary()
        )

    async def _completed(self, flow_run: FlowRun) -> bool:
        """Whether Prefect already has the flow run in a Completed state."""
        current = await self.client.read_flow_run(flow_run.id)
        return current.state is not None and current.state.is_completed()

    async def _runs_before(self, flow_run: FlowRun, record: JobRecord) -> int:
        """The flow run's ``run_count`` before the runs of the attempt this worker drives.

        For an attempt this worker is about to launch, the count now. For one already open
        (an orphan adopted, or a restarted worker driving its run again), its flow has
        started since its worker submitted it: the count minus the ``Running`` states since
        the last ``Pending``, so those runs are given back too if the attempt is preempted.
        """
        from prefect.client.schemas.objects import StateType

        current = await self.client.read_flow_run(flow_run.id)
        if record.current_attempt is None:
            return current.run_count
        since_pending = 0
        for state in await self.client.read_flow_run_states(flow_run.id):  # oldest first
            if state.type == StateType.PENDING:
                since_pending = 0
            elif state.type == StateType.RUNNING:
                since_pending += 1
        return max(0, current.run_count - since_pending)

    async def _refund_flow_retries(self, flow_run: FlowRun, runs_before: int) -> int:
        """Give back the flow's ``retries`` that the preempted attempt's runs used up; the
        run's ``run_count`` now (the next attempt's ``runs_before``).

        Every start of a flow run raises its ``run_count``, and Prefect retries a failed
        flow run while ``run_count`` <= ``empirical_policy.retries`` (its
        RetryFailedFlows rule; the engine copies ``@flow(retries=...)`` there only while
        it is unset). Raising ``retries`` by the runs this attempt spent keeps the user's
        retries for the flow's own errors."""
        current = await self.client.read_flow_run(flow_run.id)
        spent = max(0, current.run_count - runs_before)
        policy = current.empirical_policy
        if spent == 0 or policy.retries is None:
            return current.run_count
        policy = policy.model_copy(update={"retries": policy.retries + spent})
        await self.client.update_flow_run(flow_run.id, empirical_policy=policy)
        return current.run_count

    async def _take_over(
        self, controller, spec, nxt, flow_run: FlowRun, runs_before: int
    ) -> tuple[SpotWorkerResult | None, int]:
        """The controller adopted the replacement launched on the old attempt's notice (the
        store is fenced at its number): let it start the flow run's engine. (A result if
        the run was cancelled meanwhile; the new attempt's ``runs_before``.)

        In order: the flow retries the old attempt's runs used are given back; the run goes
        back to ``Pending`` (forced: Prefect refuses Running -> Pending to a worker, as a
        guard against a second submission, which is exactly what this is not: the old
        engine has exited and the record has closed its attempt); a cancel that came in
        meanwhile wins (both leases end); the new lease becomes the run's infrastructure
        id (a cancel from the UI terminates it); then the go, written once, after which
        the replacement's ``prefect_spot._engine`` proposes ``Running`` from ``Pending``."""
        from prefect.states import Pending

        record = nxt.record
        old, new = record.attempts[-2], record.attempts[-1]
        runs_before = await self._refund_flow_retries(flow_run, runs_before)
        step = old.checkpoint_step_end
        message = (
            f"handed over to attempt {new.number} on {new.pool.zone} {new.pool.instance_type} "
            f"(launched on attempt {old.number}'s interruption notice, which ended "
            f"{old.outcome}); resumes from checkpoint step {step if step is not None else '-'}"
        )
        await self.client.set_flow_run_state(flow_run.id, Pending(message=message), force=True)
        if await self._cancelled(flow_run, since=old.started_at):
            record = await anyio.to_thread.run_sync(
                controller.cancel, spec, record, "stopped: the flow run was cancelled"
            )
            await self._publish(flow_run, record)
            result = SpotWorkerResult(
                identifier=new.lease_id or "", status_code=0, record=record.summary()
            )
            return result, runs_before
        await self.client.update_flow_run(flow_run.id, infrastructure_pid=new.lease_id)
        store = controller.stores(spec.checkpoint_uri)
        await anyio.to_thread.run_sync(mark_go, store, old.number, new.number, time.time())
        self.get_flow_run_logger(flow_run).info("%s", message)
        await self._publish(flow_run, record)
        return None, runs_before

    def _checkpoint_uri(self, configuration: SpotJobConfiguration, flow_run: FlowRun) -> str:
        root = configuration.checkpoint_root or (self._scratch_dir() / "checkpoints").as_uri()
        return f"{root.rstrip('/')}/{flow_run.id}"

    async def _cancelled(self, flow_run: FlowRun, since: float) -> bool:
        """Was the run cancelled since ``since`` (the attempt's start)? Then it stays so.

        Read from the run's state history, not its current state: the engine killed with
        its lease may have reported ``Crashed`` after the ``Cancelling``."""
        from prefect.client.schemas.objects import StateType
        from prefect.states import Cancelled

        history = await self.client.read_flow_run_states(flow_run.id)
        if not any(
            s.type in (StateType.CANCELLING, StateType.CANCELLED)
            and s.timestamp.timestamp() >= since - 1.0
            for s in history
        ):
            return False
        current = (await self.client.read_flow_run(flow_run.id)).state
        if current is None or not current.is_cancelled():
            await self.client.set_flow_run_state(
                flow_run.id,
                Cancelled(message="cancelled; its spot lease was terminated"),
                force=True,
            )
        return True

    async def _reschedule(self, flow_run: FlowRun, record: JobRecord, last) -> None:
        """Put the flow run back in the queue instead of leaving it Crashed."""
        from prefect.states import AwaitingRetry

        step = record.latest_checkpoint.step if record.latest_checkpoint else None
        message = (
            f"spot capacity {last.outcome} on {last.pool.zone} {last.pool.instance_type} "
            f"(attempt {last.number}); rescheduled to resume from checkpoint step "
            f"{step if step is not None else '- (none yet)'}"
        )
        await self.client.set_flow_run_state(
            flow_run.id, AwaitingRetry(message=message), force=True
        )
        self.get_flow_run_logger(flow_run).info(message)
        from prefect_spot.events import emit_job_event

        emit_job_event("rescheduled", record, message, related=_related(flow_run))

    async def _finish(self, flow_run: FlowRun, record: JobRecord) -> SpotWorkerResult:
        last = record.attempts[-1] if record.attempts else None
        if record.status is not JobStatus.SUCCEEDED:
            await self._fail_unless_final(flow_run, record)
        await self._publish(flow_run, record)
        code = 0 if record.status is JobStatus.SUCCEEDED else 1
        return SpotWorkerResult(
            identifier=(last.lease_id or "") if last else "",
            status_code=code,
            record=record.summary(),
        )

    async def _fail_unless_final(self, flow_run: FlowRun, record: JobRecord) -> None:
        from prefect.states import Failed

        current = await self.client.read_flow_run(flow_run.id)
        if (
            current.state is not None
            and current.state.is_final()
            and not current.state.is_crashed()
        ):
            return
        await self.client.set_flow_run_state(
            flow_run.id,
            Failed(
                message=f"spot job ended {record.status}: "
                f"{record.attempts[-1].message if record.attempts else ''}"
            ),
            force=True,
        )

    # -- runs a dead worker left Running (prefect_spot.workers.orphans) ----------------------------
    async def get_and_submit_flow_runs(self) -> list[FlowRun]:
        """Prefect's poll for scheduled runs, then (every ``ORPHAN_CHECK_SECONDS``) a look
        for runs of this pool that a dead spot worker left ``Running``."""
        submitted = await super().get_and_submit_flow_runs()
        if (
            getattr(self, "_work_pool", None) is not None
            and time.monotonic() >= self._next_orphan_check
        ):
            self._next_orphan_check = time.monotonic() + orphans.ORPHAN_CHECK_SECONDS
            try:
                await self._adopt_orphans()
            except Exception:  # noqa: BLE001 - the next check tries again
                self._logger.warning("looking for orphaned flow runs failed", exc_info=True)
        return submitted

    async def _adopt_orphans(self) -> None:
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterId,
            FlowRunFilterState,
            FlowRunFilterStateType,
            WorkPoolFilter,
            WorkPoolFilterName,
        )
        from prefect.client.schemas.objects import StateType

        # The runs this worker drives are left out by the server: a worker watching 200
        # running flows would otherwise read and parse all 200 at every look.
        driving = FlowRunFilterId(not_any_=list(self._driving)) if self._driving else None
        running: list[FlowRun] = []
        while True:  # every Running run of the pool that others drive, a page at a time
            page = await self.client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    id=driving,
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])),
                ),
                work_pool_filter=WorkPoolFilter(
                    name=WorkPoolFilterName(any_=[self._work_pool_name])
                ),
                limit=ORPHAN_PAGE,
                offset=len(running),
            )
            running += page
            if len(page) < ORPHAN_PAGE:
                break
        self._looks.keep_only(run.id for run in running)
        for flow_run in running:
            freshness = None if flow_run.id in self._driving else self._looks.due(flow_run.id)
            if freshness is None:
                continue
            try:
                await self._look_at(flow_run, freshness)
            except Exception:  # noqa: BLE001 - one unreadable run does not hide the others
                self._logger.warning(
                    "could not check flow run %s for adoption", flow_run.id, exc_info=True
                )

    async def _look_at(self, flow_run: FlowRun, freshness) -> None:
        """Adopt ``flow_run`` if it is an orphan; remember when it is next worth a look."""
        configuration = await self.job_configuration.resolve_for_flow_run(
            flow_run,
            client=self.client,
            work_pool=copy.deepcopy(self.work_pool),
            worker_name=self.name,
            worker_id=self.backend_id,
        )
        spot = configuration.spot_configuration()
        timeout = spot.heartbeat_timeout
        if not configuration.checkpoint_root or timeout is None:
            # its heartbeat was in its own worker's scratch dir, or it has none
            self._looks.never(flow_run.id)
            return
        provider = await anyio.to_thread.run_sync(self._provider, configuration)
        uri, stores = self._checkpoint_uri(configuration, flow_run), provider_stores(provider)
        evidence = await anyio.to_thread.run_sync(
            orphans.gather,
            freshness,
            uri,
            stores,
            timeout,
            self._looks.monotonic(),
            lambda: load_record(record_key(flow_run.id)),
            provider,
            spot.heartbeat_uri,
        )
        self._looks.looked(flow_run.id, evidence, timeout)
        reason = orphans.orphaned(evidence, timeout)
        running = None if evidence.record is None else evidence.record.current_attempt
        if reason is None or running is None or flow_run.id in self._driving:
            return  # (an orphan always has its record's open attempt)
        attempt = running.number
        if not await anyio.to_thread.run_sync(
            self._looks.claim, flow_run.id, stores(uri), attempt, self._adopter, timeout
        ):
            self._logger.info(
                "flow run %s is an orphan another worker adopts (it claimed attempt %d first)",
                flow_run.id,
                attempt,
            )
            return
        self.get_flow_run_logger(flow_run).warning("adopting the flow run: %s", reason)
        if self._runs_task_group is None:  # made when the worker starts
            raise RuntimeError("Worker not properly initialized")
        self._driving.add(flow_run.id)  # the next check must not adopt it again
        self._runs_task_group.start_soon(self._adopt, flow_run, configuration)

    async def _adopt(self, flow_run: FlowRun, configuration: SpotJobConfiguration) -> None:
        try:
            await self.run(flow_run, configuration)
        except Exception:  # noqa: BLE001 - logged on the run; the next check may try again
            self.get_flow_run_logger(flow_run).exception("driving the adopted flow run failed")
        finally:
            self._driving.discard(flow_run.id)

    # -- the record in Prefect -------------------------------------------------------------------
    def _remember(self, flow_run: FlowRun, record: JobRecord) -> None:
        """Keep the record in a keyed artifact of the flow run (any worker can resume the
        job from it) before the controller acts on it; in memory too, for this worker."""
        try:
            save_record(record_key(flow_run.id), record, flow_run_id=flow_run.id)
        except Exception as exc:
            # An error, not a warning: another worker reading the older record would
            # restart the budgets. The controller terminates a lease it cannot record.
            self.get_flow_run_logger(flow_run).error("%s", exc)
            raise
        self._records[str(flow_run.id)] = record

    def _load_record(self, flow_run: FlowRun) -> JobRecord | None:
        record = self._records.get(str(flow_run.id))
        return record if record is not None else load_record(record_key(flow_run.id))

    async def _publish(self, flow_run: FlowRun, record: JobRecord) -> None:
        """The job's table, summary and chart on the flow run (a failure is logged)."""
        await anyio.to_thread.run_sync(
            functools.partial(
                publish, record, flow_run_id=flow_run.id, what=f"flow run {flow_run.name} on spot"
            )
        )

    # -- cancellation ---------------------------------------------------------------------------
    async def kill_infrastructure(
        self, infrastructure_pid: str, configuration: SpotJobConfiguration, grace_seconds: int = 30
    ) -> None:
        """Terminate the lease whose id is the flow run's infrastructure id."""
        from prefect.exceptions import InfrastructureNotFound

        if not infrastructure_pid:
            raise InfrastructureNotFound("the flow run has no lease id")
        provider = await anyio.to_thread.run_sync(self._provider, configuration)
        found = await anyio.to_thread.run_sync(_observe_by_id, provider, infrastructure_pid)
        if not found:
            raise InfrastructureNotFound(
                f"lease {infrastructure_pid} is unknown to the {provider.name} provider"
            )
        for stub, status in found:
            if not status.ended or len(found) == 1:
                await anyio.to_thread.run_sync(provider.terminate, stub)


def _check(controller, spec, nxt, observed: Observation):
    """``check`` with the shared observer's observation, its exit code corrected (both
    may block: run in a thread)."""
    return controller.check(spec, nxt, observed=controller.provider.corrected(observed))


def _related(flow_run: FlowRun) -> list[dict[str, str]]:
    return [
        {
            "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
            "prefect.resource.role": "flow-run",
        }
    ]


class _Started:
    """Reports the infrastructure id (the first lease) to Prefect once."""

    def __init__(self, task_status) -> None:
        self._task_status = task_status

    def __call__(self, identifier: str) -> None:
        if self._task_status is not None:
            self._task_status.started(identifier)
            self._task_status = None


class _FlowRunExit:
    """The provider, with each lease's exit code read together with its flow run's state.

    Prefect's engine exits 0 once it has reported a failed flow run, so an exit code of 0
    alone does not say the step succeeded: the process's exit status is 0 only if the
    flow run Completed. The controller then classifies the end as usual (a failure after
    an interruption notice is a preemption)."""

    def __init__(self, provider, flow_run_id) -> None:
        self._provider = provider
        self._flow_run_id = flow_run_id

    def observe(self, leases):
        statuses = self._provider.observe(leases)
        return {lease_id: self._corrected(status) for lease_id, status in statuses.items()}

    def corrected(self, observed: Observation) -> Observation:
        """A shared observer's ``observed``, its exit code read as ``observe`` reads it
        (blocking when the lease exited 0: call it from a thread)."""
        if observed.status is None or observed.error is not None:
            return observed
        return dataclasses.replace(observed, status=self._corrected(observed.status))

    def _corrected(self, status: LeaseStatus) -> LeaseStatus:
        if (
            not status.ended
            or status.exit_code != 0
            or status.outcome not in (None, Outcome.SUCCEEDED)
        ):
            return status  # a provider's verdict other than success stands
        from prefect import get_client

        with get_client(sync_client=True) as client:
            state = client.read_flow_run(self._flow_run_id).state
        if state is not None and state.is_completed():
            return status
        message = (
            state.message
            if state is not None and state.message
            else "the flow run did not complete"
        )
        return dataclasses.replace(status, exit_code=1, outcome=None, message=message[:300])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provider, name)


def _lease_stubs(provider, lease_id: str) -> list[Lease]:
    """A stand-in lease per region the provider covers: the id alone does not say where
    an EC2 instance runs, and terminating in the wrong region would leave it running."""
    by_region: dict[str, Any] = {}
    for pool in provider.pools():
        by_region.setdefault(pool.region, pool)
    return [
        Lease(
            lease_id=lease_id, pool=pool, job_id="", attempt=0, started_at=0.0, price_per_hour=0.0
        )
        for pool in by_region.values()
    ]


def _observe_by_id(provider, lease_id: str) -> list[tuple[Lease, LeaseStatus]]:
    """(stub, status) for every region in which the provider reports the lease."""
    found = []
    for stub in _lease_stubs(provider, lease_id):
        status = provider.observe([stub]).get(lease_id)
        if status is not None:
            found.append((stub, status))
    return found
