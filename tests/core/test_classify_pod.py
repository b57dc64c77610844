"""`spot-pipelines classify-pod`: the corpus of real pod statuses as `kubectl get
pods,nodes,events -o json` would list them, as a client's snake_case dump, on stdin and
with --node, one JSON line per pod with the outcome the kubernetes provider would reach;
bad input is one line naming the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "k8s_pod_statuses"


def cli(*args, stdin: str | None = None):
    return subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "classify-pod", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def listed() -> tuple[dict, list[str], list[str]]:
    """The corpus documents a single look can judge (a node the document shows, no
    observation time of its own) as one List of pods, nodes and events, each pod renamed
    after its document; and the expected outcomes, in order."""
    items, names, expected = [], [], []
    for path in sorted(CORPUS.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("node") == "gone" or "observed_at" in doc or doc.get("spot") is not None:
            continue
        pod = json.loads(json.dumps(doc["pod"]))
        pod["metadata"].update(name=path.stem, namespace="corpus")
        if isinstance(doc.get("node"), dict):
            node = json.loads(json.dumps(doc["node"]))
            node["metadata"]["name"] = f"node-{path.stem}"
            pod.setdefault("spec", {})["nodeName"] = node["metadata"]["name"]
            items.append(node)
        for event in doc.get("events", ()):
            items.append(
                {
                    **event,
                    "kind": "Event",
                    "apiVersion": "v1",
                    "metadata": {"name": f"{path.stem}.1", "namespace": "corpus"},
                    "involvedObject": {"kind": "Pod", "name": path.stem, "namespace": "corpus"},
                }
            )
        items.append(pod)
        names.append(f"corpus/{path.stem}")
        expected.append(doc["expected"]["outcome"])
    return {"apiVersion": "v1", "kind": "List", "items": items}, names, expected


def lines(proc) -> list[dict]:
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_a_list_of_the_corpus_gives_each_pod_its_outcome(tmp_path):
    document, names, expected = listed()
    assert len(names) >= 30
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(document))
    out = lines(cli(str(path)))
    assert [o["pod"] for o in out] == names
    assert [o["outcome"] for o in out] == expected
    assert all(set(o) == {"pod", "outcome", "reason"} and o["reason"] for o in out)


def test_a_client_dump_in_snake_case_and_stdin_give_the_same_answers():
    """The pods as a V1PodList's to_dict() (snake_case, times as str(), no kinds), the
    nodes and events beside them, on standard input."""
    kubernetes = pytest.importorskip("kubernetes")
    document, names, expected = listed()
    pods = [item for item in document["items"] if item["kind"] == "Pod"]
    others = [item for item in document["items"] if item["kind"] != "Pod"]
    for pod in pods:  # the fields the client's models require
        pod.setdefault("spec", {}).setdefault("containers", [{"name": "main"}])
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            for field, value in (
                ("image", ""),
                ("imageID", ""),
                ("ready", False),
                ("restartCount", 0),
            ):
                status.setdefault(field, value)
    api = kubernetes.client.ApiClient()
    dump = api._ApiClient__deserialize({"items": pods, "metadata": {}}, "V1PodList").to_dict()
    assert "container_statuses" in json.dumps(dump, default=str)
    dump["items"] += others
    out = lines(cli("-", stdin=json.dumps(dump, default=str)))
    assert [o["pod"] for o in out] == names
    assert [o["outcome"] for o in out] == expected


def test_node_given_apart_decides_a_drain(tmp_path):
    doc = json.loads((CORPUS / "dt-eviction-api-docs.json").read_text())
    (tmp_path / "pod.json").write_text(json.dumps(doc["pod"]))
    (tmp_path / "node.json").write_text(json.dumps(doc["node"]))
    assert (
        lines(cli(str(tmp_path / "pod.json"), "--node", str(tmp_path / "node.json")))[0]["outcome"]
        == "disrupted"
    )
    spot = json.loads(json.dumps(doc["node"]))
    spot["metadata"]["labels"] = {"eks.amazonaws.com/capacityType": "SPOT"}
    (tmp_path / "spot.json").write_text(json.dumps({"kind": "List", "items": [spot]}))
    assert (
        lines(cli(str(tmp_path / "pod.json"), "--node", str(tmp_path / "spot.json")))[0]["outcome"]
        == "preempted"
    )


@pytest.mark.parametrize(
    "stdin,fix",
    [
        ("", "is empty"),
        ("apiVersion: v1\nkind: Pod\n", "looks like YAML: use -o json"),
        ("[1, 2]", "not a Kubernetes object"),
        ('{"kind": "Node", "metadata": {"name": "n"}}', "holds no Pod (found: Node)"),
        ("{nope", "is not JSON"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(stdin, fix):
    proc = cli("-", stdin=stdin)
    assert proc.returncode == 2 and not proc.stdout
    assert fix in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_a_missing_file_is_one_line():
    proc = cli("/nonexistent/pod.json")
    assert proc.returncode == 2 and "no such file" in proc.stderr
