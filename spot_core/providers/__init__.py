"""Capacity providers: launch, observe and terminate leases (local, ec2), registered by name.

Cloud SDKs are imported inside their provider modules, never here, so each is an
optional extra. Each provider is registered once with an opener and an option check:
``open_provider(name, **options)`` builds one from plain, JSON-able options (a
provider's ``options`` attribute reopens it in another process: an Airflow trigger, a
Prefect worker), and ``check_provider(name, options, instance_types)`` refuses a bad
name or option set before anything opens, so a DAG fails when it is parsed and a block
when it is built, not when capacity is launched.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from spot_core.errors import ConfigError
from spot_core.providers.base import Bill, LaunchSpec, LeaseState, LeaseStatus, Provider

OptionCheck = Callable[[Mapping[str, Any], Sequence[str]], None]


@dataclass(frozen=True)
class ProviderEntry:
    """How to open one provider by name, and how to check its options without opening it."""

    name: str
    open: Callable[..., Provider]
    check_options: OptionCheck


_REGISTRY: dict[str, ProviderEntry] = {}


def register_provider(name: str, opener: Callable[..., Provider], check: OptionCheck) -> None:
    """Make ``name`` a provider every surface (CLI, operator, block, worker) accepts."""
    _REGISTRY[name] = ProviderEntry(name, opener, check)


def provider_names() -> tuple[str, ...]:
    """The providers that are built, in registration order."""
    return tuple(_REGISTRY)


def _entry(name: str) -> ProviderEntry:
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ConfigError(f"provider {name!r} is not built; choose one of "
                          f"{', '.join(_REGISTRY)}")
    return entry


def check_provider(name: str, options: Mapping[str, Any] | None = None,
                   instance_types: Sequence[str] = ()) -> None:
    """One-line ConfigError if ``name`` is not built or ``options`` do not suit it."""
    _entry(name).check_options(dict(options or {}), tuple(instance_types or ()))


def open_provider(name: str = "local", **options: Any) -> Provider:
    """The provider called ``name``, configured by ``options`` (the provider checks them
    as it opens; callers that hold options separately run ``check_provider`` first)."""
    return _entry(name).open(**options)


# -- local: the trace-driven local spot cloud --------------------------------------------------
def _open_local(**options: Any) -> Provider:
    from spot_core.providers.local import LocalProvider

    return LocalProvider.from_options(**options)


def _check_local(options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
    """Option names must be ``LocalProvider.from_options`` parameters."""
    from spot_core.providers.local import LocalProvider

    known = set(inspect.signature(LocalProvider.from_options).parameters) - {"cls"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown local provider option(s) {unknown}; choose from "
                          f"{sorted(known)}")
    scale = options.get("time_scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale) or scale <= 0):
        raise ConfigError(f"local provider option time_scale={scale!r} must be a finite "
                          "number > 0 (trace seconds per wall second, e.g. 3600)")
    tick = options.get("start_tick")
    if tick is not None and (isinstance(tick, bool) or not isinstance(tick, int) or tick < 0):
        raise ConfigError(f"local provider option start_tick={tick!r} must be a whole number "
                          ">= 0 (the trace row to start at)")


# -- ec2 -------------------------------------------------------------------------------------------
EC2_REQUIRED = ("subnets", "image_id")


def _open_ec2(**options: Any) -> Provider:
    try:
        from spot_core.providers.ec2 import Ec2Provider
    except ImportError as exc:
        raise ConfigError(f"the ec2 provider needs boto3: install spot-pipelines[aws] "
                          f"({exc})") from exc
    return Ec2Provider.from_options(**options)


def _check_ec2(options: Mapping[str, Any], instance_types: Sequence[str]) -> None:
    """Every name an ec2 option; ``subnets``, ``image_id`` and ``instance_types`` (in the
    options or the configuration's own list) present. The region may come from the
    environment of the process that opens the provider, so it is not required here."""
    from spot_core.providers.ec2 import check_option_names

    check_option_names(options)
    missing = [name for name in EC2_REQUIRED if not options.get(name)]
    if not options.get("instance_types") and not instance_types:
        missing.append("instance_types")
    if missing:
        raise ConfigError(f"provider 'ec2' needs provider_options {missing}, e.g. "
                          "{'region': 'us-east-1', 'subnets': ['subnet-...'], 'image_id': "
                          "'ami-...', 'instance_types': ['g5.xlarge'], 'instance_profile': "
                          "'spot-step'} (see docs/aws.md)")


register_provider("local", _open_local, _check_local)
register_provider("ec2", _open_ec2, _check_ec2)

# Kept for callers that list the names; the registry is the source.
PROVIDER_NAMES = provider_names()

__all__ = ["Bill", "LaunchSpec", "LeaseState", "LeaseStatus", "Provider", "PROVIDER_NAMES",
           "ProviderEntry", "check_provider", "open_provider", "provider_names",
           "register_provider"]
