"""Glue between a SpotConfiguration and ``spot_core.jobs``: the Prefect side of a job.

The job itself (provider, pools, spec, controller) is assembled by ``spot_core.jobs``;
what is Prefect's stays here: the credentials blocks a provider's session comes from,
and the ``spot.job.*`` events, pool alerts and progress artifact every transition feeds.
Both the task runner and the worker go through here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from prefect_spot.alerts import PoolAlerts
from prefect_spot.blocks import SpotConfiguration
from prefect_spot.events import emit_job_event
from spot_core import jobs
from spot_core.controller import Controller, JobSpec, Listener
from spot_core.errors import ConfigError
from spot_core.model import JobRecord


def open_configured_provider(config: SpotConfiguration, *, workdir: str | None = None) -> Any:
    """The provider ``config`` names, reaching its cloud with the configuration's block of
    the kind it takes (an ``aws_credentials`` AWS session, a ``cluster_config`` Kubernetes
    API client), resolved here, in the process that opens it; without one, the SDK's
    default chain. ``workdir``: a scratch folder for a provider that keeps files of its
    own on this machine (the local cloud in this process)."""
    return jobs.open_provider_for(
        config.settings(), session=session_for(config), scratch_dir=workdir
    )


def session_for(config: SpotConfiguration) -> Any:
    """The configuration's credentials of the kind its provider takes (None: none)."""
    kind = jobs.provider_plugin(config.provider).session
    if kind is jobs.SessionKind.KUBERNETES:
        return config.kubernetes_client()
    if kind is jobs.SessionKind.AWS:
        return config.aws_session()
    return None


def check_store_for(
    provider: str, store_uri: str | None, what: str, options: dict[str, Any] | None = None
) -> None:
    """A store the provider's leases can reach (its plugin says which); ConfigError naming
    ``what`` (the surface's field) and the fix."""
    problem = jobs.provider_plugin(provider).store_problem(store_uri, options or {}, what=what)
    if problem is not None:
        raise ConfigError(problem)


def lease_env(provider: str, env: dict[str, str], logger: Any = None) -> dict[str, str]:
    """``env`` as it may go to a lease of ``provider`` (off this machine, without names
    that look like credentials: a remote instance gets its access from its instance
    profile or image, and the EC2 provider writes the environment into user-data)."""
    kept, dropped = jobs.provider_plugin(provider).lease_environment(env)
    if dropped and logger is not None:
        logger.warning(
            "not passing %s to the %s lease: credentials never go into its "
            "environment; provide them on the instance (image, instance profile "
            "or a secrets manager)",
            ", ".join(dropped),
            provider,
        )
    return kept


def controller_for(
    config: SpotConfiguration,
    provider: Any,
    *,
    max_user_retries: int = 0,
    persist: Callable[[JobRecord], None] | None = None,
    related: Sequence[dict[str, str]] = (),
    progress: Listener | None = None,
    stores: Callable[[str], Any] | None = None,
) -> Controller:
    """``spot_core.jobs.assemble`` under ``config``'s settings, each transition becoming
    a ``spot.job.*`` event, a pool alert check and an update of ``progress`` (the job's
    progress artifact). ``stores`` opens the job's store (a CheckpointStorage block's;
    default: the provider's, with its credentials)."""
    settings = config.settings()
    alerts = PoolAlerts(provider.market, related=related, **settings.alert_thresholds())

    def listener(kind: str, record: JobRecord, detail: str) -> None:
        emit_job_event(kind, record, detail, related=related)
        alerts(kind, record, detail)
        if progress is not None:
            progress(kind, record, detail)

    return jobs.assemble(
        settings,
        provider,
        max_user_retries=max_user_retries,
        persist=persist,
        listener=listener,
        stores=stores,
    )


def job_spec(config: SpotConfiguration, provider: Any, **context: Any) -> JobSpec:
    """``spot_core.jobs.job_spec`` under ``config``'s settings (pools narrowed to its zones
    and instance types; deadline fields from ``created_at``, the job's JobRecord's)."""
    return jobs.job_spec(config.settings(), provider, **context)


def slug(text: str, limit: int = 40) -> str:
    """Lowercase letters, digits and dashes (what artifact keys and paths accept)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit] or "job"
