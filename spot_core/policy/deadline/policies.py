"""Deadline policies by name: what ``spot-pipelines simulate --policy`` and the controller
choose from. ``default`` always answers with the project's best (today ``forecast-dp``);
``optimal`` is not here because it is an offline bound, not a policy a live job can run
(the simulator answers it by name).

Your own policy: an object (or a class, made with no arguments) with ``plan(window)``
returning ``decide(t, progress, current, left)``, named by an installed package under the
``spot_pipelines.deadline_policies`` entry-point group (docs/local-cloud.md). It is
planned on the same causal view of the window as these, in the simulator and live."""

from __future__ import annotations

from spot_core.policy.deadline.base import AlwaysOnDemand, DeadlinePolicy, Greedy, UniformProgress
from spot_core.policy.deadline.mdp import ForecastDP
from spot_core.policy.registry import Registry

DEADLINE_POLICIES: Registry[DeadlinePolicy] = Registry(
    "deadline policy", entry_point_group="spot_pipelines.deadline_policies", method="plan"
)
DEADLINE_POLICIES.register("on-demand", AlwaysOnDemand())
DEADLINE_POLICIES.register("greedy", Greedy())
DEADLINE_POLICIES.register("uniform-progress", UniformProgress())
DEADLINE_POLICIES.register("forecast-dp", ForecastDP())
DEADLINE_POLICIES.register("default", DEADLINE_POLICIES.get("forecast-dp"))
