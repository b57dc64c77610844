"""A market that replays real traces on the wall clock.

Tick ``k`` of every trace starts at wall time ``tick_origin + k * tick_seconds /
time_scale``; ``time_scale`` > 1 replays faster than real time (the local spot cloud
does, so a 2-day trace passes in minutes). Past the end, the trace starts over
(``wrap=True``) or holds its last tick. Statistics look only backwards from ``now``,
so a policy fed by this market cannot peek into the future it is being tested on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from spot_core.bounds import MAX_TIME_SCALE, MIN_TICK_WALL_SECONDS
from spot_core.errors import ConfigError
from spot_core.market.advisor import SpotAdvisor
from spot_core.market.base import PoolStat
from spot_core.market.trace import ZoneTrace, check_compatible, count_preemptions
from spot_core.model import Market, Offer, Pool


def check_time_scale(time_scale: object, tick_seconds: float, *, name: str = "time_scale") -> float:
    """``time_scale`` (trace seconds per wall second) as a float, if one tick of
    ``tick_seconds`` lasts at least ``MIN_TICK_WALL_SECONDS`` of wall time; else one
    ConfigError line naming ``name`` (a flag, an option). Past it, the local cloud spun a
    core once per tick (``--time-scale 1e12``)."""
    most = min(MAX_TIME_SCALE, tick_seconds / MIN_TICK_WALL_SECONDS)
    if (
        isinstance(time_scale, bool)
        or not isinstance(time_scale, (int, float))
        or not (math.isfinite(time_scale) and 0 < time_scale <= most)
    ):
        raise ConfigError(
            f"{name} {time_scale!r} must be a finite number > 0 and at most "
            f"{most:,.0f} (trace seconds per wall second: one {tick_seconds:g} s "
            f"tick must last at least {MIN_TICK_WALL_SECONDS * 1000:g} ms), "
            "e.g. 3600"
        )
    return float(time_scale)


class TraceMarket:
    """Offers, availability, prices and look-back statistics from replayed traces."""

    def __init__(
        self,
        traces: Sequence[ZoneTrace],
        tick_origin: float,
        time_scale: float = 1.0,
        *,
        wrap: bool = True,
        lookback_hours: float = 24.0,
        advisor: SpotAdvisor | None = None,
    ) -> None:
        if not traces:
            raise ConfigError("TraceMarket needs at least one trace; load some with load_traces()")
        if not (
            isinstance(lookback_hours, (int, float))
            and math.isfinite(lookback_hours)
            and lookback_hours > 0
        ):
            raise ConfigError(f"lookback_hours ({lookback_hours!r}) must be a finite number > 0")
        check_compatible(traces)
        check_time_scale(time_scale, traces[0].tick_seconds)
        self.traces = tuple(traces)
        self.tick_origin = float(tick_origin)
        self.time_scale = float(time_scale)
        self.wrap = wrap
        self.lookback_hours = float(lookback_hours)
        self.advisor = advisor
        self.tick_seconds = self.traces[0].tick_seconds

    # -- clock ------------------------------------------------------------------------------
    def tick_at(self, now: float) -> int:
        """The absolute tick index at wall time ``now`` (0 before the origin; may pass the end)."""
        elapsed = (now - self.tick_origin) * self.time_scale
        return max(0, math.floor(elapsed / self.tick_seconds + 1e-9))

    def wall_time(self, tick: int) -> float:
        """When absolute tick ``tick`` begins, on the wall clock."""
        return self.tick_origin + tick * self.tick_seconds / self.time_scale

    def _index(self, trace: ZoneTrace, tick: int) -> int:
        return tick % trace.n_ticks if self.wrap else min(tick, trace.n_ticks - 1)

    # -- lookup -----------------------------------------------------------------------------
    def trace(self, zone: str, instance_type: str | None = None) -> ZoneTrace:
        """The trace for a trace name or a zone (and instance type, if zones repeat)."""
        matches = [t for t in self.traces if zone in (t.name, t.zone)]
        if instance_type is not None and len(matches) > 1:
            matches = [t for t in matches if t.instance_type == instance_type] or matches
        if len(matches) == 1:
            return matches[0]
        known = ", ".join(t.name for t in self.traces)
        problem = "several traces" if matches else "no trace"
        raise ConfigError(
            f"{problem} for zone {zone!r} in this market ({known}); "
            "name pools after the traces' zones"
        )

    def _trace_for(self, pool: Pool) -> ZoneTrace:
        if pool.is_spot or any(pool.zone in (t.name, t.zone) for t in self.traces):
            return self.trace(pool.zone, pool.instance_type)
        same_region = [t for t in self.traces if t.region == pool.region]
        if not same_region:
            raise ConfigError(
                f"no trace prices on-demand capacity in {pool.region}; add a trace "
                "of that region or drop the pool"
            )
        return same_region[0]

    def pools(self, market: Market = Market.SPOT) -> tuple[Pool, ...]:
        """One pool per trace, named after the trace's zone and measured instance type."""
        return tuple(
            Pool(
                cloud=t.cloud,
                region=t.region,
                zone=t.zone,
                instance_type=t.instance_type,
                market=Market(market),
            )
            for t in self.traces
        )

    # -- the Market protocol ----------------------------------------------------------------
    def offers(self, pools: Sequence[Pool], now: float) -> list[Offer]:
        """Spot pools as the trace says at ``now``; on-demand pools always available."""
        return [self._offer(pool, now) for pool in pools]

    def _offer(self, pool: Pool, now: float) -> Offer:
        trace = self._trace_for(pool)
        i = self._index(trace, self.tick_at(now))
        band = None
        if self.advisor is not None:
            found = self.advisor.find_band(pool.region, pool.instance_type)
            band = None if found is None else found.label
        if not pool.is_spot:
            return Offer(pool, trace.on_demand_price, trace.on_demand_price, True, now)
        return Offer(
            pool,
            float(trace.spot_price[i]),
            trace.on_demand_price,
            bool(trace.available[i]),
            now,
            interruption_band=band,
        )

    def is_available(self, zone: str, now: float) -> bool:
        trace = self.trace(zone)
        return bool(trace.available[self._index(trace, self.tick_at(now))])

    def price(self, zone: str, now: float) -> float:
        trace = self.trace(zone)
        return float(trace.spot_price[self._index(trace, self.tick_at(now))])

    def next_change(self, zone: str, now: float) -> float | None:
        """Wall time at which the zone's availability next flips; None if it never does."""
        trace = self.trace(zone)
        tick = self.tick_at(now)
        i = self._index(trace, tick)
        ahead = trace.available[i + 1 :]
        if self.wrap:
            ahead = np.concatenate([ahead, trace.available[: i + 1]])
        elif tick >= trace.n_ticks - 1:
            return None
        flips = np.flatnonzero(ahead != trace.available[i])
        return None if flips.size == 0 else self.wall_time(tick + 1 + int(flips[0]))

    # -- look-back statistics --------------------------------------------------------------
    def window(self, zone: str, now: float, hours: float | None = None) -> np.ndarray:
        """Availability over the look-back window ending with the tick at ``now``, inclusive."""
        trace = self.trace(zone)
        tick = self.tick_at(now)
        span = max(1, round((hours or self.lookback_hours) * 3600 / self.tick_seconds))
        ticks = np.arange(max(0, tick - span + 1), tick + 1)
        index = ticks % trace.n_ticks if self.wrap else np.minimum(ticks, trace.n_ticks - 1)
        return trace.available[index]

    def observed(self, zone: str, now: float, hours: float | None = None) -> PoolStat:
        """Availability fraction and preemptions per trace hour, seen up to ``now``."""
        seen = self.window(zone, now, hours)
        observed_hours = seen.size * self.tick_seconds / 3600
        return PoolStat(
            float(seen.mean()), count_preemptions(seen) / observed_hours, observed_hours
        )

    def stats(self, pools: Sequence[Pool], now: float) -> dict[str, PoolStat]:
        """``pool.key -> PoolStat``; on-demand pools never lose capacity."""
        return {
            pool.key: self.observed(self._trace_for(pool).name, now)
            if pool.is_spot
            else PoolStat(1.0, 0.0, None)
            for pool in pools
        }
