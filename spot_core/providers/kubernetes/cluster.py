"""What every part of the kubernetes provider shares: its state, declared once, and the
calls on the API that launch, observe and cleanup all make (list the nodes, delete a
pod)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from spot_core.adaptors import kubernetes as k8s
from spot_core.market.kubernetes import KubernetesMarket
from spot_core.policy import pod_outcomes as classify
from spot_core.providers.kubernetes.options import KubernetesOptions

log = logging.getLogger(__name__)


class KubernetesCluster:
    """The provider's state (set by ``KubernetesProvider.__init__``) and the calls on the
    API that its parts share: list the nodes, delete a pod."""

    config: KubernetesOptions
    options: dict[str, Any]
    clock: Callable[[], float]
    _sleep: Callable[[float], None]
    api: Any
    market: KubernetesMarket
    _launched: dict[str, str]  # pod name -> namespace, for close()
    _terminated: set[str]
    # lease -> the notices its pod showed (or its watcher reported), first seen when
    _notices: dict[str, tuple[classify.Disruption, ...]]
    _annotations: dict[str, dict[str, str]]  # pod name -> annotations last observed

    def _list_nodes(self) -> list[Mapping[str, Any]]:
        return k8s.raw("list nodes", self.api.list_node).get("items") or []

    def _delete(self, name: str, namespace: str) -> bool:
        """True if a pod was deleted; a pod already gone (or never created) is no error. A
        failed delete keeps the pod on the list close() deletes."""
        try:
            k8s.call(f"delete pod {name}", self.api.delete_namespaced_pod, name, namespace)
        except k8s.NotFound:
            self._launched.pop(name, None)
            return False
        self._launched.pop(name, None)
        return True

    def _delete_quietly(self, name: str, namespace: str) -> None:
        """``_delete`` on a way out: its own failure is logged, not raised over the error
        that is already leaving (close() and cleanup_orphans remain)."""
        try:
            self._delete(name, namespace)
        except Exception as exc:  # noqa: BLE001 - the first error is the one to report
            log.warning("could not delete pod %s/%s: %s", namespace, name, exc)
