"""The resource types the emulator serves, as discovery describes them.

One table drives routing, the ``kind``/``apiVersion`` of stored objects and the
``APIResourceList`` answers, so a type is added in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    namespaced: bool
    group: str = ""  # "" is the core group
    version: str = "v1"
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()


RESOURCES = {
    r.plural: r
    for r in (
        Resource("namespaces", "Namespace", False, short_names=("ns",), subresources=("status",)),
        Resource("nodes", "Node", False, short_names=("no",), subresources=("status",)),
        Resource(
            "pods",
            "Pod",
            True,
            short_names=("po",),
            subresources=("status", "log", "eviction", "binding"),
        ),
        Resource("events", "Event", True, short_names=("ev",)),
        Resource("secrets", "Secret", True),
        Resource("configmaps", "ConfigMap", True, short_names=("cm",)),
        Resource("serviceaccounts", "ServiceAccount", True, short_names=("sa",)),
        Resource(
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            True,
            group="policy",
            short_names=("pdb",),
            subresources=("status",),
        ),
        Resource(
            "priorityclasses",
            "PriorityClass",
            False,
            group="scheduling.k8s.io",
            short_names=("pc",),
        ),
    )
}
GROUPS = sorted({r.group for r in RESOURCES.values() if r.group})


def group_list() -> dict[str, Any]:
    """The ``APIGroupList`` of ``/apis`` (every named group, one version each)."""
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [api_group(group) for group in GROUPS],
    }


def api_group(group: str) -> dict[str, Any]:
    version = {"groupVersion": f"{group}/v1", "version": "v1"}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [version],
        "preferredVersion": version,
    }


def group_resources(group: str) -> list[Resource]:
    return [r for r in RESOURCES.values() if r.group == group]


def resource_list(group: str, version: str) -> dict[str, Any]:
    """The ``APIResourceList`` for one group version (discovery)."""
    items = []
    for res in group_resources(group):
        items.append(
            {
                "name": res.plural,
                "singularName": res.singular,
                "namespaced": res.namespaced,
                "kind": res.kind,
                "verbs": VERBS,
                "shortNames": list(res.short_names) or None,
            }
        )
        for sub in res.subresources:
            kind = {"eviction": "Eviction", "binding": "Binding"}.get(sub, res.kind)
            verbs = {"log": ["get"], "eviction": ["create"], "binding": ["create"]}.get(
                sub, ["get", "patch", "update"]
            )
            entry = {
                "name": f"{res.plural}/{sub}",
                "singularName": "",
                "namespaced": res.namespaced,
                "kind": kind,
                "verbs": verbs,
            }
            if sub == "eviction":
                entry.update(group="policy", version="v1")
            items.append(entry)
    for item in items:
        if item.get("shortNames") is None:
            item.pop("shortNames", None)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": items,
    }
