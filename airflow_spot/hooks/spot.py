"""The hook: every call from Airflow into spot capacity goes through here.

``SpotHook`` opens a capacity provider by name (``local`` now; ``ec2`` and
``kubernetes`` through the same ``open_provider`` registry) from JSON-able options, so
the worker that launches a lease and the triggerer that watches it can each open the
same provider in their own process. It also builds the controller, and turns leases and
lease statuses into the plain dicts that travel through trigger kwargs and events.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Mapping, Sequence

from airflow.sdk import BaseHook

from spot_core.controller import Controller, Persist
from spot_core.model import Lease, Pool
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import PROVIDER_NAMES, open_provider
from spot_core.providers.base import LeaseState, LeaseStatus, Provider

PROVIDERS = PROVIDER_NAMES

_OPEN: dict[str, Provider] = {}
_OPEN_LOCK = threading.Lock()


def _key(name: str, options: Mapping[str, Any]) -> str:
    return json.dumps([name, options], sort_keys=True, default=str)


class SpotHook(BaseHook):
    """Opens (and caches, per process) the capacity provider a spot job runs on."""

    hook_name = "Spot capacity"

    def __init__(self, provider: str = "local", provider_options: Mapping[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if provider not in PROVIDERS:
            raise ValueError(f"unknown capacity provider {provider!r}: use one of "
                             f"{', '.join(PROVIDERS)}")
        self.provider_name = provider
        self.provider_options = dict(provider_options or {})

    @property
    def cache_key(self) -> str:
        return _key(self.provider_name, self.provider_options)

    def get_provider(self) -> Provider:
        """The provider for these options; one instance per process and option set."""
        with _OPEN_LOCK:
            provider = _OPEN.get(self.cache_key)
            if provider is None:
                provider = open_provider(self.provider_name, **self.provider_options)
                _OPEN[self.cache_key] = provider
                # A trigger running in this process (dag.test) reopens it by its options.
                reopen = getattr(provider, "options", None)
                if reopen:
                    _OPEN.setdefault(_key(self.provider_name, reopen), provider)
            return provider

    @property
    def reopen_options(self) -> dict[str, Any]:
        """Options another process passes to ``open_provider`` to reach the same capacity."""
        options = getattr(self.get_provider(), "options", None)
        return dict(options) if options is not None else dict(self.provider_options)

    def pools(self, zones: Sequence[str] | None = None) -> tuple[Pool, ...]:
        provider = self.get_provider()
        pools = tuple(provider.pools()) if hasattr(provider, "pools") else ()
        if zones:
            pools = tuple(p for p in pools if p.zone in set(zones))
        return pools

    def controller(self, policy: RetryPolicy, persist: Persist | None = None,
                   poll_interval: float = 0.2) -> Controller:
        provider = self.get_provider()
        return Controller(provider, provider.market, policy, persist=persist,
                          poll_interval=poll_interval)

    # -- leases -----------------------------------------------------------------------------
    def observe(self, lease: Lease) -> LeaseStatus:
        status = self.get_provider().observe([lease]).get(lease.lease_id)
        if status is None:  # the provider no longer knows it: it ended without us
            return LeaseStatus(LeaseState.TERMINATED, message="the provider lost track of the lease")
        return status

    async def aobserve(self, lease: Lease) -> LeaseStatus:
        """``observe`` off the event loop (providers make blocking calls)."""
        return await asyncio.to_thread(self.observe, lease)

    def terminate(self, lease: Lease) -> None:
        self.get_provider().terminate(lease)

    async def aterminate(self, lease: Lease) -> None:
        await asyncio.to_thread(self.terminate, lease)

    def close(self) -> None:
        with _OPEN_LOCK:
            provider = _OPEN.pop(self.cache_key, None)
        if provider is not None:
            provider.close()


def status_to_dict(status: LeaseStatus) -> dict[str, Any]:
    return {"state": str(status.state), "exit_code": status.exit_code,
            "notice_at": status.notice_at, "ended_at": status.ended_at,
            "message": status.message}


def status_from_dict(data: Mapping[str, Any]) -> LeaseStatus:
    return LeaseStatus(LeaseState(data["state"]), exit_code=data.get("exit_code"),
                       notice_at=data.get("notice_at"), ended_at=data.get("ended_at"),
                       message=data.get("message") or "")


def lease_from_attempt(record_job_id: str, attempt, details: Mapping[str, str] | None = None
                       ) -> Lease | None:
    """A Lease for a recorded, unfinished attempt (enough to observe, bill and terminate it)."""
    if attempt is None or attempt.lease_id is None:
        return None
    return Lease(lease_id=attempt.lease_id, pool=attempt.pool, job_id=record_job_id,
                 attempt=attempt.number, started_at=attempt.started_at, price_per_hour=0.0,
                 details=dict(details or {}))
