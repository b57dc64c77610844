"""How often to checkpoint: the Young/Daly optimum for the observed interruption rate.

Checkpointing too often wastes time writing; too rarely loses work at each interruption.
Young (1974) puts the optimum at ``sqrt(2 C M)`` for checkpoint cost ``C`` and mean time
between interruptions ``M``; Daly (2006) adds higher-order terms that matter when ``C``
is not small against ``M``, and caps the interval at ``M`` when checkpoints are so dear
(``C >= 2M``) that the expansion no longer holds. All times are seconds.

On spot the interruption notice (2 minutes on AWS) usually allows an emergency save, so
this interval is the safety net for notices that are missed or too short.
"""

from __future__ import annotations

import math
from typing import Literal

from spot_core.errors import ConfigError
from spot_core.policy.registry import Registry


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def young_interval(checkpoint_seconds: float, mtbi_seconds: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)``."""
    _check_positive(checkpoint_seconds=checkpoint_seconds, mtbi_seconds=mtbi_seconds)
    return math.sqrt(2.0 * checkpoint_seconds * mtbi_seconds)


def daly_interval(checkpoint_seconds: float, mtbi_seconds: float) -> float:
    """Daly's higher-order optimum (Daly 2006, "A higher order estimate of the optimum
    checkpoint interval for restart dumps").

    ``sqrt(2CM) * (1 + sqrt(C/(2M))/3 + C/(18M)) - C`` for ``C < 2M``, else ``M``.
    """
    c, m = checkpoint_seconds, mtbi_seconds
    _check_positive(checkpoint_seconds=c, mtbi_seconds=m)
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


FORMULAS: Registry = Registry("checkpoint interval formula", default="daly")
FORMULAS.register("daly", daly_interval)
FORMULAS.register("young", young_interval)


def checkpoint_interval(checkpoint_seconds: float, interruptions_per_hour: float, *,
                        min_seconds: float = 60.0, max_seconds: float = 3600.0,
                        formula: Literal["daly", "young"] = "daly") -> float:
    """Seconds between checkpoints for a pool interrupting at the observed rate.

    A rate of zero means no interruption has been seen: checkpoint at ``max_seconds``,
    the longest gap the user will tolerate losing. The result is clamped to
    ``[min_seconds, max_seconds]`` so a burst of interruptions cannot make the job spend
    its time writing checkpoints.
    """
    _check_positive(checkpoint_seconds=checkpoint_seconds, min_seconds=min_seconds,
                    max_seconds=max_seconds)
    if min_seconds > max_seconds:
        raise ConfigError(f"min_seconds ({min_seconds}) must not exceed max_seconds "
                          f"({max_seconds})")
    if not (interruptions_per_hour >= 0 and math.isfinite(interruptions_per_hour)):
        raise ConfigError(f"interruptions_per_hour must be >= 0, got {interruptions_per_hour!r}")
    if interruptions_per_hour == 0:
        return float(max_seconds)
    tau = FORMULAS.get(formula)(checkpoint_seconds, 3600.0 / interruptions_per_hour)
    return float(min(max(tau, min_seconds), max_seconds))
