"""Glue between a SpotConfiguration and the engine-agnostic controller.

Opens the provider the configuration names, narrows its pools (zones, instance types),
caps the spot price, and runs one job under the controller with Prefect events for
every transition. Both the task runner and the worker go through here.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

from spot_core.controller import Controller, JobSpec
from spot_core.errors import ConfigError
from spot_core.model import JobRecord, Offer, Pool

from prefect_spot.blocks import SpotConfiguration
from prefect_spot.events import emit_job_event


def open_configured_provider(config: SpotConfiguration, **defaults: Any):
    """The provider ``config`` names; its options override ``defaults``.

    Uses ``spot_core.providers.open_provider`` when the core has it (so a running local
    cloud server can be shared across processes), else an in-process local cloud.
    """
    options = {**defaults, **config.provider_options}
    try:
        from spot_core.providers import open_provider  # type: ignore[attr-defined]
    except ImportError:
        open_provider = None
    if open_provider is not None:
        return open_provider(config.provider, **options)
    if config.provider != "local":
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


class PriceCappedMarket:
    """A market view in which spot pools dearer than ``max_price`` have no capacity."""

    def __init__(self, market, max_price: float | None) -> None:
        self._market = market
        self.max_price = max_price

    def offers(self, pools: Sequence[Pool], now: float) -> list[Offer]:
        offers = self._market.offers(pools, now)
        if self.max_price is None:
            return list(offers)
        return [dataclasses.replace(o, available=False)
                if o.pool.is_spot and o.price_per_hour > self.max_price else o for o in offers]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._market, name)


def controller_for(config: SpotConfiguration, provider, *, max_user_retries: int = 0,
                   persist: Callable[[JobRecord], None] | None = None,
                   related: Sequence[dict[str, str]] = ()) -> Controller:
    market = PriceCappedMarket(provider_market(provider), config.max_price_per_hour)

    def listener(kind: str, record: JobRecord, detail: str) -> None:
        emit_job_event(kind, record, detail, related=related)

    return Controller(provider, market, config.retry_policy(max_user_retries), persist=persist,
                      listener=listener, poll_interval=config.poll_interval_seconds)


def job_spec(config: SpotConfiguration, provider, *, job_id: str, command: Sequence[str],
             checkpoint_uri: str, env: dict[str, str] | None = None) -> JobSpec:
    pools = select_pools(config, provider.pools())
    return JobSpec(job_id=job_id, command=tuple(command), checkpoint_uri=checkpoint_uri,
                   pools=pools, env=dict(env or {}))


def slug(text: str, limit: int = 40) -> str:
    """Lowercase letters, digits and dashes (what artifact keys and paths accept)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit] or "job"
