"""``SpotJobOperator``: one pipeline step run to completion on spot capacity.

Each Airflow try runs the job's attempts under the controller: decide (spot pool,
on-demand, wait or stop), launch, wait for the lease to end, classify and bill it, and
again, until the job succeeds. Preemptions are handled inside the try (relaunch and
defer again), so they never spend Airflow ``retries``; a failure of the step's own code
raises, so Airflow's retries apply, and the next try resumes from the latest checkpoint
with the JobRecord read back from the task state store.

Where state lives: the JobRecord is written to ``context["task_state_store"]`` after
every change (it survives retries and worker loss), travels in the trigger's kwargs
while the task is deferred, and its summary is the task's XCom return value.
"""

from __future__ import annotations

import re
import shlex
import time
from datetime import timedelta
from typing import Any, Mapping, Sequence

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_spot.hooks.spot import SpotHook, lease_from_attempt, status_from_dict
from airflow_spot.links.spot import SpotCheckpointLink, SpotEc2InstanceLink
from airflow_spot.triggers.spot import EVENT_STATUSES, SpotJobTrigger
from spot_core.controller import Controller, JobSpec
from spot_core.model import JobRecord, JobStatus, Lease, Outcome
from spot_core.errors import ConfigError
from spot_core.providers.base import LeaseState, LeaseStatus
from spot_core.settings import SpotSettings, default, pop_aliases

RECORD_KEY = "spot_job_record"
CHECKPOINT_SCHEMES = ("file://", "s3://")
NOTICE_WATCH_SECONDS = 180.0  # after a notice: the longest notice (120 s) plus grace
MIN_DEFER_SECONDS = 15.0  # a trigger holds its event this long (see SpotJobTrigger.not_before);
# the deferring process can take several seconds to be reported gone on a busy machine
MAX_ROUNDS = 1000  # decide -> apply rounds per try; the policy's budgets end a job far sooner
# A user failure never spends a policy budget: Airflow's own retries are its budget.
UNLIMITED_USER_RETRIES = 1_000_000


class SpotUserStepFailed(AirflowException):
    """The step's own code failed on its capacity; Airflow's retries apply."""


class SpotJobFailed(AirflowException):
    """The policy gave up (budgets spent, no capacity for too long)."""


Duration = timedelta | float | str  # seconds, a timedelta, or "90s" / "5m" / "2h" / "1d"


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def _safe_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:200]


class SpotJobOperator(BaseOperator):
    """Run ``command`` on spot capacity until it succeeds, surviving preemptions.

    :param command: the step's command, a list of arguments or a shell-style string
        (templated).
    :param checkpoint_uri: ``file:///abs/path`` or ``s3://bucket/prefix`` where the step
        checkpoints; each attempt resumes from its newest checkpoint (templated).
    :param provider: capacity provider: ``local`` (trace-driven local spot cloud), ``ec2``.
    :param provider_options: options for the provider, e.g. ``{"url": ...}`` of a local
        cloud server or the EC2 region and image (templated).
    :param image: run ``command`` in this container image (Docker on the machine that runs
        the step: the EC2 instance's AMI, or this machine for ``local``) (templated).
    :param zones: restrict the job to these zones (default: every pool the provider has).
    :param env: extra environment for the step (templated).
    :param max_preemptions: preemptions on spot before the rest runs on on-demand.
    :param on_demand_fallback: allow on-demand when spot is spent, scarce or too late.
    :param return_to_spot: move back to spot when capacity returns after a fallback.
    :param min_on_demand: how long an on-demand attempt runs before moving back to spot.
    :param max_spot_price: $/h above which spot pools are left alone: the job waits
        (bounded, like a capacity wait) for a cheaper window, then falls back to on-demand.
    :param capacity_wait: how long one wait for capacity (or a price window) lasts.
    :param max_capacity_waits: waits (or launches without capacity) before giving up.
    :param max_infrastructure_retries: failures outside the step's code to absorb.
    :param deadline: time the job may take from its first try (the policy moves to
        on-demand near it; past it the task fails without retry).
    :param attempt_timeout: longest one attempt may run before it is terminated.
    :param poll_interval: time between lease observations.
    :param heartbeat_timeout: how long a lease outlives a silent driver (a killed worker
        or triggerer) before the node ends it.
    :param observe_failure_timeout: how long observing a lease may keep failing before the
        attempt ends as infrastructure_failed.
    :param deferrable: wait in the triggerer instead of a worker slot (default:
        ``[operators] default_deferrable``).

    Every spot setting (provider, budgets, waits, timeouts) has the meaning, default and
    check of its knob in ``spot_core.settings``; durations take seconds, a ``timedelta``
    or a string such as ``"5m"``. The validated values are ``self.settings`` (templated
    fields as written, before rendering).
    """

    template_fields: Sequence[str] = ("command", "checkpoint_uri", "provider_options", "env",
                                      "image")
    template_fields_renderers = {"provider_options": "json", "env": "json"}
    operator_extra_links = (SpotCheckpointLink(), SpotEc2InstanceLink())
    ui_color = "#f9d27a"

    def __init__(self, *, command: str | Sequence[str], checkpoint_uri: str,
                 provider: str = default("provider"),
                 provider_options: Mapping[str, Any] | None = None,
                 image: str | None = default("image"), zones: Sequence[str] = default("zones"),
                 env: Mapping[str, str] | None = None,
                 max_preemptions: int = default("max_preemptions"),
                 on_demand_fallback: bool = default("on_demand_fallback"),
                 return_to_spot: bool = default("return_to_spot"),
                 min_on_demand: Duration = default("min_on_demand"),
                 max_spot_price: float | None = default("max_spot_price"),
                 capacity_wait: Duration = default("capacity_wait"),
                 max_capacity_waits: int = default("max_capacity_waits"),
                 max_infrastructure_retries: int = default("max_infrastructure_retries"),
                 deadline: Duration | None = default("deadline"),
                 attempt_timeout: Duration = default("attempt_timeout"),
                 poll_interval: Duration = default("poll_interval"),
                 heartbeat_timeout: Duration = default("heartbeat_timeout"),
                 observe_failure_timeout: Duration = default("observe_failure_timeout"),
                 deferrable: bool = conf.getboolean("operators", "default_deferrable",
                                                    fallback=False),
                 **kwargs: Any) -> None:
        renamed = pop_aliases(kwargs, where=kwargs.get("task_id", ""))
        super().__init__(**kwargs)
        self.command = command
        self.checkpoint_uri = checkpoint_uri
        self.env = dict(env or {})
        self.image = image
        self.deferrable = deferrable
        self._validate_static()
        self.settings = self._settings({
            "provider": provider,
            "provider_options": {} if provider_options is None else provider_options,
            "image": image, "zones": () if zones is None else zones,
            "max_preemptions": max_preemptions, "on_demand_fallback": on_demand_fallback,
            "return_to_spot": return_to_spot, "min_on_demand": min_on_demand,
            "max_spot_price": max_spot_price, "capacity_wait": capacity_wait,
            "max_capacity_waits": max_capacity_waits,
            "max_infrastructure_retries": max_infrastructure_retries, "deadline": deadline,
            "attempt_timeout": attempt_timeout, "poll_interval": poll_interval,
            "heartbeat_timeout": heartbeat_timeout,
            "observe_failure_timeout": observe_failure_timeout, **renamed})
        settings = self.settings
        self.provider = settings.provider
        self.provider_options = dict(settings.provider_options)
        self.zones = list(settings.zones) or None
        self.deadline_seconds = settings.deadline
        self.attempt_timeout_seconds = settings.attempt_timeout
        self.poll_interval = settings.poll_interval
        # A user failure never spends a policy budget: Airflow's own retries are its budget.
        self.policy = settings.retry_policy(max_user_retries=UNLIMITED_USER_RETRIES)
        self._lease: Lease | None = None
        self._killed = False
        self._hook: SpotHook | None = None

    # -- parse-time validation --------------------------------------------------------------
    def _settings(self, values: dict[str, Any]) -> SpotSettings:
        """The spot settings, checked by the model; one line naming the task and the fix."""
        if _is_template(values["image"]):
            values = {**values, "image": None}  # checked by _validate_static, rendered later
        try:
            return SpotSettings.build(where=self.task_id, **values)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    def _validate_static(self) -> None:
        if not self.command or (isinstance(self.command, str) and not self.command.strip()):
            raise ValueError(f"{self.task_id}: command is empty; pass the step's command, e.g. "
                             "command=['python', '-m', 'my.train']")
        if not isinstance(self.command, str) and not all(isinstance(a, str) for a in self.command):
            raise ValueError(f"{self.task_id}: command must be a string or a list of strings, "
                             f"got {self.command!r}")
        uri = self.checkpoint_uri
        if not isinstance(uri, str) or not (_is_template(uri) or uri.startswith(CHECKPOINT_SCHEMES)):
            raise ValueError(f"{self.task_id}: checkpoint_uri={uri!r} must start with file:// or "
                             "s3://, e.g. file:///data/checkpoints/train or s3://bucket/train")
        image = self.image
        if image is not None and not (isinstance(image, str) and image.strip()
                                      and (_is_template(image) or not any(c.isspace() for c in image))):
            raise ValueError(f"{self.task_id}: image={image!r} is not an image reference; pass "
                             "one like 'ghcr.io/acme/train:1.4' or drop image=")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise ValueError(f"{self.task_id}: env must map strings to strings; quote numbers")

    # -- building blocks ----------------------------------------------------------------------
    @property
    def hook(self) -> SpotHook:
        if self._hook is None:
            self._hook = SpotHook(self.provider, self.provider_options)
        return self._hook

    def _controller(self, context) -> Controller:
        store = context.get("task_state_store")

        def persist(record: JobRecord) -> None:
            if store is not None:
                store.set(RECORD_KEY, record.to_dict())

        return self.hook.controller(self.policy, persist=persist,
                                    poll_interval=min(self.poll_interval, 1.0))

    def _spec(self, record: JobRecord) -> JobSpec:
        command = shlex.split(self.command) if isinstance(self.command, str) else self.command
        pools = self.hook.pools(self.zones)
        if not pools:
            raise AirflowFailException(f"provider {self.provider!r} has no pools in zones "
                                       f"{self.zones}; check zones= against the provider")
        return JobSpec(job_id=record.job_id, command=tuple(command),
                       checkpoint_uri=self.checkpoint_uri, pools=pools,
                       deadline=record.deadline, env=self.env, image=self.image or None)

    def _job_id(self, context) -> str:
        ti = context["ti"]
        index = getattr(ti, "map_index", -1)
        suffix = "" if index is None or index < 0 else f".{index}"
        return _safe_id(f"{ti.dag_id}.{ti.task_id}{suffix}.{ti.run_id}")

    def _load_record(self, context, controller: Controller) -> JobRecord:
        """The record from the task state store (an earlier try), or a new one."""
        store = context.get("task_state_store")
        stored = None if store is None else store.get(RECORD_KEY)
        if stored is None:
            now = time.time()
            record = JobRecord(job_id=self._job_id(context), created_at=now,
                               checkpoint_uri=self.checkpoint_uri,
                               deadline=None if self.deadline_seconds is None
                               else now + self.deadline_seconds)
            controller.persist(record)
            return record
        record = JobRecord.from_dict(stored)
        self.log.info("resuming job %s from the task state store: %s", record.job_id,
                      record.summary())
        if record.status is JobStatus.FAILED:  # a new Airflow try is a new chance
            record = record.with_status(JobStatus.RUNNING if record.current_attempt
                                        else JobStatus.PENDING)
        return record

    # -- execution ----------------------------------------------------------------------------
    def execute(self, context) -> dict[str, Any]:
        controller = self._controller(context)
        record = self._load_record(context, controller)
        SpotCheckpointLink.persist(context, SpotCheckpointLink.url_for(self.checkpoint_uri))
        SpotEc2InstanceLink.persist(context, "")  # filled in when an attempt runs on EC2
        running = record.current_attempt
        if running is not None:  # an earlier try left its attempt behind: reattach
            lease = lease_from_attempt(record.job_id, running)
            self.log.info("reattaching to attempt %d (lease %s) left by an earlier try",
                          running.number, running.lease_id)
            return self._wait(context, controller, record, lease)
        return self._advance(context, controller, record)

    def _advance(self, context, controller: Controller, record: JobRecord) -> dict[str, Any]:
        """Decide -> apply until the job ends or the task defers."""
        spec = self._spec(record)
        for _ in range(MAX_ROUNDS):
            if self._killed:
                raise AirflowException(f"job {record.job_id}: the task was killed")
            decision = controller.decide(spec, record)
            final = controller.settle(record, decision)
            if final is not None:
                return self._finish(context, final, decision.reason)
            if decision.action == "wait":
                self.log.info("waiting %.1f s: %s", decision.wait_seconds, decision.reason)
                if self.deferrable:
                    self._defer(record, None, time.time() + decision.wait_seconds)
                time.sleep(decision.wait_seconds)
                continue
            record, lease = controller.start_attempt(spec, record, decision)
            if lease is None:
                self.log.warning("no capacity: %s", record.attempts[-1].message)
                continue
            self.log.info("attempt %d launched on %s (lease %s)%s: %s", lease.attempt,
                          lease.pool.key, lease.lease_id, self._trace_position(), decision.reason)
            self._persist_instance_link(context, lease)
            record = self._close(controller, record, lease,
                                 self._wait_for_end(context, controller, record, lease))
        raise SpotJobFailed(f"job {record.job_id} did not settle in {MAX_ROUNDS} rounds")

    def _wait(self, context, controller, record, lease) -> dict[str, Any]:
        status = self._wait_for_end(context, controller, record, lease)
        return self._advance(context, controller, self._close(controller, record, lease, status))

    def _wait_for_end(self, context, controller: Controller, record: JobRecord,
                      lease: Lease, *, end_by: float | None = None,
                      defer: bool = True) -> LeaseStatus:
        """Defer (deferrable) or poll here until the lease ends, bounded by attempt_timeout
        (or ``end_by``)."""
        end_by = self._end_by(lease) if end_by is None else end_by
        if self.deferrable and defer:
            self._defer(record, lease, end_by)
        self._lease = lease
        try:
            while True:
                status = self.hook.observe(lease)
                if status.ended:
                    return status
                if time.time() >= end_by:
                    self.hook.terminate(lease)
                    return LeaseStatus(LeaseState.TERMINATED, ended_at=time.time(),
                                       message="stopped: the attempt's time limit passed")
                time.sleep(self.poll_interval)
        except BaseException:
            self.hook.terminate(lease)
            raise

    def _end_by(self, lease: Lease) -> float:
        return lease.started_at + self.attempt_timeout_seconds

    def _defer(self, record: JobRecord, lease: Lease | None, end_by: float,
               return_on_notice: bool = True) -> None:
        trigger = SpotJobTrigger(provider=self.provider, provider_options=self.hook.reopen_options,
                                 record=record.to_dict(),
                                 lease=None if lease is None else lease.to_dict(),
                                 end_by=end_by, poll_interval=self.poll_interval,
                                 return_on_notice=return_on_notice,
                                 not_before=time.time() + MIN_DEFER_SECONDS)
        # Airflow's own bound sits past the trigger's, which terminates the lease first.
        timeout = timedelta(seconds=max(0.0, end_by - time.time()) + 600)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timeout)

    def execute_complete(self, context, event: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Back from the trigger: close the attempt, then decide what comes next."""
        if not isinstance(event, Mapping) or event.get("status") not in EVENT_STATUSES:
            raise AirflowException(f"unexpected trigger event {event!r}")
        controller = self._controller(context)
        record = JobRecord.from_dict(event["record"])
        if event["status"] == "wake":
            return self._advance(context, controller, record)
        lease = Lease.from_dict(event["lease"])
        if event["status"] == "error":
            self.hook.terminate(lease)
            raise AirflowException(f"watching lease {lease.lease_id} failed: {event['message']}")
        if event["status"] == "notice":
            # The lease ends within its notice period (at most 2 minutes on any cloud). Watch
            # that here rather than deferring again: a trigger that fires seconds after a
            # deferral can race Airflow's report of the deferring process's exit and cost
            # the task a try.
            self.log.warning("attempt %d got an interruption notice; the step saves an emergency "
                             "checkpoint", lease.attempt)
            end_by = min(self._end_by(lease), time.time() + NOTICE_WATCH_SECONDS)
            status = self._wait_for_end(context, controller, record, lease, end_by=end_by,
                                        defer=False)
            return self._advance(context, controller, self._close(controller, record, lease,
                                                                  status))
        status = status_from_dict(event["lease_status"])
        return self._advance(context, controller, self._close(controller, record, lease, status))

    def _close(self, controller: Controller, record: JobRecord, lease: Lease,
               status: LeaseStatus) -> JobRecord:
        """Terminate (idempotent), classify and bill the attempt; raise on a user failure."""
        self.hook.terminate(lease)
        self._lease = None
        record = controller.finish_attempt(self._spec(record), record, lease, status)
        attempt = record.attempts[-1]
        self.log.info("attempt %d ended %s on %s (checkpoint %s -> %s) %s", attempt.number,
                      attempt.outcome, attempt.pool.key, attempt.checkpoint_step_start,
                      attempt.checkpoint_step_end, attempt.message)
        if attempt.outcome is Outcome.USER_FAILED:
            raise SpotUserStepFailed(f"the step failed on attempt {attempt.number} (exit code "
                                     f"{status.exit_code}): {attempt.message}; the next try "
                                     "resumes from checkpoint step "
                                     f"{attempt.checkpoint_step_end}")
        return record

    def _finish(self, context, record: JobRecord, reason: str) -> dict[str, Any]:
        summary = record.summary()
        if self.do_xcom_push:  # the whole history, for the UI and the report step
            context["ti"].xcom_push(key=RECORD_KEY, value=record.to_dict())
        self.log.info("job %s %s: %s", record.job_id, record.status, summary)
        if record.status is JobStatus.SUCCEEDED:
            return summary
        if record.status is JobStatus.DEADLINE_MISSED:
            raise AirflowFailException(f"job {record.job_id} missed its deadline: {reason}")
        raise SpotJobFailed(f"job {record.job_id} failed: {reason}")

    def _trace_position(self) -> str:
        """Where a trace-replaying market is in its trace (for the logs), or nothing."""
        tick_at = getattr(self.hook.get_provider().market, "tick_at", None)
        return "" if tick_at is None else f" at trace tick {tick_at(time.time())}"

    def _persist_instance_link(self, context, lease: Lease) -> None:
        if lease.pool.cloud == "aws" and self.provider == "ec2":
            SpotEc2InstanceLink.persist(context, SpotEc2InstanceLink.url_for(
                lease.pool.region, lease.lease_id))

    def on_kill(self) -> None:
        """Airflow is killing the task: release the lease it holds in this process."""
        self._killed = True
        if self._lease is not None:
            self.hook.terminate(self._lease)
            self._lease = None
