"""The trigger behind ``SpotPriceWindowSensor``: wait, in the triggerer, for a cheap moment.

It fires once: when the price-window policy says the planned start has come, when a
pool's spot price is at or below ``max_price``, or at ``latest_start`` at the latest
(every wait is bounded). The decision itself is ``window_decision``, a pure function
the sensor's poke mode shares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_spot.hooks.connections import check_conn_id
from airflow_spot.hooks.spot import SpotHook
from spot_core import jobs
from spot_core.errors import ConfigError
from spot_core.model import Offer
from spot_core.settings import Knob, knob

# The window's numbers, checked like the settings model's knobs (finite, in range).
_HOURS = Knob("job_hours", "number", "", frozenset(), unit="h", minimum=0, strict=True)
_TIME = Knob("window time", "number", "", frozenset(), unit="(POSIX seconds)", minimum=0)
_MAX_PRICE = Knob(
    "max_price", "number", "", frozenset(), unit="USD/h", minimum=0, strict=True, optional=True
)
_POLL = Knob("poll_interval", "number", "", frozenset(), unit="s", minimum=0, strict=True)


def check_window_arguments(
    *,
    provider: Any,
    provider_options: Any,
    zones: Any,
    profile: Any,
    job_hours: Any,
    max_price: Any,
) -> None:
    """One ConfigError line for what the sensor and its trigger share: where prices are
    read (the provider registry's checks), the zones, the profile, the job and the price."""
    if not isinstance(provider_options, Mapping):
        raise ConfigError(f"provider_options={provider_options!r} must be a mapping")
    jobs.check_provider(provider, provider_options)
    if zones is not None and not (isinstance(zones, str) and "{{" in zones):
        knob("zones").parse(zones)
    if profile is not None:
        from spot_core.policy.price_window import HourOfWeekProfile

        if not isinstance(profile, Mapping):
            raise ConfigError(
                f"profile={type(profile).__name__} is not an HourOfWeekProfile "
                "or its to_dict(); build one with build_profile()"
            )
        try:
            HourOfWeekProfile.from_dict(profile)
        except ConfigError as exc:
            raise ConfigError(f"profile: {exc}") from None
    _HOURS.parse(job_hours)
    _MAX_PRICE.parse(max_price)


@dataclass(frozen=True)
class WindowDecision:
    start: bool
    zone: str | None
    pool: dict[str, Any] | None
    price: float | None
    reason: str
    recheck_at: float


def window_decision(
    *,
    now: float,
    offers: Sequence[Offer],
    profile: Mapping[str, Any] | None,
    job_hours: float,
    window_start: float,
    window_end: float,
    max_price: float | None,
    poll_interval: float,
) -> WindowDecision:
    """Start now or not, and where: threshold first, then the profile's plan, then the limit."""
    spot = sorted(
        (o for o in offers if o.pool.is_spot and o.available),
        key=lambda o: (o.price_per_hour, o.pool.key),
    )
    latest = window_end - job_hours * 3600.0
    if max_price is not None and spot and spot[0].price_per_hour <= max_price:
        best = spot[0]
        return WindowDecision(
            True,
            best.pool.zone,
            best.pool.to_dict(),
            best.price_per_hour,
            f"spot in {best.pool.zone} costs {best.price_per_hour:.3f} $/h, at "
            f"or below max_price {max_price:g}",
            now,
        )
    if profile is not None:
        from spot_core.policy.price_window import HourOfWeekProfile, plan_start, start_now

        plan = plan_start(
            HourOfWeekProfile.from_dict(profile),
            job_hours=job_hours,
            window_start=window_start,
            window_end=window_end,
            now=now,
            current_offers=offers,
        )
        if start_now(plan, now, tolerance_seconds=min(60.0, poll_interval)):
            pick = next((o for o in spot if o.pool.zone == plan.zone), spot[0] if spot else None)
            return WindowDecision(
                True,
                plan.zone,
                None if pick is None else pick.pool.to_dict(),
                None if pick is None else pick.price_per_hour,
                plan.reason,
                now,
            )
        if now < latest:
            return WindowDecision(
                False,
                plan.zone,
                None,
                None,
                plan.reason,
                min(plan.start_at, latest, now + poll_interval),
            )
    if now >= latest:
        cheapest = spot[0] if spot else None
        return WindowDecision(
            True,
            None if cheapest is None else cheapest.pool.zone,
            None if cheapest is None else cheapest.pool.to_dict(),
            None if cheapest is None else cheapest.price_per_hour,
            "the latest start that still ends inside the window has come",
            now,
        )
    return WindowDecision(
        False, None, None, None, "waiting for a cheaper moment", min(latest, now + poll_interval)
    )


class SpotPriceWindowTrigger(BaseTrigger):
    """Fires ``{"status": "start", "zone", "pool", "price", "reason"}`` once it is time."""

    def __init__(
        self,
        *,
        provider: str,
        provider_options: Mapping[str, Any],
        zones: Sequence[str] | None,
        profile: Mapping[str, Any] | None,
        job_hours: float,
        window_start: float,
        window_end: float,
        max_price: float | None = None,
        poll_interval: float = 60.0,
        aws_conn_id: str | None = None,
    ) -> None:
        super().__init__()
        check_conn_id(aws_conn_id, "aws_conn_id", "SpotPriceWindowTrigger")
        self.aws_conn_id = aws_conn_id  # by id only: resolved here, in the triggerer
        try:
            check_window_arguments(
                provider=provider,
                provider_options=provider_options,
                zones=zones,
                profile=profile,
                job_hours=job_hours,
                max_price=max_price,
            )
            _TIME.parse(window_start)
            _TIME.parse(window_end)
            _POLL.parse(poll_interval)
            if not window_end > window_start:
                raise ConfigError(
                    f"window_end={window_end!r} must be after window_start={window_start!r}"
                )
        except ConfigError as exc:
            raise ValueError(f"SpotPriceWindowTrigger: {exc}") from None
        self.provider = provider
        self.provider_options = dict(provider_options)
        self.zones = None if zones is None else list(zones)
        self.profile = None if profile is None else dict(profile)
        self.job_hours = float(job_hours)
        self.window_start = float(window_start)
        self.window_end = float(window_end)
        self.max_price = None if max_price is None else float(max_price)
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{self.__class__.__module__}.{self.__class__.__qualname__}",
            {
                "provider": self.provider,
                "provider_options": self.provider_options,
                "zones": self.zones,
                "profile": self.profile,
                "job_hours": self.job_hours,
                "window_start": self.window_start,
                "window_end": self.window_end,
                "max_price": self.max_price,
                "poll_interval": self.poll_interval,
                "aws_conn_id": self.aws_conn_id,
            },
        )

    def decide(self, hook: SpotHook, now: float) -> WindowDecision:
        provider = hook.get_provider()
        offers = provider.market.offers(hook.pools(self.zones), now)
        return window_decision(
            now=now,
            offers=offers,
            profile=self.profile,
            job_hours=self.job_hours,
            window_start=self.window_start,
            window_end=self.window_end,
            max_price=self.max_price,
            poll_interval=self.poll_interval,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = SpotHook(self.provider, self.provider_options, aws_conn_id=self.aws_conn_id)
        while True:
            now = time.time()
            try:
                decision = await asyncio.to_thread(self.decide, hook, now)
            except Exception as exc:  # noqa: BLE001 - reported to the sensor
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            if decision.start:
                yield TriggerEvent(
                    {
                        "status": "start",
                        "zone": decision.zone,
                        "pool": decision.pool,
                        "price": decision.price,
                        "reason": decision.reason,
                    }
                )
                return
            await asyncio.sleep(max(0.05, decision.recheck_at - time.time()))
