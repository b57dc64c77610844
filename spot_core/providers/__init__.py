"""Capacity providers: launch, observe and terminate leases (local, ec2, kubernetes, and
any package's), each one module that declares itself in a ``ProviderPlugin``.

Cloud SDKs are imported inside their provider modules, never here, so each is an
optional extra. Providers are found by name through the ``spot_pipelines.providers``
entry-point group (``spot_core.providers.registry``); nothing is registered by hand.
``open_provider(name, **options)`` builds one from plain, JSON-able options and
``check_provider(name, options, instance_types)`` refuses a bad name or option set
before anything opens. Engine adapters reach all of this through ``spot_core.jobs``.
"""

from __future__ import annotations

from spot_core.providers.base import (
    Bill,
    Capability,
    LaunchSpec,
    LeaseState,
    LeaseStatus,
    Provider,
    ProviderPlugin,
    SessionKind,
)
from spot_core.providers.registry import (
    check_provider,
    open_provider,
    provider_names,
    provider_plugin,
    refuse_credentials,
)

__all__ = [
    "Bill",
    "Capability",
    "LaunchSpec",
    "LeaseState",
    "LeaseStatus",
    "Provider",
    "ProviderPlugin",
    "SessionKind",
    "check_provider",
    "open_provider",
    "provider_names",
    "provider_plugin",
    "refuse_credentials",
]
