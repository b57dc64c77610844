"""The deadline policies' safety rule for live jobs, in wall-clock seconds.

The simulator's policies decide tick by tick; a live job under the controller decides
at each launch and each observation. What carries over unchanged is the rule that makes
every simulated policy (and the default) never miss a deadline: with ``w`` seconds of
work left and restart overhead ``R``, a job that is not on spot must go on-demand once
the time left is no more than ``w + 2R`` (rounded up to whole ticks), because a spot
attempt started later could be reclaimed and still need one more restart on on-demand.
``spot_core.policy.retry.decide_next`` consults it when it is told the work left.

That rule is all a job gets on markets without traces (EC2). On a trace market, a job
that names a ``deadline_policy`` is run by that policy itself, planned on the same window
the simulator would cut (``spot_core.policy.deadline.planner``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spot_core.errors import ConfigError


@dataclass(frozen=True)
class DeadlineWork:
    """What the controller knows about a deadline-bound job's remaining work."""

    work_left_seconds: float
    restart_overhead_seconds: float
    tick_seconds: float = 60.0

    def __post_init__(self) -> None:
        values = (self.work_left_seconds, self.restart_overhead_seconds, self.tick_seconds)
        finite = all(math.isfinite(v) for v in values)
        if not finite or min(values) < 0 or not self.tick_seconds > 0:
            raise ConfigError(
                "DeadlineWork needs finite work_left_seconds >= 0, "
                "restart_overhead_seconds >= 0 and tick_seconds > 0"
            )

    def slack_seconds(self, deadline: float, now: float) -> float:
        """Idle time the job can still afford, keeping room for two restarts."""
        return self._ticks_left(deadline, now) * self.tick_seconds - self._needed(2)

    def forces_on_demand(self, deadline: float, now: float) -> bool:
        """True once a job not on spot must run on on-demand to finish by ``deadline``."""
        return self._ticks_left(deadline, now) <= math.ceil(
            self._needed(2) / self.tick_seconds - 1e-9
        )

    def _ticks_left(self, deadline: float, now: float) -> int:
        return math.floor((deadline - now) / self.tick_seconds + 1e-9)

    def _needed(self, restarts: int) -> float:
        return self.work_left_seconds + restarts * self.restart_overhead_seconds
