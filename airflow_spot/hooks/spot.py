"""The hook: every call from Airflow into spot capacity goes through here.

``SpotHook`` opens a capacity provider by name from JSON-able options, through the
``spot_core.jobs`` façade, so the worker that launches a lease and the triggerer that
watches it can each open the same provider in their own process. Credentials are never
among those options: the hook resolves the connection of the kind the provider takes
(its plugin's ``session``: ``aws_conn_id`` for an AWS session, ``kubernetes_conn_id`` for
a Kubernetes API client; ``aws_conn_id`` also for S3 checkpoint stores) through the
amazon and cncf-kubernetes hooks in the process that opens the provider
(``airflow_spot.hooks.connections``). It also builds the controller both of them drive.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook

from airflow_spot.hooks.connections import aws_access, kubernetes_client
from spot_core import jobs
from spot_core.checkpoint import open_store
from spot_core.controller import Controller, Persist
from spot_core.errors import ConfigError
from spot_core.model import Lease
from spot_core.settings import SpotSettings

_OPEN: dict[str, Any] = {}
_OPEN_LOCK = threading.Lock()


def _key(name: str, options: Mapping[str, Any], *conn_ids: str | None) -> str:
    return json.dumps([name, options, *conn_ids], sort_keys=True, default=str)


class SpotHook(BaseHook):
    """Opens (and caches, per process) the capacity provider a spot job runs on."""

    hook_name = "Spot capacity"

    def __init__(
        self,
        provider: str = SpotSettings.provider,
        provider_options: Mapping[str, Any] | None = None,
        *,
        aws_conn_id: str | None = None,
        kubernetes_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        try:  # read when used, so a provider installed after this module loaded counts
            jobs.provider_plugin(provider)
        except ConfigError as exc:
            raise ValueError(f"unknown capacity provider {provider!r}: {exc}") from None
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
    def aws(self) -> Any:
        """The AWS connection's ``AwsAccess`` (None without ``aws_conn_id``: boto3's chain)."""
        return None if self.aws_conn_id is None else aws_access(self.aws_conn_id)

    def _session(self) -> Any:
        """What the provider reaches its cloud with: the connection of the kind its plugin
        says it takes, resolved in this process (None: its SDK's default chain)."""
        kind = jobs.provider_plugin(self.provider_name).session
        if kind is jobs.SessionKind.AWS:
            return self.aws
        if kind is jobs.SessionKind.KUBERNETES and self.kubernetes_conn_id is not None:
            return kubernetes_client(self.kubernetes_conn_id)
        return None

    def get_provider(self) -> Any:
        """The provider for these options and connections; one instance per process."""
        with _OPEN_LOCK:
            provider = _OPEN.get(self.cache_key)
            if provider is None:
                provider = jobs.open_provider(
                    self.provider_name, session=self._session(), **self.provider_options
                )
                _OPEN[self.cache_key] = provider
                # A trigger running in this process (dag.test) reopens it by its options.
                if provider.options:
                    _OPEN.setdefault(
                        _key(self.provider_name, provider.options, *self._conn_ids), provider
                    )
            return provider

    def open_store(self, uri: str) -> Any:
        """A checkpoint store reached with the AWS connection (boto3's chain without one)."""
        return open_store(uri, session=self.aws)

    @property
    def reopen_options(self) -> dict[str, Any]:
        """Options another process passes to the provider to reach the same capacity."""
        return dict(self.get_provider().options or self.provider_options)

    def pools(self, zones: Any = None) -> tuple:
        """The provider's pools in ``zones`` (every one when None)."""
        return jobs.select_pools(self.get_provider(), zones=zones or ())

    def controller(
        self,
        settings: SpotSettings,
        *,
        max_user_retries: int | None = None,
        persist: Persist | None = None,
    ) -> Controller:
        """The controller over this provider under ``settings``, the same in the worker
        that launches and the triggerer that watches; stores are reached with the
        provider's own credentials when it has them, else with the AWS connection."""
        return jobs.assemble(
            settings,
            self.get_provider(),
            max_user_retries=max_user_retries,
            persist=persist,
            engine_stores=self.open_store,
        )

    # -- leases -----------------------------------------------------------------------------
    def terminate(self, lease: Lease) -> None:
        self.get_provider().terminate(lease)

    def close(self) -> None:
        with _OPEN_LOCK:
            provider = _OPEN.pop(self.cache_key, None)
        if provider is not None:
            provider.close()
