"""Pure policies: observations and ``now`` in, decisions out. No I/O, no clock.

- ``ranking``: which spot pool to try first (price with interruptions priced in).
- ``retry``: launch on spot / on-demand, wait, fail or done, with separate budgets.
- ``checkpoint_interval``: Young/Daly interval from the observed interruption rate.

Strategies are registered by name (``RANKINGS``, ``RETRY_POLICIES``, ``FORMULAS``) so
configuration can pick one with a string.
"""

from spot_core.policy.checkpoint_interval import (
    FORMULAS,
    checkpoint_interval,
    daly_interval,
    young_interval,
)
from spot_core.policy.ranking import RANKINGS, RankingConfig, effective_price, rank_pools
from spot_core.policy.registry import Registry
from spot_core.policy.retry import RETRY_POLICIES, Decision, RetryPolicy, decide_next

__all__ = [
    "FORMULAS",
    "RANKINGS",
    "RETRY_POLICIES",
    "Decision",
    "RankingConfig",
    "Registry",
    "RetryPolicy",
    "checkpoint_interval",
    "daly_interval",
    "decide_next",
    "effective_price",
    "rank_pools",
    "young_interval",
]
