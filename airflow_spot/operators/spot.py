"""``SpotJobOperator``: one pipeline step run to completion on spot capacity.

The operator is a thin driver of the controller's lifecycle (``spot_core.controller``):
``advance`` says finished / sleep until T / watch lease L; a sleep defers to a timer
(deferrable) or sleeps; a watch defers to ``SpotJobTrigger`` (deferrable) or calls
``check`` here every poll interval; an ended attempt goes back to ``advance``. The
controller alone classifies, bills, closes and terminates. Preemptions are absorbed
inside the try (the controller relaunches), so they never spend Airflow ``retries``; an
attempt that ended ``user_failed`` raises, so Airflow's retries apply (the only place
they are spent), and the next try resumes from the latest checkpoint with the JobRecord
read back from the task state store (a running attempt is reattached, not relaunched).

Where state lives: the JobRecord is written to ``context["task_state_store"]`` after
every change (it survives retries and worker loss), travels in the trigger's kwargs
while the task is deferred, and its summary is the task's XCom return value.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_spot import alerts
from airflow_spot.hooks.connections import check_conn_id
from airflow_spot.hooks.spot import SpotHook
from airflow_spot.links.spot import SpotCheckpointLink, SpotEc2InstanceLink
from airflow_spot.records import JOB_RECORD_KEY, persister, stored_record
from airflow_spot.triggers.spot import EVENT_STATUSES, SpotJobTrigger
from spot_core.checkpoint.uri import parse_store_uri
from spot_core.controller import Controller, JobSpec, Next
from spot_core.errors import ConfigError
from spot_core.model import JobRecord, JobStatus, Lease, Outcome
from spot_core.providers import check_provider
from spot_core.settings import SpotSettings, default, knob, pop_aliases

RECORD_KEY = JOB_RECORD_KEY
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
    :param provider: capacity provider: ``local`` (trace-driven local spot cloud), ``ec2``,
        ``kubernetes`` (pods on spot node pools; docs/kubernetes.md).
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
    :param aws_conn_id: Airflow AWS connection for EC2, S3 and SQS (keys, profile or
        role assumption, region and ``endpoint_url`` in its extra), resolved through the
        amazon provider's hook in the worker and again, by id, in the triggerer. None:
        boto3's default chain (environment, instance role).
    :param kubernetes_conn_id: Airflow Kubernetes connection for the kubernetes provider,
        resolved through cncf-kubernetes' hook. None: the provider's default.
    :param alert_interruption_rate: interruptions per hour on spot above which a pool of
        the job raises an alert when an attempt ends (None: off).
    :param alert_spot_price: spot price in USD/h above which a pool raises an alert (None: off).
    :param on_spot_alert: ``callback(alert: dict, context)`` for each alert, besides the
        ``on_spot_alert`` listener hook of Airflow plugins (``airflow_spot.listeners.spec``).

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
                 alert_interruption_rate: float | None = default("alert_interruption_rate"),
                 alert_spot_price: float | None = default("alert_spot_price"),
                 on_spot_alert: Callable[[dict, Any], None] | None = None,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable",
                                                    fallback=False),
                 aws_conn_id: str | None = None, kubernetes_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        renamed = pop_aliases(kwargs, where=kwargs.get("task_id", ""))
        super().__init__(**kwargs)
        check_conn_id(aws_conn_id, "aws_conn_id", self.task_id)
        check_conn_id(kubernetes_conn_id, "kubernetes_conn_id", self.task_id)
        self.aws_conn_id = aws_conn_id
        self.kubernetes_conn_id = kubernetes_conn_id
        self.command = command
        self.checkpoint_uri = checkpoint_uri
        if env is not None and not isinstance(env, Mapping):
            raise ValueError(f"{self.task_id}: env={env!r} must be a mapping of variable "
                             "names to strings, e.g. {'MODEL': 'resnet'}")
        self.env = dict(env or {})
        self.image = image
        if not isinstance(deferrable, bool):
            raise ValueError(f"{self.task_id}: deferrable={deferrable!r} must be True or False")
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
            "observe_failure_timeout": observe_failure_timeout,
            "alert_interruption_rate": alert_interruption_rate,
            "alert_spot_price": alert_spot_price, **renamed})
        if on_spot_alert is not None and not callable(on_spot_alert):
            raise ValueError(f"{self.task_id}: on_spot_alert={on_spot_alert!r} must be a "
                             "function taking (alert, context), or None")
        self.on_spot_alert = on_spot_alert
        settings = self.settings
        self.provider = settings.provider
        self.provider_options = dict(settings.provider_options)
        self.zones = list(settings.zones) or None
        self.deadline_seconds = settings.deadline
        self.attempt_timeout_seconds = settings.attempt_timeout
        self.poll_interval = settings.poll_interval
        # A user failure never spends a policy budget: Airflow's own retries are its budget.
        self.policy = settings.retry_policy(max_user_retries=UNLIMITED_USER_RETRIES)
        self._watching: tuple[Controller, JobSpec, Next] | None = None  # while watching here
        self._killed = False
        self._hook: SpotHook | None = None

    # -- parse-time validation --------------------------------------------------------------
    def _settings(self, values: dict[str, Any]) -> SpotSettings:
        """The spot settings, checked by the model; one line naming the task and the fix."""
        if _is_template(values["image"]):
            values = {**values, "image": None}  # checked by _validate_static, rendered later
        try:
            settings = SpotSettings.build(where=self.task_id, **values)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        try:  # what the provider refuses in the step's environment (ec2: credentials)
            check_provider(settings.provider, settings.provider_options,
                           env={k: v for k, v in self.env.items() if not _is_template(v)})
        except ConfigError as exc:
            raise ValueError(f"{self.task_id}: {exc}") from None
        try:  # trigger kwargs and the task state store hold them as JSON
            json.dumps(settings.provider_options, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self.task_id}: provider_options must be JSON-able (strings, "
                             f"finite numbers, lists, mappings): {exc}") from None
        return settings

    def _validate_static(self) -> None:
        """The Airflow-side arguments, as written (templates are checked once rendered)."""
        command = self.command
        if isinstance(command, str):
            if not command.strip():
                raise ValueError(f"{self.task_id}: command is empty; pass the step's command, "
                                 "e.g. command=['python', '-m', 'my.train']")
        elif not isinstance(command, (list, tuple)) or not command \
                or not all(isinstance(a, str) for a in command):
            raise ValueError(f"{self.task_id}: command={command!r} must be a non-empty string "
                             "or list of strings, e.g. ['python', '-m', 'my.train']")
        self._check_uri(self.checkpoint_uri, ValueError)
        image = self.image
        if image is not None and not (isinstance(image, str) and image.strip()
                                      and (_is_template(image) or not any(c.isspace() for c in image))):
            raise ValueError(f"{self.task_id}: image={image!r} is not an image reference; pass "
                             "one like 'ghcr.io/acme/train:1.4' or drop image=")
        if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in self.env.items()):
            raise ValueError(f"{self.task_id}: env must map strings to strings; quote numbers")

    def _check_uri(self, uri: Any, error: type[Exception]) -> None:
        """The store's own URI check (``file://host/x``, no bucket, a query, ...) in one line
        naming the task; a templated URI is checked as rendered."""
        if isinstance(uri, str) and _is_template(uri):
            return
        try:
            parse_store_uri(uri)
        except ConfigError as exc:
            raise error(f"{self.task_id}: checkpoint_uri: {exc}") from None
        if not str(uri).startswith(CHECKPOINT_SCHEMES):
            raise error(f"{self.task_id}: checkpoint_uri={uri!r} must start with file:// or "
                        "s3://, e.g. file:///data/checkpoints/train or s3://bucket/train")

    def _validate_rendered(self) -> None:
        """Templated fields as rendered for this run: the same checks as at parse time,
        failing the task without retries (a retry renders the same value)."""
        self._check_uri(self.checkpoint_uri, AirflowFailException)
        try:
            knob("image").parse(self.image or None)
            if not isinstance(self.provider_options, Mapping):
                raise ConfigError(f"provider_options rendered as {self.provider_options!r}, "
                                  "not a mapping")
            if not isinstance(self.env, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
                raise ConfigError(f"env rendered as {self.env!r}; it must map names to strings")
            check_provider(self.provider, self.provider_options, env=self.env)
        except ConfigError as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None

    # -- building blocks ----------------------------------------------------------------------
    @property
    def hook(self) -> SpotHook:
        if self._hook is None:
            self._hook = SpotHook(self.provider, self.provider_options,
                                  aws_conn_id=self.aws_conn_id,
                                  kubernetes_conn_id=self.kubernetes_conn_id)
        return self._hook

    def controller_options(self) -> dict[str, Any]:
        """The Controller's options from the settings, the same in worker and trigger."""
        return self.settings.controller_options()

    def _controller(self, context) -> Controller:
        check = alerts.on_attempt_end(lambda: self.hook.get_provider().market,
                                      lambda: self.hook.pools(self.zones),
                                      self.settings.alert_thresholds(), context, self.on_spot_alert)
        return self.hook.controller(self.policy, persist=persister(context, RECORD_KEY, check),
                                    **self.controller_options())

    def _spec(self, record: JobRecord) -> JobSpec:
        command = shlex.split(self.command) if isinstance(self.command, str) else self.command
        pools = self.hook.pools(self.zones)
        offered = sorted({p.zone for p in self.hook.pools()})
        missing = sorted(set(self.zones or ()) - set(offered))
        if missing or not pools:
            raise AirflowFailException(f"{self.task_id}: provider {self.provider!r} has no zone(s) "
                                       f"{missing or self.zones}; set zones= to some of "
                                       f"{', '.join(offered) or 'its zones'}, or drop zones=")
        return JobSpec(job_id=record.job_id, command=tuple(command),
                       checkpoint_uri=self.checkpoint_uri, pools=pools,
                       deadline=record.deadline, env=self.env, image=self.image or None)

    def _job_id(self, context) -> str:
        ti = context["ti"]
        index = getattr(ti, "map_index", -1)
        suffix = "" if index is None or index < 0 else f".{index}"
        return _safe_id(f"{ti.dag_id}.{ti.task_id}{suffix}.{ti.run_id}")

    def _stored_record(self, context) -> JobRecord | None:
        """The record an earlier try left in the task state store, if any."""
        return stored_record(context, RECORD_KEY, self.task_id)

    def _load_record(self, context, controller: Controller,
                     stored: JobRecord | None = None) -> JobRecord:
        """The record from the task state store (an earlier try, read by
        ``_stored_record``), or a new one."""
        if stored is None:
            stored = self._stored_record(context)
        if stored is None:
            now = time.time()
            record = JobRecord(job_id=self._job_id(context), created_at=now,
                               checkpoint_uri=self.checkpoint_uri,
                               deadline=None if self.deadline_seconds is None
                               else now + self.deadline_seconds)
            controller.persist(record)
            return record
        record = stored
        self.log.info("resuming job %s from the task state store: %s", record.job_id,
                      record.summary())
        if record.status is JobStatus.FAILED:  # a new Airflow try is a new chance
            record = record.with_status(JobStatus.RUNNING if record.current_attempt
                                        else JobStatus.PENDING)
        return record

    # -- execution: a driver of the controller's lifecycle --------------------------------------
    def execute(self, context) -> dict[str, Any]:
        self._validate_rendered()
        stored = self._stored_record(context)  # a corrupt record stops before anything opens
        controller = self._controller(context)
        record = self._load_record(context, controller, stored)
        SpotCheckpointLink.persist(context, SpotCheckpointLink.url_for(self.checkpoint_uri))
        SpotEc2InstanceLink.persist(context, "")  # filled in when an attempt runs on EC2
        if record.current_attempt is not None:  # an earlier try left it running: reattach
            self.log.info("reattaching to attempt %d (lease %s) left by an earlier try",
                          record.current_attempt.number, record.current_attempt.lease_id)
        spec = self._spec(record)
        return self._drive(context, controller, spec, controller.advance(spec, record))

    def execute_complete(self, context, event: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Back from the trigger: keep its record, then go on driving from its Next."""
        nxt = self._event_next(event)
        controller = self._controller(context)
        controller.persist(nxt.record)  # what the trigger closed, before anything acts on it
        spec = self._spec(nxt.record)
        if event["status"] == "error":  # the next try reattaches to the recorded attempt
            raise AirflowException(f"job {nxt.record.job_id}: the trigger failed: "
                                   f"{event.get('message')}")
        if event["status"] == "wake":
            nxt = controller.advance(spec, nxt.record)
        elif event["status"] == "notice":
            self.log.warning("attempt %d got an interruption notice; the step saves an emergency "
                             "checkpoint", nxt.lease.attempt)
        return self._drive(context, controller, spec, nxt)

    def _event_next(self, event: Any) -> Next:
        """The Next a trigger event carries. An event that cannot be read is one line and
        persists nothing: the retry resumes from the record already in the task state store."""
        status = event.get("status") if isinstance(event, Mapping) else None
        if status not in EVENT_STATUSES:
            raise AirflowException(f"{self.task_id}: unexpected trigger event (status "
                                   f"{status!r}, expected one of {', '.join(EVENT_STATUSES)}); "
                                   "the next try resumes from the task state store")
        try:
            return Next.from_dict(event.get("next"))
        except ConfigError as exc:
            raise AirflowException(f"{self.task_id}: the trigger's event cannot be read: {exc}; "
                                   "the next try resumes from the task state store") from None

    def _drive(self, context, controller: Controller, spec: JobSpec, nxt: Next) -> dict[str, Any]:
        """Follow the controller's answers until the job finishes or the task defers."""
        for _ in range(MAX_ROUNDS):
            if self._killed:
                raise AirflowException(f"job {spec.job_id}: the task was killed")
            if nxt.action == "finished":
                return self._finish(context, nxt.record, nxt.reason)
            if nxt.action == "ended":
                self._after_attempt(nxt.record)
                nxt = controller.advance(spec, nxt.record)
            elif nxt.action == "sleep":
                self.log.info("waiting until %s: %s", time.ctime(nxt.until), nxt.reason)
                if self.deferrable:
                    self._defer(spec, nxt)
                time.sleep(max(0.0, nxt.until - time.time()))
                nxt = controller.advance(spec, nxt.record)
            else:  # watch
                self._persist_instance_link(context, nxt.lease)
                if self.deferrable and not self._notice_pending(nxt):
                    self.log.info("watching attempt %d on %s (lease %s)%s from the triggerer: %s",
                                  nxt.lease.attempt, nxt.lease.pool.key, nxt.lease.lease_id,
                                  self._trace_position(), nxt.reason)
                    self._defer(spec, nxt)
                nxt = self._watch_here(controller, spec, nxt)
        raise SpotJobFailed(f"job {spec.job_id} did not settle in {MAX_ROUNDS} rounds")

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
                time.sleep(self.poll_interval)
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
        self.log.info("attempt %d ended %s on %s (checkpoint %s -> %s) %s", attempt.number,
                      attempt.outcome, pool, attempt.checkpoint_step_start,
                      attempt.checkpoint_step_end, attempt.message)
        if attempt.outcome is Outcome.USER_FAILED:
            why = attempt.message or "it exited with a non-zero code"
            raise SpotUserStepFailed(f"the step's own code failed on attempt {attempt.number} "
                                     f"({why}); the next try resumes from checkpoint step "
                                     f"{attempt.checkpoint_step_end}")

    def _defer(self, spec: JobSpec, nxt: Next) -> None:
        trigger = SpotJobTrigger(provider=self.provider, provider_options=self.hook.reopen_options,
                                 next=nxt.to_dict(), checkpoint_uri=spec.checkpoint_uri,
                                 controller_options=self.controller_options(),
                                 not_before=time.time() + MIN_DEFER_SECONDS,
                                 aws_conn_id=self.aws_conn_id,
                                 kubernetes_conn_id=self.kubernetes_conn_id)
        # Airflow's own bound sits past the controller's (attempt limit, observe failures).
        end_by = nxt.until if nxt.action == "sleep" else nxt.until + self.settings.observe_failure_timeout
        timeout = timedelta(seconds=max(0.0, end_by - time.time()) + 600)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timeout)

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
        """Airflow is killing the task: stop the attempt this worker watches (a deferred
        task's lease is stopped by its trigger's ``on_kill`` / ``cleanup``)."""
        self._killed = True
        self._stop_watched("stopped: the task was killed")

    @property
    def _lease(self) -> Lease | None:
        """The lease this worker watches now, if any."""
        watching = self._watching
        return None if watching is None else watching[2].lease
