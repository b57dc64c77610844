"""``SpotPriceWindowSensor``: wait for a cheap moment to start a spot job, never too late.

It succeeds when the price-window policy (an hour-of-week price profile, see
``spot_core.policy.price_window``) says the cheapest start has come, or when a pool's
spot price is at or below ``max_price``, and at the latest when only ``job_hours``
remain before ``window_end``. It pushes the chosen pool to XCom (key ``spot_pool``) for
the job that follows. Deferrable: the wait happens in the triggerer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, conf
from airflow.sdk.exceptions import AirflowException

from airflow_spot.hooks.connections import check_conn_id
from airflow_spot.hooks.spot import SpotHook
from airflow_spot.triggers.price_window import (
    SpotPriceWindowTrigger,
    check_window_arguments,
    window_decision,
)
from spot_core.errors import ConfigError
from spot_core.settings import SpotSettings

POOL_KEY = "spot_pool"


class SpotPriceWindowSensor(BaseSensorOperator):
    """Wait until it is cheap (or latest) to start a ``job_hours`` job inside the window.

    :param job_hours: how long the job that follows runs (hours, > 0).
    :param window_end: when that job must be done: a datetime, or a timedelta after the
        sensor first runs.
    :param profile: an ``HourOfWeekProfile`` (or its ``to_dict()``) to plan the start with.
    :param max_price: start as soon as a pool's spot price is at or below this ($/h).
    :param provider / provider_options / zones: where prices are read (as SpotJobOperator).
    :param aws_conn_id: Airflow AWS connection the ec2 market reads prices with (resolved
        on the worker and again, by id, in the triggerer); None: boto3's default chain.
    """

    template_fields: Sequence[str] = ("provider_options", "zones")
    ui_color = "#c8e6c9"

    def __init__(
        self,
        *,
        job_hours: float,
        window_end: datetime | timedelta,
        profile: Any = None,
        max_price: float | None = None,
        provider: str = SpotSettings.provider,
        provider_options: Mapping[str, Any] | None = None,
        zones: Sequence[str] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 60.0)
        super().__init__(**kwargs)
        check_conn_id(aws_conn_id, "aws_conn_id", self.task_id)
        self.aws_conn_id = aws_conn_id
        if profile is None and max_price is None:
            raise ValueError(
                f"{self.task_id}: pass profile= (an HourOfWeekProfile from "
                "build_profile) or max_price= (a $/h threshold), or both"
            )
        profile = profile.to_dict() if hasattr(profile, "to_dict") else profile
        try:
            check_window_arguments(
                provider=provider,
                provider_options=provider_options or {},
                zones=zones,
                profile=profile,
                job_hours=job_hours,
                max_price=max_price,
            )
        except ConfigError as exc:
            raise ValueError(f"{self.task_id}: {exc}") from None
        if not isinstance(window_end, (datetime, timedelta)):
            raise ValueError(
                f"{self.task_id}: window_end={window_end!r} must be a datetime or a timedelta"
            )
        if isinstance(window_end, timedelta) and window_end.total_seconds() < job_hours * 3600:
            raise ValueError(
                f"{self.task_id}: a {job_hours:g} h job cannot finish within "
                f"window_end={window_end}; widen the window or shorten job_hours"
            )
        if not isinstance(deferrable, bool):
            raise ValueError(f"{self.task_id}: deferrable={deferrable!r} must be True or False")
        self.job_hours = float(job_hours)
        self.window_end = window_end
        self.profile = profile
        self.max_price = max_price
        self.provider = provider
        self.provider_options = dict(provider_options or {})
        self.zones = None if zones is None else list(zones)
        self.deferrable = deferrable

    def _window(self, context) -> tuple[float, float]:
        ti = context["ti"]
        first = getattr(ti, "start_date", None)
        start = first.timestamp() if first is not None else time.time()
        if isinstance(self.window_end, datetime):
            return start, self.window_end.timestamp()
        return start, start + self.window_end.total_seconds()

    def _trigger(self, context) -> SpotPriceWindowTrigger:
        start, end = self._window(context)
        return SpotPriceWindowTrigger(
            provider=self.provider,
            provider_options=self._hook().reopen_options,
            zones=self.zones,
            profile=self.profile,
            job_hours=self.job_hours,
            window_start=start,
            window_end=end,
            max_price=self.max_price,
            poll_interval=float(self.poke_interval),
            aws_conn_id=self.aws_conn_id,
        )

    def _hook(self) -> SpotHook:
        return SpotHook(self.provider, self.provider_options, aws_conn_id=self.aws_conn_id)

    def execute(self, context) -> Any:
        if self.deferrable:
            start, end = self._window(context)
            self.defer(
                trigger=self._trigger(context),
                method_name="execute_complete",
                timeout=timedelta(seconds=max(0.0, end - time.time()) + 600),
            )
        return super().execute(context)

    def poke(self, context) -> bool:
        trigger = self._trigger(context)
        decision = trigger.decide(self._hook(), time.time())
        self.log.info("%s: %s", "start" if decision.start else "wait", decision.reason)
        if decision.start:
            self._push(
                context,
                {
                    "zone": decision.zone,
                    "pool": decision.pool,
                    "price": decision.price,
                    "reason": decision.reason,
                },
            )
        return decision.start

    def execute_complete(self, context, event: Mapping[str, Any] | None = None) -> dict:
        if not isinstance(event, Mapping) or event.get("status") != "start":
            raise AirflowException(f"price window wait failed: {event!r}")
        choice = {k: event.get(k) for k in ("zone", "pool", "price", "reason")}
        self.log.info("start: %s", choice["reason"])
        self._push(context, choice)
        return choice

    def _push(self, context, choice: dict) -> None:
        context["ti"].xcom_push(key=POOL_KEY, value=choice)


__all__ = ["POOL_KEY", "SpotPriceWindowSensor", "window_decision"]
