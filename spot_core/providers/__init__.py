"""Capacity providers: launch, observe and terminate leases (local, ec2, kubernetes).

Cloud SDKs are imported inside their provider modules, never here, so each is an
optional extra. ``open_provider(name, ...)`` builds one by name.
"""

from spot_core.providers.base import LaunchSpec, LeaseState, LeaseStatus, Provider

__all__ = ["LaunchSpec", "LeaseState", "LeaseStatus", "Provider"]
