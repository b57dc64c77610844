"""The Kubernetes emulator's pure rules as tables: selectors, patches, quantities, the
scheduler's filters and messages, and the watch history's 410."""

from __future__ import annotations

import pytest

from spot_emulators.kubernetes import store as store_module
from spot_emulators.kubernetes.errors import ApiError
from spot_emulators.kubernetes.patch import MERGE, STRATEGIC, apply_patch
from spot_emulators.kubernetes.pools import NodePool
from spot_emulators.kubernetes.quantity import parse_quantity
from spot_emulators.kubernetes.scheduler import place, preempt
from spot_emulators.kubernetes.selectors import matches_all, parse_label_selector
from spot_emulators.kubernetes.store import Store

LABELS = {"app": "train", "tier": "gold", "gpu": "1"}


@pytest.mark.parametrize(
    "selector, matches",
    [
        ("app=train", True),
        ("app==train", True),
        ("app!=train", False),
        ("app!=eval", True),
        ("tier in (gold, silver)", True),
        ("tier notin (gold)", False),
        ("gpu", True),
        ("!gpu", False),
        ("!cpu", True),
        ("app=train,tier in (silver)", False),
        ("", True),
        ("missing notin (x)", True),
    ],
)
def test_label_selectors(selector, matches):
    assert matches_all(parse_label_selector(selector), LABELS) is matches


def test_a_bad_label_selector_is_a_400():
    with pytest.raises(ApiError) as caught:
        parse_label_selector("app in gold")
    assert caught.value.code == 400


@pytest.mark.parametrize(
    "value, expected",
    [
        ("500m", 0.5),
        ("2", 2.0),
        ("1Gi", 2**30),
        ("64Mi", 64 * 2**20),
        ("1e3", 1000.0),
        ("1k", 1000.0),
        (3, 3.0),
    ],
)
def test_quantities(value, expected):
    assert parse_quantity(value) == expected


def test_strategic_merge_merges_lists_by_their_key_and_merge_patch_replaces_them():
    pod = {
        "metadata": {"labels": {"a": "1", "b": "2"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    patch = {
        "metadata": {"labels": {"b": None, "c": "3"}},
        "status": {"conditions": [{"type": "DisruptionTarget", "status": "True"}]},
    }
    strategic = apply_patch(pod, patch, STRATEGIC)
    assert strategic["metadata"]["labels"] == {"a": "1", "c": "3"}
    assert [c["type"] for c in strategic["status"]["conditions"]] == ["Ready", "DisruptionTarget"]
    merged = apply_patch(pod, patch, MERGE)
    assert [c["type"] for c in merged["status"]["conditions"]] == ["DisruptionTarget"]
    assert pod["metadata"]["labels"] == {"a": "1", "b": "2"}  # the original is untouched


def test_json_patch_operations():
    obj = {"spec": {"taints": [{"key": "a"}]}}
    patched = apply_patch(
        obj,
        [
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "b"}},
            {"op": "add", "path": "/spec/unschedulable", "value": True},
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "test", "path": "/spec/taints/0/key", "value": "b"},
        ],
        "application/json-patch+json",
    )
    assert patched == {"spec": {"taints": [{"key": "b"}], "unschedulable": True}}
    with pytest.raises(ApiError) as caught:
        apply_patch(
            obj,
            [{"op": "replace", "path": "/spec/missing", "value": 1}],
            "application/json-patch+json",
        )
    assert caught.value.code == 422


def _node(name, labels=None, taints=None, pods="10", unschedulable=False):
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": {"pods": pods, "cpu": "4", "memory": "8Gi"}},
    }


def _pod(**spec):
    return {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c"}], **spec},
        "status": {"phase": "Pending"},
    }


SPOT_TAINT = {
    "key": "kubernetes.azure.com/scalesetpriority",
    "value": "spot",
    "effect": "NoSchedule",
}


@pytest.mark.parametrize(
    "pod, node",
    [
        (_pod(nodeSelector={"pool": "b"}), "b"),
        (_pod(tolerations=[{"operator": "Exists"}], nodeSelector={"pool": "aks"}), "aks"),
        (
            _pod(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "size", "operator": "Gt", "values": ["4"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            ),
            "b",
        ),
        (
            _pod(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "NotIn", "values": ["a", "b"]}
                                    ]
                                }
                            ]
                        }
                    }
                },
                tolerations=[
                    {
                        "key": SPOT_TAINT["key"],
                        "operator": "Equal",
                        "value": "spot",
                        "effect": "NoSchedule",
                    }
                ],
            ),
            "aks",
        ),
    ],
)
def test_placement(pod, node):
    nodes = [
        _node("a", {"pool": "a", "size": "2"}),
        _node("b", {"pool": "b", "size": "8"}),
        _node("aks", {"pool": "aks"}, [SPOT_TAINT]),
        _node("cordoned", {"pool": "a"}, unschedulable=True),
    ]
    assert place(pod, nodes, []).node == node


def test_an_unplaceable_pod_gets_the_schedulers_message():
    nodes = [
        _node("a", {"pool": "a"}),
        _node("aks", {"pool": "aks"}, [SPOT_TAINT]),
        _node("full", {"pool": "x"}, pods="1"),
        _node("off", unschedulable=True),
    ]
    busy = [
        {"metadata": {"name": "q"}, "spec": {"nodeName": "full"}, "status": {"phase": "Running"}}
    ]
    pod = _pod(
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "pool", "operator": "In", "values": ["aks", "x"]}
                            ]
                        }
                    ]
                }
            }
        }
    )
    assert place(pod, nodes, busy).message == (
        "0/4 nodes are available: 1 Too many pods, 1 node(s) didn't match Pod's node "
        "affinity/selector, 1 node(s) had untolerated taint "
        "{kubernetes.azure.com/scalesetpriority: spot}, 1 node(s) were unschedulable. "
        "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
    )


def test_a_watch_from_a_version_the_history_no_longer_holds_is_410(monkeypatch):
    monkeypatch.setattr(store_module, "HISTORY", 3)
    store = Store(lambda: 0.0)
    first = store.resource_version
    for index in range(5):
        store.create("namespaces", {"metadata": {"name": f"n{index}"}})
    with pytest.raises(ApiError) as caught:
        store.events_after(first, "namespaces")
    assert (caught.value.code, caught.value.reason) == (410, "Expired")
    assert len(store.events_after(store.resource_version - 2, "namespaces")) == 2


@pytest.mark.parametrize(
    "pool, labels, taints",
    [
        (
            NodePool("ng", "eks", "spot"),
            {"eks.amazonaws.com/capacityType": "SPOT", "eks.amazonaws.com/nodegroup": "ng"},
            [],
        ),
        (NodePool("ng", "eks", "on-demand"), {"eks.amazonaws.com/capacityType": "ON_DEMAND"}, []),
        (
            NodePool("np", "karpenter", "spot"),
            {"karpenter.sh/capacity-type": "spot", "karpenter.sh/nodepool": "np"},
            [],
        ),
        (
            NodePool("gp", "gke", "spot", "us-central1-a"),
            {
                "cloud.google.com/gke-spot": "true",
                "cloud.google.com/gke-nodepool": "gp",
                "topology.kubernetes.io/region": "us-central1",
            },
            [],
        ),
        (
            NodePool("gp", "gke", "preemptible", "us-central1-a"),
            {"cloud.google.com/gke-preemptible": "true"},
            [],
        ),
        (
            NodePool("ap", "aks", "spot", "eastus-1"),
            {
                "kubernetes.azure.com/scalesetpriority": "spot",
                "kubernetes.azure.com/agentpool": "ap",
                "topology.kubernetes.io/region": "eastus",
            },
            [
                {
                    "key": "kubernetes.azure.com/scalesetpriority",
                    "value": "spot",
                    "effect": "NoSchedule",
                }
            ],
        ),
    ],
)
def test_each_flavours_nodes_carry_its_labels_and_taints(pool, labels, taints):
    node = pool.node_object()
    assert labels.items() <= node["metadata"]["labels"].items()
    assert node["spec"]["taints"] == taints
    assert "cloud.google.com/gke-spot" not in node["metadata"]["labels"] or pool.flavour == "gke"


def test_a_bad_pool_is_one_clear_error():
    with pytest.raises(ValueError, match="capacity_type preemptible is GKE's"):
        NodePool("p", "eks", "preemptible")
    with pytest.raises(ValueError, match="unknown node pool keys"):
        NodePool.from_dict({"name": "p", "flavour": "eks", "size": 3})


def _running(name, node, prio, deleting=False):
    meta = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "priority": prio, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def test_preemption_takes_the_fewest_lowest_priority_victims():
    nodes = [
        _node("one", pods="1"),
        _node("two", pods="2"),
        _node("tainted", {}, [SPOT_TAINT], pods="1"),
    ]
    pods = [
        _running("a", "one", 5),
        _running("b", "two", 1),
        _running("c", "two", 2),
        _running("d", "tainted", 0),
    ]
    choice = preempt(_pod(priority=10), nodes, pods)
    assert (choice.node, [v["metadata"]["name"] for v in choice.victims]) == ("two", ["b"])
    assert preempt(_pod(priority=1), nodes, pods) is None  # no usable node has a lower pod
    assert preempt(_pod(priority=10, preemptionPolicy="Never"), nodes, pods) is None
    going = [_running("a", "one", 5, deleting=True)]
    assert preempt(_pod(priority=10), [nodes[0]], going) is None  # already being freed
