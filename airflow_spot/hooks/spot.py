"""The hook: every call from Airflow into spot capacity goes through here.

``SpotHook`` opens a capacity provider by name (``local``, ``ec2``, and ``kubernetes``
through the same ``open_provider`` registry) from JSON-able options, so the worker that
launches a lease and the triggerer that watches it can each open the same provider in
their own process. Credentials are never among those options: the hook resolves the
connection ids it is given (``aws_conn_id`` for ec2 and S3 checkpoint stores,
``kubernetes_conn_id`` for kubernetes) through the amazon and cncf-kubernetes hooks in
the process that opens the provider (``airflow_spot.hooks.connections``). It also
builds the controller both of them drive.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any, Mapping, Sequence

from airflow.sdk import BaseHook

from airflow_spot.hooks.connections import aws_access, kubernetes_client
from spot_core.checkpoint import open_store
from spot_core.controller import Controller, Persist
from spot_core.model import Lease, Pool
from spot_core.policy.retry import RetryPolicy
from spot_core.errors import ConfigError
from spot_core.providers import PROVIDER_NAMES, open_provider, takes_session
from spot_core.providers.base import Provider
from spot_core.settings import SpotSettings

PROVIDERS = PROVIDER_NAMES

_OPEN: dict[str, Provider] = {}
_OPEN_LOCK = threading.Lock()


def _key(name: str, options: Mapping[str, Any], *conn_ids: str | None) -> str:
    return json.dumps([name, options, *conn_ids], sort_keys=True, default=str)


class SpotHook(BaseHook):
    """Opens (and caches, per process) the capacity provider a spot job runs on."""

    hook_name = "Spot capacity"

    def __init__(self, provider: str = "local", provider_options: Mapping[str, Any] | None = None,
                 *, aws_conn_id: str | None = None, kubernetes_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if provider not in PROVIDERS:
            raise ValueError(f"unknown capacity provider {provider!r}: use one of "
                             f"{', '.join(PROVIDERS)}")
        self.provider_name = provider
        self.provider_options = dict(provider_options or {})
        self.aws_conn_id = aws_conn_id
        self.kubernetes_conn_id = kubernetes_conn_id

    @property
    def cache_key(self) -> str:
        return _key(self.provider_name, self.provider_options, *self._conn_ids)

    @property
    def _conn_ids(self) -> tuple[str | None, str | None]:
        return self.aws_conn_id, self.kubernetes_conn_id

    @functools.cached_property
    def aws(self):
        """The AWS connection's ``AwsAccess`` (None without ``aws_conn_id``: boto3's chain)."""
        return None if self.aws_conn_id is None else aws_access(self.aws_conn_id)

    def _session(self) -> Any:
        """What the provider reaches its cloud with, from this process's connections."""
        if self.provider_name == "kubernetes" and self.kubernetes_conn_id is not None:
            if not takes_session("kubernetes"):  # never ignore a connection silently
                raise ConfigError(f"kubernetes_conn_id={self.kubernetes_conn_id!r}: this "
                                  "build's kubernetes provider takes no API client; drop "
                                  "kubernetes_conn_id (the provider's kubeconfig options "
                                  "apply) or upgrade spot-pipelines")
            return kubernetes_client(self.kubernetes_conn_id)
        return self.aws

    def get_provider(self) -> Provider:
        """The provider for these options and connections; one instance per process."""
        with _OPEN_LOCK:
            provider = _OPEN.get(self.cache_key)
            if provider is None:
                provider = open_provider(self.provider_name, session=self._session(),
                                         **self.provider_options)
                _OPEN[self.cache_key] = provider
                # A trigger running in this process (dag.test) reopens it by its options.
                reopen = getattr(provider, "options", None)
                if reopen:
                    _OPEN.setdefault(_key(self.provider_name, reopen, *self._conn_ids),
                                     provider)
            return provider

    def open_store(self, uri: str):
        """A checkpoint store reached with the AWS connection (boto3's chain without one)."""
        return open_store(uri, session=self.aws)

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

    def controller(self, policy: RetryPolicy = RetryPolicy(), persist: Persist | None = None,
                   **knobs: Any) -> Controller:
        """The controller over this provider; ``knobs`` are the controller's settings under
        their surface names (poll_interval, attempt_timeout, heartbeat_timeout, ...), the
        same in the worker that launches and the triggerer that watches."""
        provider = self.get_provider()
        # The provider's own store access if it has one (ec2: the same session), else
        # the AWS connection's (an s3:// store under the local provider).
        stores = None if hasattr(provider, "open_store") else self.open_store
        bounds = SpotSettings.build(check_options=False, **knobs).controller_options()
        return Controller(provider, provider.market, policy, persist=persist, stores=stores,
                          **bounds)

    # -- leases -----------------------------------------------------------------------------
    def terminate(self, lease: Lease) -> None:
        self.get_provider().terminate(lease)

    def close(self) -> None:
        with _OPEN_LOCK:
            provider = _OPEN.pop(self.cache_key, None)
        if provider is not None:
            provider.close()

