"""The Airflow side of the controller's lifecycle, shared by every spot operator.

``SpotJobOperator`` and ``SpotKubernetesPodOperator`` differ in what they run (a command
on a provider's capacity; a pod built from KubernetesPodOperator's own parameters) but
drive it the same way, so the driving lives here once: the controller's ``Transition``
says finished / wait N seconds / watch lease L; a wait defers to a timer (deferrable) or
sleeps; a watch defers to the operator's trigger (deferrable) or calls ``check`` here
every poll interval; an ended attempt is logged, then followed (``advance``). The
controller alone classifies, bills, closes and terminates. Preemptions are absorbed
inside the try (the controller relaunches), so they never spend Airflow ``retries``; an
attempt that ended ``user_failed`` raises, so Airflow's retries apply (the only place
they are spent), and the next try resumes from the latest checkpoint with the JobRecord
read back from the task state store (a running attempt is reattached, not relaunched).

An operator using ``ControllerDriverMixin`` provides ``settings`` (``SpotSettings``),
``deferrable``, ``checkpoint_uri``, ``spot_hook`` (a ``SpotHook``), and
``_spec(job_id, created_at)`` (its JobSpec, through ``spot_core.jobs``),
``_validate_rendered()`` and ``_trigger(spec, nxt, not_before)``. The job itself (its
spec, id and controller) is assembled by ``spot_core.jobs``; this module only drives it
the Airflow way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_spot.hooks.spot import SpotHook
from airflow_spot.links.spot import SpotCheckpointLink
from airflow_spot.records import persister, stored_record
from airflow_spot.triggers.spot import EVENT_STATUSES, SpotJobTrigger
from spot_core import jobs
from spot_core.controller import Controller, JobSpec, Next, Step, Transition
from spot_core.errors import ConfigError
from spot_core.model import JobRecord, JobStatus, Lease, Outcome
from spot_core.policy.retry import RetryPolicy

if TYPE_CHECKING:  # what the mixin drives: the operator it is mixed into
    from airflow.sdk import BaseOperator

    _Operator = BaseOperator
else:
    _Operator = object

RECORD_KEY = "spot_job_record"
NOTICE_WATCH_SECONDS = 180.0  # after a notice: the longest notice (120 s) plus grace
MIN_DEFER_SECONDS = 15.0  # a trigger holds its event this long (see SpotJobTrigger.not_before);
# the deferring process can take several seconds to be reported gone on a busy machine
MAX_ROUNDS = 1000  # decide -> apply rounds per try; the policy's budgets end a job far sooner
# A user failure never spends a policy budget: Airflow's own retries are its budget.
UNLIMITED_USER_RETRIES = 1_000_000


def defer_hold_seconds() -> float:
    """How long a trigger holds its event: ``MIN_DEFER_SECONDS``, or nothing when this
    task runs inside the process that runs its trigger. ``dag.test()`` (the Airflow demo,
    the example DAG's tests) runs each task in process and then the trigger inline,
    after the task has returned: no executor is there to report the deferral late, so
    a hold would only add 15 s to every attempt and every mapped shard."""
    try:
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms
    except ImportError:  # another Task SDK layout: keep the safe hold
        return MIN_DEFER_SECONDS
    in_process = isinstance(
        getattr(task_runner, "SUPERVISOR_COMMS", None), InProcessSupervisorComms
    )
    return 0.0 if in_process else MIN_DEFER_SECONDS


class SpotUserStepFailed(AirflowException):
    """The step's own code failed on its capacity; Airflow's retries apply."""


class SpotJobFailed(AirflowException):
    """The policy gave up (budgets spent, no capacity for too long)."""


class ControllerDriverMixin(_Operator):
    """Drives one job through ``spot_core.controller`` from an Airflow task."""

    if TYPE_CHECKING:  # provided by the operator (see the module's docstring)
        deferrable: bool
        checkpoint_uri: str

        @property
        def spot_hook(self) -> SpotHook: ...

        def _spec(self, job_id: str, created_at: float | None) -> JobSpec: ...

        def _validate_rendered(self) -> None: ...

    _watching: tuple[Controller, JobSpec, Next] | None = None  # while watching here
    _killed: bool = False

    # -- building blocks ----------------------------------------------------------------------
    def _adopt_settings(self, settings) -> None:
        """Keep the checked settings (each operator builds its ``SpotSettings`` from its own
        parameters, then hands them here)."""
        self.settings = settings
        self.zones = list(settings.zones) or None
        self.poll_interval = settings.poll_interval_seconds  # also KPO's attribute

    @property
    def policy(self) -> RetryPolicy:
        """The retry policy the controller runs with: a user failure never spends a policy
        budget, Airflow's own retries are its budget."""
        return self.settings.retry_policy(max_user_retries=UNLIMITED_USER_RETRIES)

    def controller_options(self) -> dict[str, Any]:
        """The controller's knobs from the settings (their surface names, JSON-able: the
        trigger's kwargs carry them), the same in worker and trigger."""
        return self.settings.knob_values(controller_only=True)

    def _controller(self, context) -> Controller:
        return self.spot_hook.controller(
            self.settings,
            max_user_retries=UNLIMITED_USER_RETRIES,
            persist=persister(context, RECORD_KEY),
        )

    def _job_id(self, context) -> str:
        ti = context["ti"]
        index = getattr(ti, "map_index", -1)
        return jobs.job_id(
            ti.dag_id, ti.task_id, None if index is None or index < 0 else index, ti.run_id
        )

    def _stored_record(self, context) -> JobRecord | None:
        """The record an earlier try left in the task state store, if any."""
        return stored_record(context, RECORD_KEY, self.task_id)

    def _job_spec(self, context, stored: JobRecord | None) -> JobSpec:
        """The job of this try: an earlier try's (its id and creation time, so it keeps
        its deadline), or a new one."""
        if stored is None:
            return self._spec(self._job_id(context), None)
        return self._spec(stored.job_id, stored.created_at)

    def _resumed(self, record: JobRecord) -> JobRecord:
        """An earlier try's record, reopened: a new Airflow try is a new chance."""
        self.log.info(
            "resuming job %s from the task state store: %s", record.job_id, record.summary()
        )
        if record.status is JobStatus.FAILED:
            return record.with_status(
                JobStatus.RUNNING if record.current_attempt else JobStatus.PENDING
            )
        return record

    # -- execution: a driver of the controller's lifecycle --------------------------------------
    def _start(self, context) -> dict[str, Any]:
        """Load (or create) the record and drive it: ``execute`` of a spot operator."""
        self._validate_rendered()
        stored = self._stored_record(context)  # a corrupt record stops before anything opens
        controller = self._controller(context)
        spec = self._job_spec(context, stored)
        record = (
            controller.persist(controller.new_record(spec))
            if stored is None
            else self._resumed(stored)
        )
        SpotCheckpointLink.persist(context, SpotCheckpointLink.url_for(self.checkpoint_uri))
        self._persist_lease_link(context, None)  # filled in when an attempt runs
        if record.current_attempt is not None:  # an earlier try left it running: reattach
            self.log.info(
                "reattaching to attempt %d (lease %s) left by an earlier try",
                record.current_attempt.number,
                record.current_attempt.lease_id,
            )
        transition = Transition(controller, spec)
        return self._drive(context, controller, transition, transition.start(record))

    def execute_complete(self, context, event: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Back from the trigger: keep its record, then go on driving from its Next."""
        nxt = self._event_next(event)
        assert event is not None  # _event_next refused anything but a known event
        controller = self._controller(context)
        controller.persist(nxt.record)  # what the trigger closed, before anything acts on it
        latest = self._latest_lease(nxt.record)
        if latest is not None:  # one the trigger adopted in a handover is linked too
            self._persist_lease_link(context, latest)
        spec = self._spec(nxt.record.job_id, nxt.record.created_at)
        if event["status"] == "error":  # the next try reattaches to the recorded attempt
            raise AirflowException(
                f"job {nxt.record.job_id}: the trigger failed: {event.get('message')}"
            )
        transition = Transition(controller, spec)
        if event["status"] == "wake":
            return self._drive(context, controller, transition, transition.woke(nxt))
        if event["status"] == "notice":
            self.log.warning(
                "attempt %d got an interruption notice; the step saves an emergency checkpoint",
                self._lease_of(nxt).attempt,
            )
        return self._drive(context, controller, transition, self._follow(transition, nxt))

    @staticmethod
    def _latest_lease(record: JobRecord) -> Lease | None:
        """The newest attempt's lease (None before any attempt)."""
        latest = record.attempts[-1] if record.attempts else None
        return None if latest is None or not latest.lease else Lease.from_dict(latest.lease)

    def _event_next(self, event: Any) -> Next:
        """The Next a trigger event carries. An event that cannot be read is one line and
        persists nothing: the retry resumes from the record already in the task state store."""
        status = event.get("status") if isinstance(event, Mapping) else None
        if status not in EVENT_STATUSES:
            raise AirflowException(
                f"{self.task_id}: unexpected trigger event (status "
                f"{status!r}, expected one of {', '.join(EVENT_STATUSES)}); "
                "the next try resumes from the task state store"
            )
        try:
            return Next.from_dict(event.get("next"))
        except ConfigError as exc:
            raise AirflowException(
                f"{self.task_id}: the trigger's event cannot be read: {exc}; "
                "the next try resumes from the task state store"
            ) from None

    def _drive(
        self, context, controller: Controller, transition: Transition, step: Step
    ) -> dict[str, Any]:
        """Follow the controller's answers until the job finishes or the task defers."""
        spec = transition.spec
        for _ in range(MAX_ROUNDS):
            if self._killed:
                raise AirflowException(f"job {spec.job_id}: the task was killed")
            if step.action == "finished":
                return self._finish(context, step.record, step.reason)
            if step.action == "wait":
                self.log.info("waiting until %s: %s", time.ctime(step.next.until), step.reason)
                if self.deferrable and step.wait_seconds >= defer_hold_seconds():
                    self._defer(spec, step.next)
                # Shorter than a trigger's hold, a deferral would wake late (a deadline
                # policy's wait for the next tick of a compressed trace): wait here.
                time.sleep(max(0.0, step.next.until - time.time()))
                step = transition.woke(step.next)
                continue
            nxt = step.next  # watch
            self._persist_lease_link(context, nxt.lease)
            if self.deferrable and not self._notice_pending(nxt):
                lease = self._lease_of(nxt)
                self.log.info(
                    "watching attempt %d on %s (lease %s)%s from the triggerer: %s",
                    lease.attempt,
                    lease.pool.key,
                    lease.lease_id,
                    self._trace_position(),
                    nxt.reason,
                )
                self._defer(spec, nxt)
            step = self._follow(transition, self._watch_here(controller, spec, nxt))
        raise SpotJobFailed(f"job {spec.job_id} did not settle in {MAX_ROUNDS} rounds")

    def _follow(self, transition: Transition, nxt: Next) -> Step:
        """The step after ``nxt``. An attempt that ended is logged first, and a failure of
        the step's own code raises here, before the controller is asked again: it spends
        an Airflow try, never a relaunch inside this one."""
        if nxt.action == "ended":
            self._after_attempt(nxt.record)
        return transition.follow(nxt)

    @staticmethod
    def _lease_of(nxt: Next) -> Lease:
        """The lease a watch step (and a trigger's notice) carries."""
        if nxt.lease is None:
            raise AirflowException(f"job {nxt.record.job_id}: a {nxt.action} step without a lease")
        return nxt.lease

    @staticmethod
    def _notice_pending(nxt: Next) -> bool:
        """After a notice the lease ends within its notice period (at most 2 minutes on any
        cloud). That end is watched here rather than by deferring again: a trigger that
        fires seconds after a deferral can race Airflow 3.3's report of the deferring
        process's exit and cost the task a try (see ``MIN_DEFER_SECONDS``)."""
        return nxt.notice_at is not None and time.time() < nxt.notice_at + NOTICE_WATCH_SECONDS

    def _watch_here(self, controller: Controller, spec: JobSpec, nxt: Next) -> Next:
        """``check`` every poll interval in this worker until the watch changes; a kill
        (or any exception) stops the lease through the controller."""
        self._watching = (controller, spec, nxt)
        try:
            while nxt.action == "watch" and not (self.deferrable and not self._notice_pending(nxt)):
                time.sleep(self.settings.poll_interval_seconds)
                if self._killed:
                    raise AirflowException(f"job {spec.job_id}: the task was killed")
                nxt = controller.check(spec, nxt)
                self._watching = (controller, spec, nxt) if nxt.action == "watch" else None
            return nxt
        except BaseException:
            self._stop_watched("stopped: the task was killed or failed while watching")
            raise
        finally:
            self._watching = None

    def _stop_watched(self, reason: str) -> None:
        """Stop (terminate and close through the controller) the attempt this worker watches."""
        watching, self._watching = self._watching, None  # on_kill runs in another thread
        if watching is not None:
            controller, spec, nxt = watching
            controller.stop(spec, nxt.record, reason)

    def _after_attempt(self, record: JobRecord) -> None:
        """Log how the attempt ended; a failure of the step's own code spends an Airflow try."""
        attempt = record.attempts[-1]
        pool = attempt.pool.key if attempt.pool is not None else "-"
        self.log.info(
            "attempt %d ended %s on %s (checkpoint %s -> %s) %s",
            attempt.number,
            attempt.outcome,
            pool,
            attempt.checkpoint_step_start,
            attempt.checkpoint_step_end,
            attempt.message,
        )
        if attempt.outcome is Outcome.USER_FAILED:
            why = attempt.message or "it exited with a non-zero code"
            raise SpotUserStepFailed(
                f"the step's own code failed on attempt {attempt.number} "
                f"({why}); the next try resumes from checkpoint step "
                f"{attempt.checkpoint_step_end}"
            )

    def _launch(self, spec: JobSpec) -> dict[str, Any] | None:
        """What the trigger needs to launch the replacement on a notice itself, as this
        worker's controller would (the job's spec and retry policy), so a handover does
        not wake a worker; None when the step's env holds a credential (never in trigger
        kwargs: the worker then hands over on the notice)."""
        made = jobs.relaunch(self.settings, spec, max_user_retries=UNLIMITED_USER_RETRIES)
        return None if made is None else made.to_dict()

    def _watch_kwargs(self, spec: JobSpec, nxt: Next, not_before: float) -> dict[str, Any]:
        """What every spot trigger is given to watch ``nxt`` (and hand over on a notice);
        each operator's ``_trigger`` adds how the triggerer reaches its cloud."""
        return {
            "provider_options": self.spot_hook.reopen_options,
            "next": nxt.to_dict(),
            "checkpoint_uri": spec.checkpoint_uri,
            "controller_options": self.controller_options(),
            "not_before": not_before,
            "launch": self._launch(spec),
        }

    def _trigger(self, spec: JobSpec, nxt: Next, not_before: float) -> SpotJobTrigger:
        """The trigger that watches ``nxt`` in the triggerer."""
        return SpotJobTrigger(
            provider=self.settings.provider, **self._watch_kwargs(spec, nxt, not_before)
        )

    def _defer(self, spec: JobSpec, nxt: Next) -> NoReturn:
        """Hand ``nxt`` to the triggerer: raises ``TaskDeferred``, never returns."""
        trigger = self._trigger(spec, nxt, not_before=time.time() + defer_hold_seconds())
        # Airflow's own bound sits past the controller's (attempt limit, observe failures).
        end_by = (
            nxt.until
            if nxt.action == "sleep"
            else nxt.until + self.settings.observe_failure_timeout_seconds
        )
        timeout = timedelta(seconds=max(0.0, end_by - time.time()) + 600)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timeout)

    def _finish(self, context, record: JobRecord, reason: str) -> dict[str, Any]:
        summary = record.summary()
        if self._push_record:  # the whole history, for the UI and the report step
            context["ti"].xcom_push(key=RECORD_KEY, value=record.to_dict())
        self.log.info("job %s %s: %s", record.job_id, record.status, summary)
        if record.status is JobStatus.SUCCEEDED:
            return summary
        if record.status is JobStatus.DEADLINE_MISSED:
            raise AirflowFailException(f"job {record.job_id} missed its deadline: {reason}")
        raise SpotJobFailed(f"job {record.job_id} failed: {reason}")

    @property
    def _push_record(self) -> bool:
        return bool(self.do_xcom_push)

    def _trace_position(self) -> str:
        """Where a trace-replaying provider is in its traces (for the logs), or nothing."""
        return jobs.trace_position(self.spot_hook.get_provider())

    def _persist_lease_link(self, context, lease: Lease | None) -> None:
        """Store the link to the capacity ``lease`` runs on (None: before any attempt)."""

    def on_kill(self) -> None:
        """Airflow is killing the task: stop the attempt this worker watches (a deferred
        task's lease is stopped by its trigger's ``on_kill`` / ``cleanup``)."""
        self._killed = True
        self._stop_watched("stopped: the task was killed")

    @property
    def _lease(self) -> Lease | None:
        """The lease this worker watches now, if any."""
        watching = self._watching
        return None if watching is None else watching[2].lease
