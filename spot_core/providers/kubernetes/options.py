"""The kubernetes provider's options: ``KubernetesOptions``, plain JSON-able values an
engine stores and passes, and the checks of each name and value (one line naming the fix,
before anything is opened)."""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from spot_core.errors import ConfigError
from spot_core.market.kubernetes import check_prices


@dataclass(frozen=True)
class KubernetesOptions:
    """Everything the provider needs, as plain JSON-able values (``from_plain`` checks)."""

    kubeconfig: str | None = None  # path; default $KUBECONFIG or ~/.kube/config
    context: str | None = None
    in_cluster: bool | None = None  # None: the service account when in a pod
    namespace: str = "default"
    image: str | None = None  # the step's image (else the template's)
    pod_template: Mapping[str, Any] = field(default_factory=dict)  # a V1Pod as a dict
    prices: Mapping[str, Any] = field(default_factory=dict)  # see market.kubernetes
    service_account: str | None = None
    unschedulable_timeout: float = 60.0  # seconds a pod may wait for a node: then next pool
    start_timeout: float = 600.0  # seconds from scheduling to a started step
    watch_command: tuple[str, ...] = ("spot-pipelines",)
    watch_poll_interval: float = 1.0
    node_refresh_seconds: float = 5.0
    capacity_cooldown_seconds: float = 120.0
    # Annotate every step pod karpenter.sh/do-not-disrupt: "true" and
    # cluster-autoscaler.kubernetes.io/safe-to-evict: "false", so neither consolidates or
    # scales down a node under a running step (a spot reclaim still takes it).
    do_not_disrupt: bool = True
    # After a notice (its node NotReady or gone, the pod stuck Terminating) a pod that has
    # not ended within its grace period plus this margin is ended by the provider.
    notice_margin_seconds: float = 30.0

    @classmethod
    def from_plain(cls, **options: Any) -> KubernetesOptions:
        check_option_names(options)
        for name, value in options.items():
            check_option_value(name, value)
        if isinstance(options.get("watch_command"), str):
            options["watch_command"] = shlex.split(options["watch_command"])
        if "watch_command" in options:
            options["watch_command"] = tuple(options["watch_command"])
        options = {k: v for k, v in options.items() if v is not None or k == "in_cluster"}
        return cls(**options)

    def to_options(self) -> dict[str, Any]:
        """Plain JSON-able keyword arguments for ``KubernetesProvider.from_options``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["watch_command"] = list(self.watch_command)
        out["pod_template"], out["prices"] = dict(self.pod_template), dict(self.prices)
        return out


OPTION_NAMES = frozenset(f.name for f in fields(KubernetesOptions))
SECONDS_OPTIONS = (
    "unschedulable_timeout",
    "start_timeout",
    "watch_poll_interval",
    "node_refresh_seconds",
    "capacity_cooldown_seconds",
    "notice_margin_seconds",
)


def check_option_names(names: Iterable[str]) -> None:
    unknown = sorted(set(names) - OPTION_NAMES)
    if unknown:
        raise ConfigError(
            f"unknown kubernetes provider option(s) {unknown}; choose from {sorted(OPTION_NAMES)}"
        )


def check_option_value(name: str, value: Any) -> None:
    """One option's type and range, one line naming the fix. A value still holding a
    template (``{{ ... }}``) is checked once rendered."""
    if value is None or (isinstance(value, str) and "{{" in value):
        return
    if name in SECONDS_OPTIONS and not (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    ):
        raise ConfigError(
            f"kubernetes provider option {name}={value!r} must be a number of seconds > 0, e.g. 60"
        )
    if name in ("kubeconfig", "context", "namespace", "image", "service_account") and not (
        isinstance(value, str) and value.strip()
    ):
        raise ConfigError(f"kubernetes provider option {name}={value!r} must be a non-empty string")
    if name in ("in_cluster", "do_not_disrupt") and not isinstance(value, bool):
        raise ConfigError(f"kubernetes provider option {name}={value!r} must be true or false")
    if name == "pod_template" and not (
        isinstance(value, Mapping) and isinstance(value.get("spec", {}), Mapping)
    ):
        raise ConfigError(
            "kubernetes provider option pod_template must be a V1Pod as a dict, "
            "e.g. {'spec': {'containers': [{'name': 'step', 'resources': ...}]}}"
        )
    if name == "prices":
        check_prices(value)
    if name == "watch_command" and not (
        (isinstance(value, str) and value.strip())
        or (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(w, str) and w for w in value)
        )
    ):
        raise ConfigError(
            f"kubernetes provider option watch_command={value!r} must be the "
            "command that runs spot-pipelines in the image, e.g. "
            "['spot-pipelines'] or ['python', '-m', 'spot_core.cli']"
        )
