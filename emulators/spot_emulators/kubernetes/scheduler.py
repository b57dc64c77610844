"""Where a pending pod goes: the default scheduler's filters, as a pure function.

Filters run per node in the real plugin order (NodeUnschedulable, TaintToleration,
NodeAffinity, NodeResourcesFit); a node that fails reports the first failing plugin's
reason, and an unplaceable pod gets the real message shape: "0/3 nodes are available:
1 node(s) had untolerated taint {k: v}, 2 node(s) didn't match Pod's node
affinity/selector. preemption: ...". Among the nodes that fit, the least loaded wins.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .quantity import parse_quantity
from .selectors import Requirement

TERMINAL = ("Succeeded", "Failed")
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Placement:
    node: str | None
    message: str = ""


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    return any(_tolerates(t, taint) for t in tolerations)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    return operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taint(
    pod: Mapping[str, Any],
    node: Mapping[str, Any],
    effects: tuple[str, ...] = ("NoSchedule", "NoExecute"),
) -> Mapping[str, Any] | None:
    tolerations = pod["spec"].get("tolerations") or []
    taint: Mapping[str, Any]  # each of the node's JSON taints
    for taint in node["spec"].get("taints") or []:
        if taint.get("effect") in effects and not tolerates(tolerations, taint):
            return taint
    return None


def matches_node_affinity(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    selector = pod["spec"].get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    return any(_term_matches(term, node) for term in terms)


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no objects
    labels = node["metadata"].get("labels") or {}
    if not all(_requirement(e).matches(labels) for e in expressions):
        return False
    node_fields = {"metadata.name": node["metadata"]["name"]}
    return all(_requirement(f).matches(node_fields) for f in fields)


def _requirement(expression: Mapping[str, Any]) -> Requirement:
    return Requirement(
        expression["key"],
        expression["operator"],
        tuple(str(v) for v in expression.get("values") or ()),
    )


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    total = {"cpu": 0.0, "memory": 0.0}
    for container in pod["spec"].get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        for resource in total:
            if resource in requests:
                total[resource] += parse_quantity(requests[resource])
    return total


def _filter(
    pod: Mapping[str, Any], node: Mapping[str, Any], bound: list[Mapping[str, Any]]
) -> str | None:
    """The first failing filter's reason for this node, or None if the pod fits."""
    if node["spec"].get("unschedulable") and not tolerates(
        pod["spec"].get("tolerations") or [], UNSCHEDULABLE_TAINT
    ):
        return "node(s) were unschedulable"
    taint = untolerated_taint(pod, node)
    if taint is not None:
        return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    if not matches_node_affinity(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    allocatable = node["status"].get("allocatable") or {}
    if len(bound) + 1 > parse_quantity(allocatable.get("pods", "110")):
        return "Too many pods"
    wanted = pod_requests(pod)
    for resource in ("cpu", "memory"):
        used = sum(pod_requests(p)[resource] for p in bound)
        if wanted[resource] and used + wanted[resource] > parse_quantity(
            allocatable.get(resource, "0")
        ):
            return f"Insufficient {resource}"
    return None


def _bound(
    nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> dict[str, list[Mapping[str, Any]]]:
    """Node name -> the pods that occupy it (bound and not finished)."""
    bound: dict[str, list[Mapping[str, Any]]] = {n["metadata"]["name"]: [] for n in nodes}
    for other in pods:
        node_name = other["spec"].get("nodeName")
        if node_name in bound and other.get("status", {}).get("phase") not in TERMINAL:
            bound[node_name].append(other)
    return bound


def place(
    pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> Placement:
    """The node for ``pod`` among ``nodes`` (``pods`` are every pod, to count what is bound)."""
    if not nodes:
        return Placement(None, "no nodes available to schedule pods")
    bound = _bound(nodes, pods)
    reasons: Counter[str] = Counter()
    fits = []
    for node in nodes:
        reason = _filter(pod, node, bound[node["metadata"]["name"]])
        if reason is None:
            fits.append(node["metadata"]["name"])
        else:
            reasons[reason] += 1
    if fits:
        return Placement(min(fits, key=lambda n: (len(bound[n]), n)))
    histogram = sorted(f"{count} {reason}" for reason, count in reasons.items())
    total = len(nodes)
    return Placement(
        None,
        f"0/{total} nodes are available: {', '.join(histogram)}. "
        f"preemption: 0/{total} nodes are available: {total} Preemption "
        f"is not helpful for scheduling.",
    )


@dataclass(frozen=True)
class Preemption:
    node: str
    victims: tuple[Mapping[str, Any], ...]


def priority(pod: Mapping[str, Any]) -> int:
    return int(pod["spec"].get("priority") or 0)


def preempt(
    pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> Preemption | None:
    """Where ``pod`` fits once lower-priority pods go (the fewest victims, lowest
    priorities first), or None: the default scheduler's PostFilter, simplified."""
    if pod["spec"].get("preemptionPolicy") == "Never":
        return None
    bound = _bound(nodes, pods)
    best: tuple[tuple[int, int, str], Preemption] | None = None
    for node in nodes:
        victims = _victims(pod, node, bound[node["metadata"]["name"]])
        if victims:
            rank = (len(victims), max(priority(v) for v in victims), node["metadata"]["name"])
            if best is None or rank < best[0]:
                best = (rank, Preemption(node["metadata"]["name"], tuple(victims)))
    return best[1] if best else None


def _victims(
    pod: Mapping[str, Any], node: Mapping[str, Any], occupants: list[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    if _filter(pod, node, []) is not None:
        return []  # it would not fit even on the empty node
    candidates = sorted(
        (
            p
            for p in occupants
            if priority(p) < priority(pod) and not p["metadata"].get("deletionTimestamp")
        ),
        key=priority,
    )
    staying = [p for p in occupants if p not in candidates]
    victims = []
    for victim in candidates:
        if _filter(pod, node, staying + [c for c in candidates if c not in victims]) is None:
            break
        victims.append(victim)
    remaining = staying + [c for c in candidates if c not in victims]
    return victims if _filter(pod, node, remaining) is None else []
