"""Glue between a SpotConfiguration and the engine-agnostic controller.

Opens the provider the configuration names, narrows its pools (zones, instance types),
and runs one job under the controller with Prefect events, pool alerts and a progress
artifact for every transition. Both the task runner and the worker go through here.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, Callable, Sequence

from spot_core.controller import Controller, JobSpec, Listener
from spot_core.errors import ConfigError
from spot_core.model import JobRecord, Pool
from spot_core.providers import check_provider

from prefect_spot.alerts import PoolAlerts
from prefect_spot.blocks import SpotConfiguration
from prefect_spot.events import emit_job_event


LOCAL_PROVIDER = "local"


def open_configured_provider(config: SpotConfiguration, **local_defaults: Any):
    """The provider ``config`` names; its options override ``local_defaults``.

    ``local_defaults`` (a scratch ``workdir`` for an in-process cloud) apply to the local
    provider only; other providers get exactly their ``provider_options`` (the ec2
    provider's ``region`` defaults to its ``aws_credentials`` block's region, then
    ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, and its ``instance_types`` to the
    configuration's). The provider reaches AWS with the configuration's
    ``aws_credentials`` block (boto3's default chain without one), and the kubernetes
    provider its cluster with the ``cluster_config`` block, made into an ``ApiClient``
    here, in the process that opens it (without one: its kubeconfig options, else the
    default kubeconfig or service account). Uses ``spot_core.providers.open_provider``
    when the core has it (so a running local cloud server can be shared across
    processes), else an in-process local cloud.
    """
    check_provider_options(config.provider, config.provider_options, config.instance_types)
    session = _session(config)  # the credentials block's, resolved here
    if config.provider == LOCAL_PROVIDER and config.provider_options.get("url"):
        options = dict(config.provider_options)  # a server's; its workdir is the server's
    elif config.provider == LOCAL_PROVIDER:
        options = {**local_defaults, **config.provider_options}
    elif config.provider == "ec2":
        options = _ec2_defaults(config.provider_options, config.instance_types,
                                None if session is None else session.region)
    else:
        options = dict(config.provider_options)
    try:
        from spot_core.providers import open_provider  # type: ignore[attr-defined]
    except ImportError:
        open_provider = None
    if open_provider is not None:
        return open_provider(config.provider, session=session, **options)
    if config.provider != LOCAL_PROVIDER:
        raise ConfigError(f"provider {config.provider!r} is not available here; use 'local'")
    if options.get("url"):
        raise ConfigError("provider_options.url needs spot_core.providers.open_provider "
                          "(the local cloud server), which this spot-pipelines lacks")
    from spot_core.providers.local import LocalProvider

    allowed = {"time_scale", "start_tick", "workdir"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"unknown local provider options {unknown}; use {sorted(allowed)}")
    return LocalProvider.from_traces(**options)


def _session(config: SpotConfiguration) -> Any:
    """What the provider takes as ``session``: the cluster block's ApiClient on kubernetes
    (None: its kubeconfig options), else the AWS block's access (None: boto3's chain)."""
    if config.provider == "kubernetes":
        return config.kubernetes_client()
    return config.aws_session()


def check_provider_options(provider: str, options: dict[str, Any],
                           instance_types: Sequence[str] = ()) -> None:
    """Check ``provider_options`` without touching the cloud (the provider registry's
    check); ConfigError says what to fix."""
    check_provider(provider, options, instance_types)


def _ec2_defaults(options: dict[str, Any], instance_types: Sequence[str],
                  credentials_region: str | None = None) -> dict[str, Any]:
    """``options`` with the region (the credentials block's, else the environment's) and
    the configuration's instance types where they are not given."""
    options = dict(options)
    region = credentials_region or os.environ.get("AWS_REGION") or \
        os.environ.get("AWS_DEFAULT_REGION")
    if region and "region" not in options:
        options["region"] = region
    if instance_types and not options.get("instance_types"):
        options["instance_types"] = list(instance_types)
    return options


def check_store_for(provider: str, store_uri: str | None, what: str,
                    options: dict[str, Any] | None = None) -> None:
    """A provider whose leases are remote needs a store they can reach (``s3://``; on
    kubernetes also a ``file://`` path on a volume the pod template mounts)."""
    if provider == LOCAL_PROVIDER:
        return
    if provider == "kubernetes":
        from spot_core.providers.kubernetes_pods import mounted_store

        if mounted_store(store_uri, (options or {}).get("pod_template")):
            return
        shown = "none (a folder on this machine)" if store_uri is None else repr(store_uri)
        raise ConfigError(f"provider 'kubernetes' needs {what} 's3://bucket/prefix', or a "
                          "file:// path under a volumeMount of pod_template's step container "
                          f"(a PVC every pod mounts): its pods cannot see this machine's disk "
                          f"(got {shown})")
    if store_uri is None or not store_uri.startswith("s3://"):
        shown = "none (a folder on this machine)" if store_uri is None else repr(store_uri)
        raise ConfigError(f"provider {provider!r} needs {what} 's3://bucket/prefix': its "
                          f"instances cannot see this machine's disk (got {shown})")


def lease_python(provider: str, options: dict[str, Any]) -> str:
    """The Python that runs a step on a lease of ``provider``.

    A local lease is a process on this machine: this interpreter. A remote one has its
    own: ``provider_options["agent_python"]`` (the option the ec2 provider already uses
    for its on-instance agent), default ``python3``.
    """
    if provider == LOCAL_PROVIDER:
        return sys.executable
    return str(options.get("agent_python") or "python3")


def lease_env(provider: str, env: dict[str, str], logger=None) -> dict[str, str]:
    """``env`` as it may go to a lease of ``provider``.

    Off this machine (any provider but local) names that look like credentials are
    dropped with a warning: a remote instance gets its access from its instance profile
    (or its image), and the EC2 provider writes the environment into user-data.
    """
    if provider == LOCAL_PROVIDER:
        return dict(env)
    from spot_core.credentials import secret_names

    dropped = secret_names(env)  # PREFECT_API_KEY and PREFECT_API_AUTH_STRING among them
    if dropped and logger is not None:
        logger.warning("not passing %s to the %s lease: credentials never go into its "
                       "environment; provide them on the instance (image, instance profile "
                       "or a secrets manager)", ", ".join(dropped), provider)
    return {k: v for k, v in env.items() if k not in dropped}


def provider_market(provider):
    market = getattr(provider, "market", None)
    if market is None:
        raise ConfigError(f"provider {provider.name!r} has no market to read offers from")
    return market


def select_pools(config: SpotConfiguration, pools: Sequence[Pool]) -> tuple[Pool, ...]:
    """The provider's pools narrowed to the configured zones and instance types."""
    chosen = tuple(p for p in pools
                   if (not config.zones or p.zone in config.zones)
                   and (not config.instance_types or p.instance_type in config.instance_types))
    if not chosen:
        offered = sorted({f"{p.zone}/{p.instance_type}" for p in pools})
        raise ConfigError(f"no pool matches zones={config.zones} instance_types="
                          f"{config.instance_types}; the provider offers {offered}")
    return chosen


def controller_for(config: SpotConfiguration, provider, *, max_user_retries: int = 0,
                   persist: Callable[[JobRecord], None] | None = None,
                   related: Sequence[dict[str, str]] = (),
                   progress: Listener | None = None,
                   stores: Callable[[str], Any] | None = None) -> Controller:
    """A controller under ``config``'s settings. The price cap is the retry policy's
    ``max_spot_price`` (wait for a cheaper window, then fall back), as on every surface;
    ``stores`` opens the job's store (default: the provider's, with its credentials);
    the lifecycle's bounds (poll interval, attempt, heartbeat and observe-failure
    timeouts) are the settings' ``controller_options``. Each transition becomes a
    ``spot.job.*`` event, updates ``progress`` (the job's progress artifact) and checks
    the pool against the alert thresholds."""
    settings = config.settings()
    market = provider_market(provider)
    alerts = PoolAlerts(market, related=related, **settings.alert_thresholds())

    def listener(kind: str, record: JobRecord, detail: str) -> None:
        emit_job_event(kind, record, detail, related=related)
        alerts(kind, record, detail)
        if progress is not None:
            progress(kind, record, detail)

    return Controller(provider, market, settings.retry_policy(max_user_retries=max_user_retries),
                      persist=persist, listener=listener, stores=stores,
                      **settings.controller_options())


def job_spec(config: SpotConfiguration, provider, *, job_id: str, command: Sequence[str],
             checkpoint_uri: str, env: dict[str, str] | None = None,
             created_at: float | None = None) -> JobSpec:
    """The job under ``config``, its deadline fields under the settings' time convention
    (``spot_core.settings``: durations in the provider's capacity time, counted from
    ``created_at``, the job's JobRecord's; None: a new job, now). A new job's record
    is ``Controller.new_record(spec)``, which carries the spec's deadline."""
    pools = select_pools(config, provider.pools())
    deadline = config.settings().deadline_spec(
        created_at=time.time() if created_at is None else created_at,
        capacity_per_wall=provider.capacity_seconds(1.0))
    return JobSpec(job_id=job_id, command=tuple(command), checkpoint_uri=checkpoint_uri,
                   pools=pools, env=dict(env or {}), **deadline)


def slug(text: str, limit: int = 40) -> str:
    """Lowercase letters, digits and dashes (what artifact keys and paths accept)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit] or "job"
