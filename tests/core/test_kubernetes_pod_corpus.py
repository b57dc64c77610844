"""The pod classifier over a corpus of real pod statuses (tests/fixtures/k8s_pod_statuses):
documents from the Kubernetes documentation, KEPs, release notes, the kubelet's and
controllers' own code and upstream issues of Kubernetes, Karpenter, cluster-autoscaler,
GKE, EKS and AKS users, each with its source and the outcome it must get. A disrupted pod
never classifies as a success or as the step's failure (unless Kubernetes says the pod
broke its own limit); every Kubernetes version since 1.20 is covered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spot_core.model import Outcome
from spot_core.policy import pod_outcomes as classify

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "k8s_pod_statuses"
LATEST_MINOR = 36
LONG_AFTER = classify.parse_time("2040-01-01T00:00:00Z")
OUTCOMES = {o.value for o in Outcome} | {classify.RUNNING, classify.PENDING}


def documents() -> list[tuple[str, dict]]:
    return [(path.stem, json.loads(path.read_text())) for path in sorted(CORPUS.glob("*.json"))]


DOCS = documents()


def verdict_of(doc: dict) -> classify.PodVerdict:
    node = doc.get("node", classify.UNKNOWN)
    node = None if node == "gone" else node
    now = classify.parse_time(doc["observed_at"]) if "observed_at" in doc else LONG_AFTER
    return classify.classify_pod(
        doc["pod"],
        node,
        events=doc.get("events", ()),
        spot=doc.get("spot"),
        earlier=doc.get("earlier", ()),
        now=now if not doc.get("earlier") else LONG_AFTER,
    )


def test_the_corpus_is_real_documents_with_their_sources():
    assert len(DOCS) >= 40
    for name, doc in DOCS:
        source = doc["source"]
        assert source["url"].startswith(("http", "https")) or "github.com" in source["url"], name
        assert len(source["what"]) > 40, f"{name}: quote what the document shows"
        assert doc["expected"]["outcome"] in OUTCOMES, name
        assert doc["pod"]["kind"] == "Pod" and doc["pod"]["metadata"]["name"], name
        if doc.get("partial"):
            assert doc.get("note") or "only" in source["what"], name


@pytest.mark.parametrize("name,doc", DOCS, ids=[n for n, _ in DOCS])
def test_each_document_gets_its_expected_outcome(name, doc):
    verdict = verdict_of(doc)
    assert verdict.outcome == doc["expected"]["outcome"], verdict.reason
    kind = doc["expected"].get("disruption")
    if kind is not None and verdict.ended:
        assert kind in {d.kind for d in verdict.evidence}, verdict.evidence
    if kind not in (None, "own-limit"):  # disrupted: never the step's success or failure
        assert verdict.outcome not in (Outcome.SUCCEEDED.value, Outcome.USER_FAILED.value)
    if "after_deadline" in doc["expected"]:  # the provider remembers when it first saw it
        seen = [classify.replace(d, at=LONG_AFTER - 3600) for d in verdict.evidence]
        later = verdict_of(dict(doc, earlier=seen))
        assert later.ended and later.outcome == doc["expected"]["after_deadline"], later.reason


def _minors(version: str) -> set[int]:
    """'1.22' -> {22}; '1.26+' -> 26..latest; '1.25-1.26' -> {25, 26}; prose -> none."""
    found = re.fullmatch(r"1\.(\d+)(\+|-1\.(\d+))?", version)
    if not found:
        return set()
    low = int(found.group(1))
    high = LATEST_MINOR if found.group(2) == "+" else int(found.group(3) or low)
    return set(range(low, high + 1))


def test_every_version_since_1_20_is_covered():
    covered = set().union(*(_minors(doc["kubernetes_version"]) for _, doc in DOCS))
    assert set(range(20, LATEST_MINOR + 1)) <= covered
    for name, doc in DOCS:  # a version is either a release (range) or says why not
        version = doc["kubernetes_version"]
        assert _minors(version) or version.startswith("not stated"), name


def test_the_same_documents_as_kubernetes_client_objects():
    """A V1Pod (and its snake_case to_dict()) classifies as its API JSON does."""
    kubernetes = pytest.importorskip("kubernetes")
    api = kubernetes.client.ApiClient()
    for name, doc in DOCS:
        body = json.loads(json.dumps(doc["pod"]))
        body.setdefault("spec", {}).setdefault("containers", [{"name": "main"}])
        for status in (body.get("status") or {}).get("containerStatuses") or []:
            for field, value in (
                ("image", ""),
                ("imageID", ""),
                ("ready", False),
                ("restartCount", 0),
            ):  # required by the client's model
                status.setdefault(field, value)
        model = api._ApiClient__deserialize(body, "V1Pod")
        for shape in (model, model.to_dict()):
            again = dict(doc, pod=shape)
            assert verdict_of(again).outcome == doc["expected"]["outcome"], name
