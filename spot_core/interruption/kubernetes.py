"""Notices inside a pod: its own node's taints, read through the Kubernetes API.

Each flavour marks a node before it takes it away, and a pod can see that a little
earlier than the kubelet's SIGTERM:

- Karpenter taints the node ``karpenter.sh/disrupted:NoSchedule`` before it drains it;
- a drain (EKS managed node groups on a rebalance recommendation, ``kubectl drain``)
  cordons first: ``spec.unschedulable`` and the ``node.kubernetes.io/unschedulable`` taint;
- the cluster autoscaler taints ``ToBeDeletedByClusterAutoscaler``;
- GKE's node termination handler taints ``cloud.google.com/impending-node-termination``.

The node's name comes from the downward API (``SPOT_NODE_NAME``, set by the provider
from ``spec.nodeName``). The pod needs get on its node (``deploy/kubernetes/rbac.yaml``).
The kubelet's SIGTERM and the node's cloud metadata (IMDSv2 on EKS, the GCE metadata
server) are separate detectors that ``spot-pipelines watch --cloud kubernetes`` runs
alongside this one; whichever fires first wins.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from spot_core.errors import ConfigError
from spot_core.interruption.base import INTERRUPTION, DetectorPlugin, Notice

log = logging.getLogger(__name__)

NODE_NAME_ENV = "SPOT_NODE_NAME"
POD_NAME_ENV = "SPOT_POD_NAME"
POD_NAMESPACE_ENV = "SPOT_POD_NAMESPACE"

# taint key -> the action the notice names
NOTICE_TAINTS: Mapping[str, str] = {
    "karpenter.sh/disrupted": "karpenter-disruption",
    "karpenter.sh/disruption": "karpenter-disruption",  # Karpenter before v1
    "node.kubernetes.io/unschedulable": "drain",
    "ToBeDeletedByClusterAutoscaler": "autoscaler-scale-down",
    "cloud.google.com/impending-node-termination": "gke-termination",
}


def node_notice(node: Mapping[str, Any]) -> tuple[str, str] | None:
    """(action, what was seen) when the node says it is going away, else None. Pure."""
    spec = node.get("spec") or {}
    for taint in spec.get("taints") or []:
        action = NOTICE_TAINTS.get(taint.get("key", ""))
        if action is not None:
            return action, f"taint {taint.get('key')}:{taint.get('effect', '')}"
    if spec.get("unschedulable"):
        return "drain", "node cordoned (spec.unschedulable)"
    return None


class KubernetesNodeDetector:
    """Polls the pod's own node; one notice per node life (the node name is its identity).

    ``read_node`` returns the node object as the API's JSON (injectable for tests; by
    default an API client from the pod's service account, else ``$KUBECONFIG``). Like
    every detector, ``poll`` never raises: an API error is logged once per streak.
    """

    name = "kubernetes"

    def __init__(self, node_name: str, read_node: Callable[[str], Mapping[str, Any]] | None = None):
        self.node_name = node_name
        self._read_node = read_node
        self._failing = False

    def poll(self, now: float) -> list[Notice]:
        try:
            if self._read_node is None:  # built on first use: no credentials is a log line
                self._read_node = _api_reader()
            node = self._read_node(self.node_name)
        except Exception as exc:  # noqa: BLE001 - a detector never raises
            if not self._failing:
                log.warning("cannot read node %s: %s", self.node_name, exc)
            self._failing = True
            return []
        self._failing = False
        seen = node_notice(node)
        if seen is None:
            return []
        action, why = seen
        return [
            Notice(
                INTERRUPTION,
                "kubernetes",
                action,
                None,
                now,
                raw={"node": self.node_name, "seen": why},
                identity=self.node_name,
            )
        ]


def _api_reader() -> Callable[[str], Mapping[str, Any]]:
    from spot_core.adaptors import kubernetes as k8s

    api = k8s.core_api(k8s.api_client())
    return lambda name: k8s.raw(f"get node {name}", api.read_node, name)


def node_name_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get(NODE_NAME_ENV) or None


def node_detector(environ: Mapping[str, str]) -> KubernetesNodeDetector:
    """The detector of the pod's own node, named by the downward API's ``SPOT_NODE_NAME``."""
    node = node_name_from_env(environ)
    if node is None:
        raise ConfigError(
            f"--cloud kubernetes needs the pod's node name in ${NODE_NAME_ENV} "
            "(the kubernetes provider sets it from the downward API: env "
            "valueFrom.fieldRef.fieldPath: spec.nodeName)"
        )
    return KubernetesNodeDetector(node)


PLUGIN = DetectorPlugin(
    make=lambda endpoint, timeout, environ: node_detector(environ),
    summary="the pod's own node: its taints and cordon (a pod of the kubernetes provider)",
    rank=3,
    aliases=("k8s",),
)
