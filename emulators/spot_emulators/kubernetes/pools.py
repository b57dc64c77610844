"""Node pools and the Node objects they register, labelled the way each flavour does it.

A pool is one (flavour, capacity type, zone, instance type) with a node count and a pod
capacity. Its nodes carry the labels a provider reads to find spot capacity: EKS managed
node groups (``eks.amazonaws.com/capacityType``), Karpenter (``karpenter.sh/capacity-type``),
GKE (``cloud.google.com/gke-spot``) and AKS (``kubernetes.azure.com/scalesetpriority`` plus
its ``NoSchedule`` taint). After a reclaim a pool replaces the node after
``replace_after_seconds``, or never when it is ``None`` (a "scarce" pool).
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FLAVOURS = ("eks", "karpenter", "gke", "aks")
CAPACITY_TYPES = ("spot", "on-demand", "preemptible")  # preemptible: GKE's older kind
AKS_SPOT_TAINT = {
    "key": "kubernetes.azure.com/scalesetpriority",
    "value": "spot",
    "effect": "NoSchedule",
}
_counter = itertools.count(1)


@dataclass
class NodePool:
    name: str
    flavour: str
    capacity_type: str = "spot"
    zone: str = "us-east-1a"
    instance_type: str = "m5.xlarge"
    nodes: int = 1
    pods: int = 8  # the node's allocatable pod count
    cpu: str = "4"
    memory: str = "16Gi"
    replace_after_seconds: float | None = 5.0
    metadata: bool = False  # each node serves its cloud's metadata (IMDS, GCE...)
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.flavour not in FLAVOURS:
            raise ValueError(
                f"pool {self.name!r}: flavour must be one of {FLAVOURS}, got {self.flavour!r}"
            )
        if self.capacity_type not in CAPACITY_TYPES:
            raise ValueError(
                f"pool {self.name!r}: capacity_type must be one of "
                f"{CAPACITY_TYPES}, got {self.capacity_type!r}"
            )
        if self.capacity_type == "preemptible" and self.flavour != "gke":
            raise ValueError(
                f"pool {self.name!r}: capacity_type preemptible is GKE's; "
                "use spot for other flavours"
            )
        if self.nodes < 0 or self.pods < 1:
            raise ValueError(f"pool {self.name!r}: nodes must be >= 0 and pods >= 1")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> NodePool:
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown node pool keys {sorted(unknown)}: use {sorted(known)}")
        return cls(**dict(raw))

    @property
    def spot(self) -> bool:
        """Capacity the cloud can take back (spot, or GKE preemptible)."""
        return self.capacity_type != "on-demand"

    @property
    def region(self) -> str:
        if re.fullmatch(r".*-[0-9]+[a-z]", self.zone):  # us-east-1a -> us-east-1
            return self.zone[:-1]
        return self.zone.rsplit("-", 1)[0]  # us-central1-a -> us-central1

    def flavour_labels(self) -> dict[str, str]:
        spot = self.spot
        if self.flavour == "eks":
            return {
                "eks.amazonaws.com/capacityType": "SPOT" if spot else "ON_DEMAND",
                "eks.amazonaws.com/nodegroup": self.name,
            }
        if self.flavour == "karpenter":
            return {
                "karpenter.sh/capacity-type": "spot" if spot else "on-demand",
                "karpenter.sh/nodepool": self.name,
                "karpenter.sh/registered": "true",
                "karpenter.sh/initialized": "true",
            }
        if self.flavour == "gke":
            labels = {
                "cloud.google.com/gke-nodepool": self.name,
                "cloud.google.com/gke-provisioning": self.capacity_type if spot else "standard",
            }
            if spot:
                labels[f"cloud.google.com/gke-{self.capacity_type}"] = "true"
            return labels
        labels = {"kubernetes.azure.com/agentpool": self.name, "agentpool": self.name}
        if spot:
            labels["kubernetes.azure.com/scalesetpriority"] = "spot"
        return labels

    def flavour_taints(self) -> list[dict[str, Any]]:
        return [dict(AKS_SPOT_TAINT)] if self.flavour == "aks" and self.spot else []

    def node_object(self) -> dict[str, Any]:
        """A new Node of this pool, as its kubelet would register it."""
        name = f"{self.name}-{next(_counter):04d}-{uuid.uuid4().hex[:5]}"
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": self.instance_type,
            "topology.kubernetes.io/zone": self.zone,
            "topology.kubernetes.io/region": self.region,
            "spot-emulator/pool": self.name,
            **self.flavour_labels(),
            **self.labels,
        }
        resources = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": str(self.pods),
            "ephemeral-storage": "100Gi",
        }
        return {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                },
            },
            "spec": {
                "providerID": self._provider_id(name),
                "taints": self.flavour_taints() + [dict(t) for t in self.taints],
            },
            "status": {
                "capacity": resources,
                "allocatable": dict(resources),
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": _node_info(),
                "conditions": [],
            },
        }

    def _provider_id(self, name: str) -> str:
        if self.flavour in ("eks", "karpenter"):
            return f"aws:///{self.zone}/i-{uuid.uuid4().hex[:17]}"
        if self.flavour == "gke":
            return f"gce://spot-emulator/{self.zone}/{name}"
        return (
            f"azure:///subscriptions/{uuid.UUID(int=0)}/resourceGroups/mc_emulator/"
            f"providers/Microsoft.Compute/virtualMachineScaleSets/{self.name}/"
            f"virtualMachines/{next(_counter)}"
        )


def _node_info() -> dict[str, str]:
    return {
        "architecture": "amd64",
        "bootID": str(uuid.uuid4()),
        "containerRuntimeVersion": "containerd://2.0.0-spot-emulator",
        "kernelVersion": "6.1.0",
        "kubeProxyVersion": "v1.33.0",
        "kubeletVersion": "v1.33.0",
        "machineID": uuid.uuid4().hex,
        "operatingSystem": "linux",
        "osImage": "spot-pipelines emulated node",
        "systemUUID": str(uuid.uuid4()),
    }


def metadata_cloud(flavour: str) -> str:
    return {"eks": "aws", "karpenter": "aws", "gke": "gcp", "aks": "azure"}[flavour]


def default_pools() -> list[NodePool]:
    """A small mixed cluster: two spot pools of different flavours and an on-demand pool."""
    return [
        NodePool("eks-spot", "eks", "spot", "us-east-1a"),
        NodePool("karpenter-spot", "karpenter", "spot", "us-east-1b"),
        NodePool("eks-on-demand", "eks", "on-demand", "us-east-1c"),
    ]
