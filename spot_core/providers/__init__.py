"""Capacity providers: launch, observe and terminate leases (local, ec2, kubernetes).

Cloud SDKs are imported inside their provider modules, never here, so each is an
optional extra. ``open_provider(name, **options)`` builds one by name from plain,
JSON-able options; a provider's ``options`` attribute reopens it in another process
(an Airflow trigger, a Prefect worker).
"""

from __future__ import annotations

from typing import Any

from spot_core.errors import ConfigError
from spot_core.providers.base import Bill, LaunchSpec, LeaseState, LeaseStatus, Provider

PROVIDER_NAMES = ("local", "ec2", "kubernetes")


def open_provider(name: str = "local", **options: Any) -> Provider:
    """The provider called ``name``, configured by ``options``."""
    if name == "local":
        from spot_core.providers.local import LocalProvider

        return LocalProvider.from_options(**options)
    if name == "ec2":
        try:
            from spot_core.providers.ec2 import Ec2Provider
        except ImportError as exc:
            raise ConfigError(f"the ec2 provider needs boto3: install spot-pipelines[aws] "
                              f"({exc})") from exc
        return Ec2Provider.from_options(**options)
    raise ConfigError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDER_NAMES[:2])} "
                      "(kubernetes is not built yet)")


__all__ = ["Bill", "LaunchSpec", "LeaseState", "LeaseStatus", "Provider", "PROVIDER_NAMES",
           "open_provider"]
