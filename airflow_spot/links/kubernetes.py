"""The extra link of a spot pod task: the pod the current attempt runs in."""

from __future__ import annotations

import urllib.parse

from airflow_spot.links.spot import _XComLink
from spot_core.model import Lease


class SpotKubernetesPodLink(_XComLink):
    """The attempt's pod as the cluster's API serves it (what ``kubectl get pod -o yaml``
    reads): no console URL is common to EKS, GKE, AKS and a self-managed cluster."""

    name = "Kubernetes pod"
    key = "spot_kubernetes_pod_link"

    @staticmethod
    def url_for(api_server: str, namespace: str, pod: str) -> str:
        quote = urllib.parse.quote
        return (
            f"{api_server.rstrip('/')}/api/v1/namespaces/{quote(namespace, safe='')}"
            f"/pods/{quote(pod, safe='')}"
        )

    @staticmethod
    def pod_of(lease: Lease) -> tuple[str, str] | None:
        """(namespace, pod name) of a kubernetes lease: its id is the pod's name, its
        details name the namespace."""
        namespace = lease.details.get("namespace")
        return (namespace, lease.lease_id) if namespace and lease.lease_id else None
