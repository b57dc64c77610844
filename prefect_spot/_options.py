"""Checks of a configuration's provider options that need no cloud and no Prefect.

Below both the blocks (whose validators call it when a SpotConfiguration is built) and
the job glue in ``_jobs`` (which calls it again before it opens the provider), so neither
imports the other to share it.
"""

from __future__ import annotations

from typing import Any, Sequence

from spot_core.errors import ConfigError


EC2_REQUIRED = ("subnets", "image_id")


def check_provider_options(provider: str, options: dict[str, Any],
                           instance_types: Sequence[str] = ()) -> None:
    """Check ``provider_options`` without touching the cloud; ConfigError says what to fix.

    For ``ec2``: every name must be an ec2 provider option (the provider's own check),
    and ``subnets``, ``image_id`` and ``instance_types`` (here or in the configuration's
    ``instance_types``) must be there. The region may come from the environment of the
    process that opens the provider, so it is not required here. The local provider
    checks its own options when it opens.
    """
    if provider != "ec2":
        return
    from spot_core.providers.ec2 import check_option_names

    check_option_names(options)
    missing = [name for name in EC2_REQUIRED if not options.get(name)]
    if not options.get("instance_types") and not instance_types:
        missing.append("instance_types")
    if missing:
        raise ConfigError(f"provider 'ec2' needs provider_options {missing}, e.g. "
                          "{'region': 'us-east-1', 'subnets': ['subnet-...'], 'image_id': "
                          "'ami-...', 'instance_types': ['g5.xlarge'], 'instance_profile': "
                          "'spot-step'} (see docs/prefect.md)")
