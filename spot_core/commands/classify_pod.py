"""`spot-pipelines classify-pod FILE [--node NODE.json]`: what the provider would conclude.

FILE is a Pod as the API returns it (`kubectl get pod NAME -o json`), a List of them
(`kubectl get pods -o json`, also with the nodes and events the pods refer to:
`kubectl get pods,nodes,events -o json`), a kubernetes-client ``V1Pod`` or ``V1PodList``
dumped with ``to_dict()`` (snake_case), or ``-`` for standard input. ``--node`` adds a
Node (or a List of them) the pods run on. One JSON line per pod:
``{"pod": "NAMESPACE/NAME", "outcome": ..., "reason": ...}``, the outcome a JobRecord
outcome (``succeeded``, ``preempted``, ``disrupted``, ``user_failed``,
``infrastructure_failed``) or ``running`` / ``pending`` for a pod that has not ended.
The kubernetes provider decides with the same function
(``spot_core.policy.pod_outcomes.classify_pod``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spot_core.errors import ConfigError

KINDS = {"Pod", "Node", "Event"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "classify-pod",
        help="say why pods ended, as the kubernetes provider would: one "
        "JSON line per pod (outcome and reason)",
    )
    parser.add_argument(
        "file",
        metavar="FILE",
        help="a Pod, a List (`kubectl get pods,nodes,events -o json`) or a "
        "V1Pod's to_dict() dump, as JSON; - for stdin",
    )
    parser.add_argument(
        "--node",
        metavar="NODE.json",
        action="append",
        default=[],
        help="a Node (or a List of nodes) the pods run on, as JSON "
        "(`kubectl get node NAME -o json`); may be repeated",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from spot_core.policy import pod_outcomes as classify

    where = "standard input" if args.file == "-" else args.file
    found = objects(load(args.file), where)
    for source in args.node:
        found += [o for o in objects(load(source), source) if kind_of(o) == "Node"]
    pods = [o for o in found if kind_of(o) == "Pod"]
    if not pods:
        kinds = sorted({kind_of(o) or "unknown" for o in found})
        raise ConfigError(
            f"{where} holds no Pod (found: {', '.join(kinds) or 'nothing'}); "
            "pass `kubectl get pod NAME -o json` or `kubectl get pods -o json`"
        )
    nodes = {o["metadata"].get("name"): o for o in found if kind_of(o) == "Node"}
    events = [o for o in found if kind_of(o) == "Event"]
    now = time.time()
    for pod in pods:
        name = classify.node_of(pod)
        verdict = classify.classify_pod(
            pod, nodes.get(name, classify.UNKNOWN), events=events_of(pod, events), now=now
        )
        print(
            json.dumps(
                {
                    "pod": classify.pod_name(pod),
                    "outcome": verdict.outcome,
                    "reason": verdict.reason,
                }
            ),
            flush=True,
        )
    return 0


def load(source: str) -> Any:
    """The JSON in ``source`` (a path or ``-``), or one line naming the fix."""
    where = "standard input" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{source}: no such file; pass `kubectl get pod NAME -o json` output (or - for stdin)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{source} is a folder; pass a pod's JSON file") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise ConfigError(
            f"{source}: cannot read it as text ({exc}); pass a pod's JSON file"
        ) from None
    if not text.strip():
        raise ConfigError(f"{where} is empty; pass `kubectl get pod NAME -o json` output")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        hint = (
            "it looks like YAML: use -o json"
            if text.lstrip().startswith(("apiVersion:", "kind:", "metadata:", "items:"))
            else f"{exc.msg} at line {exc.lineno}"
        )
        raise ConfigError(
            f"{where} is not JSON ({hint}); pass `kubectl get pod NAME -o json` output"
        ) from None


def objects(document: Any, where: str) -> list[dict[str, Any]]:
    """The objects of a document: itself, or the ``items`` of a List (any kind of list,
    camelCase or a client's snake_case dump), as the API's JSON."""
    from spot_core.policy.pod_outcomes import as_api

    if not isinstance(document, Mapping):
        raise ConfigError(
            f"{where} holds a JSON {type(document).__name__}, not a Kubernetes "
            "object; pass `kubectl get pod NAME -o json` output"
        )
    document = as_api(document)
    items = document.get("items")
    found = items if isinstance(items, list) else [document]
    return [item for item in found if isinstance(item, dict)]


def kind_of(obj: Mapping[str, Any]) -> str | None:
    """Pod, Node or Event: the object's ``kind``, or its shape when a client's ``to_dict()``
    left the kind out."""
    if obj.get("kind") in KINDS:
        return str(obj["kind"])  # one of KINDS
    if obj.get("kind"):
        return None
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if "involvedObject" in obj:
        return "Event"
    if "nodeInfo" in status or "capacity" in status or "providerID" in spec:
        return "Node"
    if "containers" in spec or "phase" in status or "containerStatuses" in status:
        return "Pod"
    return None


def events_of(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The events about ``pod`` or about the node it ran on."""
    meta = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    mine = []
    for event in events:
        about = event.get("involvedObject") or {}
        if about.get("kind") == "Node" and node and about.get("name") == node:
            mine.append(dict(event))
        elif (
            about.get("kind", "Pod") == "Pod"
            and about.get("name") == meta.get("name")
            and about.get("namespace", meta.get("namespace")) == meta.get("namespace")
        ):
            mine.append(dict(event))
    return mine
