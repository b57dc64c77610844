"""The EC2 provider: leases are EC2 instances, spot or on-demand, in ranked pools.

A pool is (region, availability zone, instance type, market). ``launch`` starts one
instance with ``run_instances`` (spot through ``InstanceMarketOptions``), or, in
``launch_mode="fleet"``, through an ``instant`` ``create_fleet`` whose overrides are every
subnet of the pool's zone; ``launch_any`` asks one fleet for any of several pools of a
region at once (allocation strategy ``price-capacity-optimized`` by default, or
``capacity-optimized``), which is how EC2 itself prefers to diversify.

Every instance:
- runs the step under ``spot-pipelines watch -- CMD`` from user-data (``ec2_agent``),
  with the attempt's variables exported and nothing secret in it (names that look like
  credentials are refused; the instance profile provides access), after installing a
  pinned spot-pipelines if the ``bootstrap`` option says the image lacks it
  (``ec2_bootstrap``);
- requires IMDSv2 (``HttpTokens=required``) and terminates itself when the step ends
  (``InstanceInitiatedShutdownBehavior=terminate``);
- carries ``spot-pipelines:managed=true``, ``spot-pipelines:job`` and
  ``spot-pipelines:attempt`` on the instance and its volumes (cost allocation, orphan
  cleanup), plus ``Name`` and any extra tags.

Capacity errors (``InsufficientInstanceCapacity``, ``SpotMaxPriceTooLow``,
``MaxSpotInstanceCountExceeded``, ...) become ``CapacityUnavailable`` so the controller
moves on to the next pool; throttling is backed off (bounded) in ``spot_core.adaptors.aws``.

``observe`` answers any number of leases with one ``describe_instances`` per region per
500 instances that asks only which of them have left ``pending``/``running`` (the ids plus
an ``instance-state-name`` filter: EC2 checks the ids before it filters, so an unknown id
is still an error, and an instance absent from the answer is alive). The answer is almost
always empty, where describing every watched instance cost a 3 MB answer per 1,000 and
most of a watcher's CPU. Then one ``describe_spot_instance_requests`` for the spot
requests (ids from the launch), an optional drain of an EventBridge SQS queue, and a read
of the status object the instance's watcher writes next to the checkpoints: for a running
spot instance whose notice is not yet known (at most every ``NODE_REPORT_SECONDS``; the
watcher writes it the moment it sees the notice, so ``handover=on_notice`` needs no event
queue: EC2's own API says nothing of a notice until the instance is gone), and for every
instance that has ended. When a region watches more spot requests than one call by id
answers (``DESCRIBE_BATCH``), it lists the open or active ones instead, when that takes
fewer calls (``LIST_PAGE`` per page, following ``NextToken``); a request the listing lacks
is asked by id. Answers are cut to the fields ``observe`` reads before botocore parses
them (``ec2_lean``).

Cross-region: the checkpoint stays where it was written (``checkpoint_region``); an
attempt in another region reads it from there, and the bytes of the checkpoint it resumes
from are billed at ``data_transfer_price_per_gb`` into that lease's ``Bill.cost``, itemised as
``Bill.data_transfer_cost`` (the ledger's ``data_transfer_cost``) and in ``lease.details``.

The package in parts: ``options`` (``Ec2Options`` and the checks of plain options),
``instances`` (the state every part shares and the EC2 calls on instances: describe,
terminate, list by tag), ``launch`` (instances and fleets), ``observe`` (lease states,
notices, agent reports), ``provider`` (``Ec2Provider``: pools, bills, cleanup) and
``plugin`` (``Ec2Plugin``: what the engines know of this provider; the entry point
``spot_core.providers.ec2:Ec2Plugin``).
"""

from spot_core.providers.ec2.observe import _precise_notice
from spot_core.providers.ec2.options import (
    CLOUD,
    TAG_ATTEMPT,
    TAG_JOB,
    TAG_MANAGED,
    Ec2Options,
    check_option_names,
    refuse_credentials_in_env,
)
from spot_core.providers.ec2.plugin import Ec2Plugin
from spot_core.providers.ec2.provider import Ec2Provider

__all__ = [
    "CLOUD",
    "TAG_ATTEMPT",
    "TAG_JOB",
    "TAG_MANAGED",
    "Ec2Options",
    "Ec2Plugin",
    "Ec2Provider",
    "_precise_notice",
    "check_option_names",
    "refuse_credentials_in_env",
]
