"""The kubernetes provider: a lease is a pod on a spot (or on-demand) node pool.

Pools come from the nodes' labels (``spot_core.market.kubernetes``: EKS managed node
groups, Karpenter, GKE Spot and preemptible, AKS spot pools). ``launch`` creates the
attempt's pod (``kubernetes_pods.build_pod``) and waits, bounded, until it is scheduled
and its step container started: a pod still unscheduled after ``unschedulable_timeout``
is a capacity miss (deleted; ``CapacityUnavailable``, the controller tries the next
pool); a container that cannot start for its configuration (``ImagePullBackOff``,
``ErrImagePull``, ``CreateContainerConfigError``) is one ``ConfigError`` carrying the
pod's message (deleted; no pool can fix it). ``observe`` answers any number of leases
with one pod list by label selector and one node list, re-reads a pod whose disruption
condition it is about to act on, and hands each to the one pod classifier
(``spot_core.policy.pod_outcomes.classify_pod``) with what only it knows: the lease's market, the
notices seen on earlier looks (so a pod stuck under one ends at its grace period plus
``notice_margin_seconds``, deleted, with grace 0 when its node is gone), whether the
step reported completion, and, when they can settle the cause, the pod's and its node's
events. The pod's life on its node (scheduling to end) is billed per second at the
pool's configured price.

Every pod carries ``spot-pipelines/managed=true``, ``spot-pipelines/job`` and
``spot-pipelines/attempt``; ``terminate`` deletes it (idempotent), ``close`` deletes
every pod this provider launched, ``cleanup_orphans`` every labelled pod (of one job).

The package in parts: ``options`` (``KubernetesOptions`` and the checks of plain options),
``cluster`` (the state every part shares and the calls they all make), ``launch`` (the
attempt's pod, started), ``observe`` (lease states, notices, completion), ``provider``
(``KubernetesProvider``: pools, bills, cleanup) and ``plugin`` (``KubernetesPlugin``: what
the engines know of this provider; the entry point
``spot_core.providers.kubernetes:KubernetesPlugin``).
"""

from spot_core.providers.kubernetes.observe import result_marker
from spot_core.providers.kubernetes.options import (
    OPTION_NAMES,
    SECONDS_OPTIONS,
    KubernetesOptions,
    check_option_names,
    check_option_value,
)
from spot_core.providers.kubernetes.plugin import KubernetesPlugin, annotate_own_pod
from spot_core.providers.kubernetes.provider import KubernetesProvider

__all__ = [
    "OPTION_NAMES",
    "SECONDS_OPTIONS",
    "KubernetesOptions",
    "KubernetesPlugin",
    "KubernetesProvider",
    "annotate_own_pod",
    "check_option_names",
    "check_option_value",
    "result_marker",
]
