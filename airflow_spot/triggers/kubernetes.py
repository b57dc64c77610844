"""The trigger that watches a ``SpotKubernetesPodOperator`` attempt (a pod) from the triggerer.

Why a ``SpotJobTrigger`` and not a ``KubernetesPodTrigger`` subclass: the stock pod
trigger waits for one pod's base container and judges its exit code, then hands the pod
back to the operator's ``trigger_reentry`` / ``cleanup``, which fail the task on any
non-zero code. A spot attempt must instead be observed, classified (the pod's
``DisruptionTarget`` condition, graceful node shutdown, OOM), billed and closed by the
controller, with the driver heartbeat renewed in the job's store and the lease stopped
when the deferred task is marked failed or cleared: exactly ``SpotJobTrigger``'s
lifecycle. Subclassing the pod trigger would override its ``run``, ``serialize`` and
``cleanup`` and keep nothing. What this class adds is the Kubernetes connection: its
kwargs carry ``kubernetes_conn_id`` (and the operator's ``cluster_context``,
``config_file``, ``in_cluster``), never credentials, and the triggerer resolves them
through ``KubernetesHook`` in its own process, as the stock trigger does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_spot.hooks.kubernetes import PROVIDER, SpotKubernetesHook
from airflow_spot.triggers.spot import SpotJobTrigger


class SpotKubernetesPodTrigger(SpotJobTrigger):
    """``SpotJobTrigger`` for the ``kubernetes`` provider, reaching the cluster through an
    Airflow Kubernetes connection.

    :param kubernetes_conn_id: the connection the triggerer resolves (None: the default
        kubeconfig or ``config_file`` / ``in_cluster``).
    :param cluster_context: kubeconfig context (overrides the connection's).
    :param config_file: kubeconfig path (overrides the connection's ``kube_config_path``).
    :param in_cluster: use the triggerer pod's service account.

    The other parameters are ``SpotJobTrigger``'s; ``provider`` is always ``kubernetes``.
    """

    def __init__(
        self,
        *,
        provider_options: Mapping[str, Any],
        next: Mapping[str, Any],  # noqa: A002 - SpotJobTrigger's name for the Next
        checkpoint_uri: str,
        kubernetes_conn_id: str | None = None,
        cluster_context: str | None = None,
        config_file: str | None = None,
        in_cluster: bool | None = None,
        provider: str = PROVIDER,
        **kwargs: Any,
    ) -> None:
        if provider != PROVIDER:
            raise ValueError(
                f"SpotKubernetesPodTrigger: provider={provider!r}; it watches "
                f"{PROVIDER!r} leases only (use SpotJobTrigger for others)"
            )
        for name, value in (
            ("kubernetes_conn_id", kubernetes_conn_id),
            ("cluster_context", cluster_context),
            ("config_file", config_file),
        ):
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise ValueError(
                    f"SpotKubernetesPodTrigger: {name}={value!r} must be a non-empty string or None"
                )
        if in_cluster is not None and not isinstance(in_cluster, bool):
            raise ValueError(
                f"SpotKubernetesPodTrigger: in_cluster={in_cluster!r} must be True, False or None"
            )
        super().__init__(
            provider=PROVIDER,
            provider_options=provider_options,
            next=next,
            checkpoint_uri=checkpoint_uri,
            **kwargs,
        )
        self.kubernetes_conn_id = kubernetes_conn_id
        self.cluster_context = cluster_context
        self.config_file = config_file
        self.in_cluster = in_cluster

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()  # names this class, not the stock pod trigger
        kwargs.pop("provider")
        return classpath, {
            **kwargs,
            "kubernetes_conn_id": self.kubernetes_conn_id,
            "cluster_context": self.cluster_context,
            "config_file": self.config_file,
            "in_cluster": self.in_cluster,
        }

    def hook(self) -> SpotKubernetesHook:
        """The connection resolved in this process (the triggerer's), then the provider."""
        return SpotKubernetesHook(
            self.provider_options,
            kubernetes_conn_id=self.kubernetes_conn_id,
            cluster_context=self.cluster_context,
            config_file=self.config_file,
            in_cluster=self.in_cluster,
        )
