"""Real traces of several zones on one clock, cut into the windows deadline policies see.

One builder for both uses of a window: ``spot-pipelines simulate`` replays policies in
them, and the deadline planner plans a live job's window on the local cloud's trace
market with it, so a policy sees the same arrays whether simulated or run for real.
Pure: traces in, arrays out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spot_core.errors import ConfigError
from spot_core.market.trace import ZoneTrace, check_compatible
from spot_core.policy.deadline.base import HISTORY_HOURS, Job, Window


@dataclass(frozen=True, eq=False)
class Replay:
    """Traces of several zones stacked on one clock, ready to cut into windows."""

    zones: tuple[str, ...]
    tick_seconds: float
    available: np.ndarray
    price: np.ndarray
    on_demand_price: float

    @classmethod
    def from_traces(
        cls, traces: Sequence[ZoneTrace], on_demand_price: float | None = None
    ) -> Replay:
        if not traces:
            raise ConfigError("no traces given; pass at least one --trace PATH")
        check_compatible(traces)
        lengths = {t.n_ticks for t in traces}
        if len(lengths) != 1:
            listed = ", ".join(f"{t.name}: {t.n_ticks}" for t in traces)
            raise ConfigError(
                f"traces have different lengths ({listed}); zones replayed "
                "together must cover the same ticks"
            )
        price = np.vstack([t.spot_price for t in traces]).astype(float)
        if not np.isfinite(price).all() or (price < 0).any():
            bad = next(
                t.name
                for t in traces
                if not np.isfinite(t.spot_price).all() or (t.spot_price < 0).any()
            )
            raise ConfigError(
                f"trace {bad} has NaN, infinite or negative spot prices; fix the "
                "price file (every tick needs a $/h value)"
            )
        od = min(t.on_demand_price for t in traces) if on_demand_price is None else on_demand_price
        if not (math.isfinite(od) and od > 0):
            raise ConfigError(f"the on-demand price must be a positive $/h, got {od!r}")
        return cls(
            tuple(t.zone for t in traces),
            traces[0].tick_seconds,
            np.vstack([t.available for t in traces]),
            price,
            float(od),
        )

    @property
    def n_ticks(self) -> int:
        return int(self.available.shape[1])

    def deadline_ticks(self, job: Job) -> int:
        """Whole ticks that end by the deadline; the job must fit in them."""
        ticks = math.floor(job.deadline_capacity_seconds / self.tick_seconds + 1e-9)
        if (
            ticks * self.tick_seconds
            < job.work_capacity_seconds + job.restart_overhead_capacity_seconds - 1e-6
        ):
            raise ConfigError(
                f"the deadline leaves {ticks} whole {self.tick_seconds:g} s ticks, "
                f"too few for {job.work_capacity_seconds / 3600:g} h of work plus one "
                "restart overhead; raise --deadline-hours"
            )
        if ticks > self.n_ticks:
            raise ConfigError(
                f"the deadline spans {ticks} ticks but the traces hold only "
                f"{self.n_ticks}; shorten the deadline or use longer traces"
            )
        return ticks

    def window(self, start: int, job: Job) -> Window:
        ticks = self.deadline_ticks(job)
        if not 0 <= start <= self.n_ticks - ticks:
            raise ConfigError(
                f"start tick {start} leaves no room for a {ticks}-tick window in "
                f"{self.n_ticks} ticks; use a start tick in [0, "
                f"{self.n_ticks - ticks}]"
            )
        past = max(0, start - int(HISTORY_HOURS * 3600 / self.tick_seconds))
        end = start + ticks
        return Window(
            start,
            ticks,
            self.tick_seconds,
            job,
            self.available[:, start:end],
            self.price[:, start:end],
            self.on_demand_price,
            self.available[:, past:start],
            self.price[:, past:start],
            self.zones,
        )
