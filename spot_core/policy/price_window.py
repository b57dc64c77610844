"""Price-window start: when (and where) to start a job that may start any time in a window.

A job of ``job_hours`` may start any time in ``[window_start, window_end]`` and must end
by ``window_end``. Spot prices and availability repeat by hour of the week (working
hours and weekends differ), so the history is folded into a 168-slot
``HourOfWeekProfile`` per zone, and each candidate start is scored by the expected cost
of running through it: in every hour, spot with the hour's availability probability,
on-demand otherwise. The profile is built only from data before ``until``, and
``plan_start`` only reads the profile plus the offers observed at ``now``: nothing here
can peek at the future of a trace it is evaluated on.

Hour-of-week is UTC with Monday 00:00 = 0 (the POSIX epoch fell on a Thursday, hour 72).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from spot_core.errors import ConfigError
from spot_core.market.trace import ZoneTrace
from spot_core.model import Offer

HOURS_PER_WEEK = 168
EPOCH_HOUR_OF_WEEK = 72
"""1970-01-01 00:00 UTC was a Thursday: hour 72 of a week that starts on Monday."""


def hour_of_week(moment: float) -> int:
    """Hour-of-week slot (UTC, Monday 00:00 = 0) of a POSIX time."""
    return int((math.floor(moment / 3600) + EPOCH_HOUR_OF_WEEK) % HOURS_PER_WEEK)


@dataclass(frozen=True)
class HourOfWeekProfile:
    """Mean spot $/h and availability per zone and hour of the week, plus on-demand $/h."""

    zone_prices: Mapping[str, tuple[float, ...]]
    zone_availability: Mapping[str, tuple[float, ...]]
    on_demand_price: float

    def __post_init__(self) -> None:
        prices = {str(z): _slots(v, f"zone_prices[{z!r}]") for z, v in self.zone_prices.items()}
        avail = {
            str(z): _slots(v, f"zone_availability[{z!r}]")
            for z, v in self.zone_availability.items()
        }
        if not prices or set(prices) != set(avail):
            raise ConfigError(
                "HourOfWeekProfile needs the same non-empty set of zones in "
                "zone_prices and zone_availability; rebuild it with build_profile()"
            )
        if any(not 0.0 <= a <= 1.0 for series in avail.values() for a in series):
            raise ConfigError("HourOfWeekProfile availability fractions must lie in [0, 1]")
        if not (math.isfinite(self.on_demand_price) and self.on_demand_price > 0):
            raise ConfigError(
                f"HourOfWeekProfile.on_demand_price must be a positive $/h, got "
                f"{self.on_demand_price!r}"
            )
        object.__setattr__(self, "zone_prices", MappingProxyType(prices))
        object.__setattr__(self, "zone_availability", MappingProxyType(avail))
        object.__setattr__(self, "on_demand_price", float(self.on_demand_price))

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(sorted(self.zone_prices))

    def expected_rate(self, zone: str) -> np.ndarray:
        """Expected $/h per hour-of-week slot: spot when available, on-demand otherwise."""
        avail = np.asarray(self.zone_availability[zone])
        rate: np.ndarray = (
            avail * np.asarray(self.zone_prices[zone]) + (1 - avail) * self.on_demand_price
        )
        return rate

    def to_dict(self) -> dict[str, Any]:
        return {
            "zone_prices": {z: list(v) for z, v in sorted(self.zone_prices.items())},
            "zone_availability": {z: list(v) for z, v in sorted(self.zone_availability.items())},
            "on_demand_price": self.on_demand_price,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HourOfWeekProfile:
        try:
            return cls(
                zone_prices=dict(data["zone_prices"]),
                zone_availability=dict(data["zone_availability"]),
                on_demand_price=float(data["on_demand_price"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"HourOfWeekProfile dict is malformed ({type(exc).__name__}: "
                f"{exc}); pass what HourOfWeekProfile.to_dict() produced"
            ) from exc


def _slots(values: Any, where: str) -> tuple[float, ...]:
    try:
        series = tuple(float(v) for v in values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where} must be {HOURS_PER_WEEK} numbers ({exc})") from exc
    if len(series) != HOURS_PER_WEEK or not all(math.isfinite(v) for v in series):
        raise ConfigError(
            f"{where} must be {HOURS_PER_WEEK} finite numbers (one per hour of "
            f"the week, Monday 00:00 UTC first), got {len(series)}"
        )
    return series


# -- building a profile from history ------------------------------------------------------------
def build_profile(
    traces: Sequence[ZoneTrace], *, until: float | None = None, origin: float | None = None
) -> HourOfWeekProfile:
    """Fold the traces' history before ``until`` into an hour-of-week profile per zone.

    Tick ``i`` of a trace happens at ``start_time + i * tick`` (``origin`` stands in for
    traces without a start time, e.g. JSON traces). Hours of the week never seen take
    the zone's overall mean, so a short history still yields a full profile.
    """
    if not traces:
        raise ConfigError("build_profile needs at least one trace")
    zones = [t.zone for t in traces]
    if len(set(zones)) != len(zones):
        raise ConfigError(
            f"build_profile got zones more than once ({', '.join(zones)}); pass one trace per zone"
        )
    prices: dict[str, tuple[float, ...]] = {}
    avail: dict[str, tuple[float, ...]] = {}
    for trace in traces:
        prices[trace.zone], avail[trace.zone] = _fold(trace, until, origin)
    od = float(np.mean([t.on_demand_price for t in traces]))
    return HourOfWeekProfile(prices, avail, od)


def _fold(
    trace: ZoneTrace, until: float | None, origin: float | None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    start = trace.start_time if trace.start_time is not None else origin
    if start is None:
        raise ConfigError(
            f"trace {trace.name} has no start time; pass origin= (POSIX seconds "
            "of its first tick) to build_profile"
        )
    times = start + trace.tick_seconds * np.arange(trace.n_ticks)
    seen = times < until if until is not None else np.ones(times.size, dtype=bool)
    if not seen.any():
        raise ConfigError(
            f"trace {trace.name} has no ticks before until={until}; a profile needs some history"
        )
    slots = ((np.floor(times[seen] / 3600) + EPOCH_HOUR_OF_WEEK) % HOURS_PER_WEEK).astype(int)
    price = _slot_means(slots, np.asarray(trace.spot_price)[seen])
    up = _slot_means(slots, np.asarray(trace.available, dtype=float)[seen])
    return price, up


def _slot_means(slots: np.ndarray, values: np.ndarray) -> tuple[float, ...]:
    if not np.isfinite(values).all():
        raise ConfigError("trace history holds NaN or infinite prices; clean the price file")
    counts = np.bincount(slots, minlength=HOURS_PER_WEEK)
    sums = np.bincount(slots, weights=values, minlength=HOURS_PER_WEEK)
    means = np.where(counts > 0, sums / np.maximum(counts, 1), values.mean())
    return tuple(float(v) for v in means)


# -- planning a start ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StartPlan:
    """When and where to start, what it is expected to cost, and why."""

    start_at: float
    zone: str
    expected_cost: float
    reason: str


def plan_start(
    profile: HourOfWeekProfile,
    *,
    job_hours: float,
    window_start: float,
    window_end: float,
    now: float,
    current_offers: Sequence[Offer] = (),
) -> StartPlan:
    """The cheapest expected (start, zone) that still finishes by ``window_end``.

    Candidates are ``max(now, window_start)``, every hour boundary after it, and the
    latest start that still ends in time. For the hour after ``now``, a zone's observed
    offer (price and whether it has capacity) replaces the profile's forecast, because
    the present is better known than its average. Ties go to the earliest start.
    """
    seconds = _validated_seconds(job_hours, window_start, window_end)
    earliest = max(now, window_start)
    latest = window_end - seconds
    if earliest > latest:
        return _late_plan(profile, now, seconds, current_offers)
    best: tuple[float, float, str] | None = None
    for start in _candidate_starts(earliest, latest):
        for zone in profile.zones:
            cost = _expected_cost(profile, zone, start, start + seconds, now, current_offers)
            if best is None or cost < best[0] - 1e-9:
                best = (cost, start, zone)
    if best is None:  # never: a profile has zones, and the window at least one start
        raise ValueError(f"no start between {earliest} and {latest} to plan")
    cost, start, zone = best
    return StartPlan(start, zone, cost, _reason(profile, zone, start, now, cost, seconds))


def start_now(plan: StartPlan, now: float, *, tolerance_seconds: float = 60.0) -> bool:
    """Whether the plan's start has come (within ``tolerance_seconds``)."""
    return now >= plan.start_at - tolerance_seconds


def _validated_seconds(job_hours: float, window_start: float, window_end: float) -> float:
    values = (job_hours, window_start, window_end)
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise ConfigError("plan_start needs finite job_hours, window_start and window_end")
    if not job_hours > 0:
        raise ConfigError(f"job_hours must be > 0, got {job_hours}")
    seconds = job_hours * 3600.0
    if seconds > window_end - window_start + 1e-6:
        raise ConfigError(
            f"a {job_hours:g} h job cannot finish inside a "
            f"{(window_end - window_start) / 3600:g} h window; widen the window "
            "or shorten the job"
        )
    return seconds


def _candidate_starts(earliest: float, latest: float) -> list[float]:
    first_boundary = math.floor(earliest / 3600) * 3600 + 3600
    hourly = np.arange(first_boundary, latest, 3600.0).tolist()
    return (
        [earliest]
        + [float(t) for t in hourly if t > earliest]
        + ([latest] if latest > earliest else [])
    )


def _late_plan(
    profile: HourOfWeekProfile, now: float, seconds: float, offers: Sequence[Offer]
) -> StartPlan:
    """The window is (nearly) over: start now in the zone expected cheapest."""
    costs = {z: _expected_cost(profile, z, now, now + seconds, now, offers) for z in profile.zones}
    zone = min(costs, key=lambda z: (costs[z], z))
    return StartPlan(
        now,
        zone,
        costs[zone],
        "the latest start that ends in the window has "
        "passed; starting now to finish as early as possible",
    )


def _expected_cost(
    profile: HourOfWeekProfile,
    zone: str,
    start: float,
    end: float,
    now: float,
    offers: Sequence[Offer],
) -> float:
    rate = profile.expected_rate(zone)
    total = _integral(rate, start, end)
    observed = _observed_rate(profile, zone, offers)
    if observed is not None:
        lo, hi = max(start, now), min(end, now + 3600.0)
        if hi > lo:
            total += observed * (hi - lo) / 3600 - _integral(rate, lo, hi)
    return float(total)


def _observed_rate(profile: HourOfWeekProfile, zone: str, offers: Sequence[Offer]) -> float | None:
    for offer in offers:
        if offer.pool.zone == zone and offer.pool.is_spot:
            od = offer.on_demand_price_per_hour or profile.on_demand_price
            return offer.price_per_hour if offer.available else od
    return None


def _integral(rate: np.ndarray, start: float, end: float) -> float:
    """Dollars from ``start`` to ``end`` (POSIX s) at an hour-of-week rate ($/h)."""
    return _cumulative(rate, end) - _cumulative(rate, start)


def _cumulative(rate: np.ndarray, moment: float) -> float:
    hours = moment / 3600 + EPOCH_HOUR_OF_WEEK
    weeks, into = divmod(hours, HOURS_PER_WEEK)
    whole = int(into)
    return float(weeks * rate.sum() + rate[:whole].sum() + (into - whole) * rate[whole])


def _reason(
    profile: HourOfWeekProfile, zone: str, start: float, now: float, cost: float, seconds: float
) -> str:
    od = profile.on_demand_price * seconds / 3600
    when = "now" if start <= now + 1e-6 else f"in {(start - now) / 3600:.1f} h"
    return (
        f"start {when} in {zone}: expected {cost:.2f} $ against {od:.2f} $ on on-demand, "
        "the cheapest start and zone by the hour-of-week profile"
    )
