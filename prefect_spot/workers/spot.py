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

This module keeps the worker's lifecycle (``run`` / ``_drive``); its parts are
``configuration`` (the job configuration, variables and result), ``states`` (the flow
run's state changes), ``orphans`` (adoption) and ``exit_watch`` (each exit code read with
the flow run's state). Their public names are importable from here as before.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from prefect.client.schemas.objects import FlowRun
from prefect.workers.base import BaseWorker

from prefect_spot import _jobs
from prefect_spot._engine import GO_MARGIN
from prefect_spot.artifacts import JobProgress, load_record, publish, record_key, save_record
from prefect_spot.credentials import fingerprint
from prefect_spot.workers import orphans, states
from prefect_spot.workers.cancelling import CancellingRuns

# The worker's parts, named here too: `prefect_spot.workers.spot` is where they were.
from prefect_spot.workers.configuration import (
    WORKER_FIELDS,
    SpotJobConfiguration,
    SpotJobVariables,
    SpotWorkerResult,
)
from prefect_spot.workers.exit_watch import FlowRunExit, check
from prefect_spot.workers.orphans import ORPHAN_PAGE
from spot_core import batched, jobs
from spot_core.bounds import MAX_WAIT_SECONDS
from spot_core.checkpoint.handover import mark_go
from spot_core.controller import FINAL_STATUSES, Transition, pending_replacement
from spot_core.jobs import LeaseStatus, Provider
from spot_core.model import JobRecord, JobStatus, Lease, Outcome
from spot_core.observer import SharedObserver, observer_key, shared_observer, wait_timeout

__all__ = [
    "GO_API_SECONDS",
    "ORPHAN_PAGE",
    "RESCHEDULE_AFTER",
    "WORKER_FIELDS",
    "FlowRunExit",
    "SpotJobConfiguration",
    "SpotJobVariables",
    "SpotWorker",
    "SpotWorkerResult",
]

RESCHEDULE_AFTER = (
    Outcome.PREEMPTED,
    Outcome.INFRASTRUCTURE_FAILED,
    Outcome.DRAINED,
    Outcome.DISRUPTED,
)
GO_API_SECONDS = 60.0
"""What a handover's replacement allows, past the notice's deadline and the worker's
polls, for the worker's API calls before its go (``prefect_spot._engine``)."""


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
        self._adoption = orphans.Adoption(self.name)  # of the runs dead workers left

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
        watched: Provider = FlowRunExit(provider, flow_run.id)
        controller = _jobs.controller_for(
            config,
            watched,
            related=states.related(flow_run),
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
        runs_before = await states.runs_before(self.client, flow_run, record)
        started = _Started(task_status)
        transition = Transition(controller, spec)
        step = await anyio.to_thread.run_sync(transition.start, record)
        nxt = step.next  # the latest Next: what a stop on the way out reads
        try:
            while step.action != "finished":
                if step.action == "wait":
                    self.get_flow_run_logger(flow_run).info("waiting: %s", step.reason)
                    await anyio.sleep(step.wait_seconds)
                    step = await anyio.to_thread.run_sync(transition.woke, step.next)
                    nxt = step.next
                    continue
                started(step.lease.lease_id)
                if step.adopted:  # the replacement launched on the notice takes the run over
                    taken, runs_before = await self._take_over(
                        controller, spec, step.next, flow_run, runs_before
                    )
                    if taken is not None:
                        return taken
                nxt = await self._watch(
                    controller, self._observer(configuration, provider), spec, step.next, flow_run
                )
                handed_back = await self._after_attempt(
                    controller, spec, nxt.record, flow_run, runs_before
                )
                if handed_back is not None:
                    started(handed_back.identifier)
                    return handed_back
                step = await anyio.to_thread.run_sync(transition.follow, nxt)
                nxt = step.next
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._stop_on_exit(controller, spec, nxt.record, flow_run)
            raise
        started("")
        return await self._finish(flow_run, step.record)

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
        await states.crash_if_left(self.client, flow_run, self.get_flow_run_logger(flow_run))

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
                    nxt = await batched.to_thread(check, controller, spec, nxt, observed)
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
        if await states.cancelled(self.client, flow_run, since=last.started_at):
            record = await anyio.to_thread.run_sync(
                controller.cancel, spec, record, "the flow run was cancelled"
            )
            await self._publish(flow_run, record)
            return SpotWorkerResult.of(record, last.lease_id)
        if last.outcome not in RESCHEDULE_AFTER:
            return None
        if await states.completed(self.client, flow_run):
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
            return SpotWorkerResult.of(record, last.lease_id)
        if pending_replacement(record) is not None:
            return None  # advance adopts the replacement launched on the notice
        following = await anyio.to_thread.run_sync(controller.decide, spec, record)
        if following.action not in ("launch", "wait"):
            return None  # advance settles the job (budget spent)
        await states.refund_flow_retries(self.client, flow_run, runs_before)
        await states.reschedule(
            self.client, flow_run, record, last, self.get_flow_run_logger(flow_run)
        )
        await self._publish(flow_run, record)
        return SpotWorkerResult.of(record, last.lease_id)

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
        record = nxt.record
        old, new = record.attempts[-2], record.attempts[-1]
        runs_before = await states.refund_flow_retries(self.client, flow_run, runs_before)
        step = old.checkpoint_step_end
        message = (
            f"handed over to attempt {new.number} on {new.pool.zone} {new.pool.instance_type} "
            f"(launched on attempt {old.number}'s interruption notice, which ended "
            f"{old.outcome}); resumes from checkpoint step {step if step is not None else '-'}"
        )
        await states.back_to_pending(self.client, flow_run, message)
        if await states.cancelled(self.client, flow_run, since=old.started_at):
            record = await anyio.to_thread.run_sync(
                controller.cancel, spec, record, "stopped: the flow run was cancelled"
            )
            await self._publish(flow_run, record)
            return SpotWorkerResult.of(record, new.lease_id), runs_before
        await self.client.update_flow_run(flow_run.id, infrastructure_pid=new.lease_id)
        store = controller.stores(spec.checkpoint_uri)
        await anyio.to_thread.run_sync(mark_go, store, old.number, new.number, time.time())
        self.get_flow_run_logger(flow_run).info("%s", message)
        await self._publish(flow_run, record)
        return None, runs_before

    def _checkpoint_uri(self, configuration: SpotJobConfiguration, flow_run: FlowRun) -> str:
        root = configuration.checkpoint_root or (self._scratch_dir() / "checkpoints").as_uri()
        return f"{root.rstrip('/')}/{flow_run.id}"

    async def _finish(self, flow_run: FlowRun, record: JobRecord) -> SpotWorkerResult:
        last = record.attempts[-1] if record.attempts else None
        if record.status is not JobStatus.SUCCEEDED:
            await states.fail_unless_final(self.client, flow_run, record)
        await self._publish(flow_run, record)
        code = 0 if record.status is JobStatus.SUCCEEDED else 1
        return SpotWorkerResult.of(record, last.lease_id if last else None, code)

    # -- runs a dead worker left Running (prefect_spot.workers.orphans) ----------------------------
    async def get_and_submit_flow_runs(self) -> list[FlowRun]:
        """Prefect's poll for scheduled runs, then (every ``ORPHAN_CHECK_SECONDS``) a look
        for runs of this pool that a dead spot worker left ``Running``."""
        submitted = await super().get_and_submit_flow_runs()
        if getattr(self, "_work_pool", None) is not None and self._adoption.due():
            try:
                await self._adoption.look(self)
            except Exception:  # noqa: BLE001 - the next check tries again
                self._logger.warning("looking for orphaned flow runs failed", exc_info=True)
        return submitted

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


class _Started:
    """Reports the infrastructure id (the first lease) to Prefect once."""

    def __init__(self, task_status) -> None:
        self._task_status = task_status

    def __call__(self, identifier: str) -> None:
        if self._task_status is not None:
            self._task_status.started(identifier)
            self._task_status = None


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
