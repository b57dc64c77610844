"""``SpotJobOperator``: one pipeline step run to completion on spot capacity.

The operator is a thin driver of the controller's lifecycle (``spot_core.controller``),
shared with ``SpotKubernetesPodOperator`` in ``ControllerDriverMixin``: preemptions are
absorbed inside the try (the controller relaunches), so they never spend Airflow
``retries``; an attempt that ended ``user_failed`` raises, so Airflow's retries apply.
This module holds what is SpotJobOperator's own: its parameters, their checks at parse
time and once rendered, the job's pools and its links.

Where state lives: the JobRecord is written to ``context["task_state_store"]`` after
every change (it survives retries and worker loss), travels in the trigger's kwargs
while the task is deferred, and its summary is the task's XCom return value.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowFailException

from airflow_spot import alerts
from airflow_spot.hooks.connections import check_conn_id
from airflow_spot.hooks.spot import SpotHook
from airflow_spot.links.spot import SpotCheckpointLink, SpotEc2InstanceLink
from airflow_spot.operators.controller_driver import (  # noqa: F401 - re-exported names
    RECORD_KEY,
    UNLIMITED_USER_RETRIES,
    ControllerDriverMixin,
    SpotJobFailed,
    SpotUserStepFailed,
)
from airflow_spot.records import persister
from airflow_spot.triggers.spot import SpotJobTrigger
from spot_core import jobs
from spot_core.checkpoint.uri import parse_store_uri
from spot_core.controller import Controller, JobSpec, Next
from spot_core.errors import ConfigError
from spot_core.model import Lease
from spot_core.settings import OPERATOR, SpotSettings, default, knob, knobs_for, pop_aliases

CHECKPOINT_SCHEMES = ("file://", "s3://")


Duration = timedelta | float | str  # seconds, a timedelta, or "90s" / "5m" / "2h" / "1d"


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


class SpotJobOperator(ControllerDriverMixin, BaseOperator):
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
    :param return_to_spot: move back to spot when capacity returns after a fallback (and,
        with a ``deadline_policy``, make every other move its plan makes mid-run).
    :param min_on_demand: how long an on-demand attempt runs before moving back to spot.
    :param max_spot_price: $/h above which spot pools are left alone: the job waits
        (bounded, like a capacity wait) for a cheaper window, then falls back to on-demand.
    :param capacity_wait: how long one wait for capacity (or a price window) lasts.
    :param max_capacity_waits: waits (or launches without capacity) before giving up.
    :param max_infrastructure_retries: failures outside the step's code to absorb.
    :param max_disruptions: voluntary disruptions (Kubernetes consolidation, drains) to
        absorb; they spend no preemption and never move the job to on-demand.
    :param deadline: time the job may take from its first try, in capacity time (trace
        time on the local cloud: ``"12h"`` at ``time_scale=3600`` is 12 wall seconds; wall
        time on EC2 and Kubernetes), or an absolute wall-clock ``datetime`` / ISO time.
        Near it the policy moves to on-demand; past it the task fails without retry.
    :param work: with a deadline, the compute the job needs (capacity time), so the job
        moves to on-demand when the work left plus two restarts no longer fits on spot.
    :param total_steps: with work, the checkpoint step at which the job is done (progress).
    :param restart_overhead: with work, the capacity time a new instance takes before the
        job makes progress again.
    :param deadline_policy: with a deadline and work, the deadline policy (``greedy``,
        ``uniform-progress``, ``default``, ...) that decides spot, on-demand or wait
        between attempts on a trace market (the local cloud).
    :param attempt_timeout: longest one attempt may run before it is terminated.
    :param poll_interval: time between lease observations.
    :param heartbeat_timeout: how long a lease outlives a silent driver (a killed worker
        or triggerer) before the node ends it.
    :param heartbeat_uri: a store every node can read (``s3://bucket/prefix``) where each
        triggerer or worker keeps one heartbeat for all the jobs it watches (one write per
        renewal instead of one per job). Empty: each job's heartbeat is in its own store.
    :param take_over: launch even though another driver renewed the job's heartbeat
        within its timeout (otherwise the task fails in one line naming that driver); set
        it once, after that driver is gone.
    :param observe_failure_timeout: how long observing a lease may keep failing before the
        attempt ends as infrastructure_failed.
    :param handover: when a reclaimed attempt's replacement is launched: ``on_notice``
        (beside the old one, resuming from its emergency checkpoint), ``on_rebalance``,
        ``off`` (after the old lease ended); empty: ``on_notice`` where the provider can
        launch in parallel.
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

    template_fields: Sequence[str] = (
        "command",
        "checkpoint_uri",
        "provider_options",
        "env",
        "image",
    )
    template_fields_renderers = {"provider_options": "json", "env": "json"}
    operator_extra_links = (SpotCheckpointLink(), SpotEc2InstanceLink())
    ui_color = "#f9d27a"

    def __init__(
        self,
        *,
        command: str | Sequence[str],
        checkpoint_uri: str,
        provider: str = default("provider"),
        provider_options: Mapping[str, Any] | None = None,
        image: str | None = default("image"),
        zones: Sequence[str] = default("zones"),
        env: Mapping[str, str] | None = None,
        max_preemptions: int = default("max_preemptions"),
        on_demand_fallback: bool = default("on_demand_fallback"),
        return_to_spot: bool = default("return_to_spot"),
        min_on_demand: Duration = default("min_on_demand"),
        max_spot_price: float | None = default("max_spot_price"),
        capacity_wait: Duration = default("capacity_wait"),
        max_capacity_waits: int = default("max_capacity_waits"),
        max_infrastructure_retries: int = default("max_infrastructure_retries"),
        max_disruptions: int = default("max_disruptions"),
        deadline: Duration | datetime | None = default("deadline"),
        work: Duration | None = default("work"),
        total_steps: int | None = default("total_steps"),
        restart_overhead: Duration = default("restart_overhead"),
        deadline_policy: str | None = default("deadline_policy"),
        attempt_timeout: Duration = default("attempt_timeout"),
        poll_interval: Duration = default("poll_interval"),
        heartbeat_timeout: Duration = default("heartbeat_timeout"),
        heartbeat_uri: str | None = default("heartbeat_uri"),
        take_over: bool = default("take_over"),
        handover: str | None = default("handover"),
        observe_failure_timeout: Duration = default("observe_failure_timeout"),
        alert_interruption_rate: float | None = default("alert_interruption_rate"),
        alert_spot_price: float | None = default("alert_spot_price"),
        on_spot_alert: Callable[[dict, Any], None] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        aws_conn_id: str | None = None,
        kubernetes_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        given = locals()  # first: the knobs as written (the settings model checks them)
        renamed = pop_aliases(kwargs, where=kwargs.get("task_id", ""))
        super().__init__(**kwargs)
        check_conn_id(aws_conn_id, "aws_conn_id", self.task_id)
        check_conn_id(kubernetes_conn_id, "kubernetes_conn_id", self.task_id)
        self.aws_conn_id = aws_conn_id
        self.kubernetes_conn_id = kubernetes_conn_id
        self.command = command
        self.checkpoint_uri = checkpoint_uri
        if env is not None and not isinstance(env, Mapping):
            raise ValueError(
                f"{self.task_id}: env={env!r} must be a mapping of variable "
                "names to strings, e.g. {'MODEL': 'resnet'}"
            )
        self.env = dict(env or {})
        self.image = image
        if not isinstance(deferrable, bool):
            raise ValueError(f"{self.task_id}: deferrable={deferrable!r} must be True or False")
        self.deferrable = deferrable
        self._validate_static()
        self._adopt_settings(
            self._settings(
                {
                    **{k.name: given[k.name] for k in knobs_for(OPERATOR)},
                    "provider_options": {} if provider_options is None else provider_options,
                    "zones": () if zones is None else zones,
                    **renamed,
                }
            )
        )
        if on_spot_alert is not None and not callable(on_spot_alert):
            raise ValueError(
                f"{self.task_id}: on_spot_alert={on_spot_alert!r} must be a "
                "function taking (alert, context), or None"
            )
        self.on_spot_alert = on_spot_alert
        settings = self.settings
        self.provider = settings.provider
        self.provider_options = dict(settings.provider_options)
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
            jobs.check_provider(
                settings.provider,
                settings.provider_options,
                env={k: v for k, v in self.env.items() if not _is_template(v)},
            )
        except ConfigError as exc:
            raise ValueError(f"{self.task_id}: {exc}") from None
        try:  # trigger kwargs and the task state store hold them as JSON
            json.dumps(settings.provider_options, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{self.task_id}: provider_options must be JSON-able (strings, "
                f"finite numbers, lists, mappings): {exc}"
            ) from None
        return settings

    def _validate_static(self) -> None:
        """The Airflow-side arguments, as written (templates are checked once rendered)."""
        command = self.command
        if isinstance(command, str):
            if not command.strip():
                raise ValueError(
                    f"{self.task_id}: command is empty; pass the step's command, "
                    "e.g. command=['python', '-m', 'my.train']"
                )
        elif (
            not isinstance(command, (list, tuple))
            or not command
            or not all(isinstance(a, str) for a in command)
        ):
            raise ValueError(
                f"{self.task_id}: command={command!r} must be a non-empty string "
                "or list of strings, e.g. ['python', '-m', 'my.train']"
            )
        self._check_uri(self.checkpoint_uri, ValueError)
        image = self.image
        if image is not None and not (
            isinstance(image, str)
            and image.strip()
            and (_is_template(image) or not any(c.isspace() for c in image))
        ):
            raise ValueError(
                f"{self.task_id}: image={image!r} is not an image reference; pass "
                "one like 'ghcr.io/acme/train:1.4' or drop image="
            )
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
            raise error(
                f"{self.task_id}: checkpoint_uri={uri!r} must start with file:// or "
                "s3://, e.g. file:///data/checkpoints/train or s3://bucket/train"
            )

    def _validate_rendered(self) -> None:
        """Templated fields as rendered for this run: the same checks as at parse time,
        failing the task without retries (a retry renders the same value)."""
        self._check_uri(self.checkpoint_uri, AirflowFailException)
        try:
            knob("image").parse(self.image or None)
            if not isinstance(self.provider_options, Mapping):
                raise ConfigError(
                    f"provider_options rendered as {self.provider_options!r}, not a mapping"
                )
            if not isinstance(self.env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
            ):
                raise ConfigError(f"env rendered as {self.env!r}; it must map names to strings")
            jobs.check_provider(self.provider, self.provider_options, env=self.env)
        except ConfigError as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None

    # -- building blocks ----------------------------------------------------------------------
    @property
    def spot_hook(self) -> SpotHook:
        if self._hook is None:
            self._hook = SpotHook(
                self.provider,
                self.provider_options,
                aws_conn_id=self.aws_conn_id,
                kubernetes_conn_id=self.kubernetes_conn_id,
            )
        return self._hook

    hook = spot_hook  # the operator's hook, by Airflow's usual name

    def _controller(self, context) -> Controller:
        """The mixin's controller, whose persist callback also checks the job's pools
        against the alert thresholds at each attempt end (``on_spot_alert``)."""
        check = alerts.on_attempt_end(
            lambda: self.spot_hook.get_provider().market,
            lambda: self.spot_hook.pools(self.zones),
            self.settings.alert_thresholds(),
            context,
            self.on_spot_alert,
        )
        return self.spot_hook.controller(
            self.settings,
            max_user_retries=UNLIMITED_USER_RETRIES,
            persist=persister(context, RECORD_KEY, check),
        )

    def _trigger(self, spec: JobSpec, nxt: Next, not_before: float) -> SpotJobTrigger:
        """The mixin's trigger, with the connections the triggerer resolves again by id."""
        return SpotJobTrigger(
            provider=self.settings.provider,
            **self._watch_kwargs(spec, nxt, not_before),
            aws_conn_id=self.aws_conn_id,
            kubernetes_conn_id=self.kubernetes_conn_id,
        )

    def _spec(self, job_id: str, created_at: float | None) -> JobSpec:
        command = shlex.split(self.command) if isinstance(self.command, str) else self.command
        try:
            return jobs.job_spec(
                self.settings,
                self.spot_hook.get_provider(),
                job_id=job_id,
                command=command,
                checkpoint_uri=self.checkpoint_uri,
                env=self.env,
                image=self.image or None,
                created_at=created_at,
            )
        except ConfigError as exc:  # no zone it has, a deadline the work cannot fit
            raise AirflowFailException(f"{self.task_id}: {exc}") from None

    def execute(self, context) -> dict[str, Any]:
        return self._start(context)

    def _persist_lease_link(self, context, lease: Lease | None) -> None:
        """The console page of the capacity the attempt runs on, if its provider has one
        (the EC2 console for an EC2 instance); "" before any attempt."""
        link = None if lease is None else jobs.provider_plugin(self.provider).console_link(lease)
        if lease is None or link is not None:
            SpotEc2InstanceLink.persist(context, link or "")
