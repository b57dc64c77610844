"""The spot hook for Kubernetes: the ``kubernetes`` provider reached through an Airflow
Kubernetes connection.

Cluster credentials never travel in provider options (they are stored in the task state
store, the trigger table and logs). The worker that launches and the triggerer that
watches each resolve the same ``kubernetes_conn_id`` through cncf-kubernetes'
``KubernetesHook`` (its ``kube_config_path`` / ``kube_config`` / ``in_cluster`` /
``cluster_context`` extras, prefixed ``extra__kubernetes__`` or not, or the operator's
own ``config_file`` / ``in_cluster`` / ``cluster_context``) into the provider's connection
options, in their own process. A connection holding the kubeconfig's contents is written
to a private file (mode 0600) of that process, named by its digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_spot.hooks.spot import SpotHook

PROVIDER = "kubernetes"
# The provider's options that say how to reach the cluster; filled from the connection.
CONNECTION_OPTIONS = ("kubeconfig", "context", "in_cluster")


class SpotKubernetesHook(SpotHook):
    """``SpotHook`` for the ``kubernetes`` provider whose cluster comes from a connection.

    :param provider_options: the provider's options without connection options
        (namespace, pod_template, prices, ...).
    :param kubernetes_conn_id: the Airflow Kubernetes connection (None: the operator's
        own ``config_file`` / ``in_cluster`` or the default kubeconfig).
    """

    def __init__(
        self,
        provider_options: Mapping[str, Any] | None = None,
        *,
        kubernetes_conn_id: str | None = None,
        cluster_context: str | None = None,
        config_file: str | None = None,
        in_cluster: bool | None = None,
    ) -> None:
        given = sorted(set(provider_options or {}) & set(CONNECTION_OPTIONS))
        if given:
            raise ValueError(
                f"provider_options {given} say how to reach the cluster; pass "
                "kubernetes_conn_id (or config_file / in_cluster / "
                "cluster_context) instead"
            )
        super().__init__(PROVIDER, provider_options)
        self.kubernetes_conn_id = kubernetes_conn_id
        self.cluster_context = cluster_context
        self.config_file = config_file
        self.in_cluster = in_cluster
        self._connection: dict[str, Any] | None = None
        self.provider_options = {**self.provider_options, **self.connection_options()}

    def connection_options(self) -> dict[str, Any]:
        """The provider's connection options from the Airflow connection (resolved once)."""
        if self._connection is None:
            self._connection = _resolve(self._kube_hook())
        return dict(self._connection)

    def _kube_hook(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(
            conn_id=self.kubernetes_conn_id,
            in_cluster=self.in_cluster,
            config_file=self.config_file,
            cluster_context=self.cluster_context,
        )

    @property
    def reopen_options(self) -> dict[str, Any]:
        """Options another process reopens the provider with: without the connection's
        (that process resolves ``kubernetes_conn_id`` itself)."""
        options = super().reopen_options
        return {k: v for k, v in options.items() if k not in CONNECTION_OPTIONS}


def _resolve(hook) -> dict[str, Any]:
    """Connection options as ``KubernetesHook.get_conn`` reads them, same precedence."""
    field = hook._get_field  # the hook's own reading of prefixed and plain extras
    in_cluster = _first(hook.in_cluster, field("in_cluster"))
    context = _first(hook.cluster_context, field("cluster_context"))
    path = _first(hook.config_file, field("kube_config_path"))
    inline = field("kube_config")
    if sum(1 for o in (in_cluster, path, inline) if o) > 1:
        raise ValueError(
            f"connection {hook.conn_id!r}: kube_config_path, kube_config and "
            "in_cluster are mutually exclusive; set only one"
        )
    options: dict[str, Any] = {}
    if in_cluster:
        options["in_cluster"] = True
    elif path:
        options["kubeconfig"] = str(path)
    elif inline:
        options["kubeconfig"] = _private_kubeconfig(inline)
    if context and not in_cluster:
        options["context"] = str(context)
    return options


def _first(*values):
    return next((v for v in values if v is not None), None)


def _private_kubeconfig(contents: Any) -> str:
    """The connection's inline kubeconfig in a file only this user can read."""
    text = json.dumps(contents) if isinstance(contents, Mapping) else str(contents)
    directory = Path(tempfile.gettempdir()) / f"spot-kubeconfig-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.yaml"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
    return str(path)
