"""The emulator's reclaim flavours held to the corpus of real pod statuses: for every
document of tests/fixtures/k8s_pod_statuses that names a flavour (``emulator``), the
emulator, driven through the unmodified client, leaves a pod whose phase, reason,
message, disruption condition and events are the document's, and the classifier reads
the two alike. The corpus says what Kubernetes does; the emulator follows it.

A second part shows the voluntary flavours keep their hands off a step pod carrying the
do-not-disrupt annotations, as Karpenter and the cluster-autoscaler do."""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.support.kube_helpers import add_test_pool, wait_for

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client as k8s  # noqa: E402
from kubernetes import watch  # noqa: E402

from spot_core.policy import pod_outcomes as classify  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "k8s_pod_statuses"
STEP = """
import signal, sys, time
code = int(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(code))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def corpus_for(flavour: str) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(CORPUS.glob("*.json"))]
    return [d for d in found if d.get("emulator") == flavour]


class Recorder:
    """Every version of one namespace's pods, as the API's JSON, through a watch."""

    def __init__(self, api_client, namespace):
        self.api, self.seen, self.deleted = api_client, {}, set()
        self._watch = watch.Watch()
        v1 = k8s.CoreV1Api(api_client)
        threading.Thread(target=self._run, args=(v1, namespace), daemon=True).start()

    def _run(self, v1, namespace):
        try:
            for event in self._watch.stream(v1.list_namespaced_pod, namespace, timeout_seconds=120):
                pod = self.api.sanitize_for_serialization(event["object"])
                self.seen[pod["metadata"]["name"]] = pod
                if event["type"] == "DELETED":
                    self.deleted.add(pod["metadata"]["name"])
        except Exception:  # noqa: BLE001 - the stream ends with its namespace
            pass

    def last(self, name: str) -> dict:
        return self.seen[name]

    def stop(self):
        self._watch.stop()


def step_pod(name, pool, *, exit_code=143, annotations=None, priority_class=None):
    spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 10,
        "nodeSelector": {"spot-emulator/pool": pool},
        "tolerations": [
            {
                "operator": "Exists",
                "effect": "NoSchedule",
                "key": "kubernetes.azure.com/scalesetpriority",
            }
        ],
        "containers": [
            {
                "name": "step",
                "image": "python:3.11-slim",
                "command": [sys.executable, "-c", STEP, str(exit_code)],
            }
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": spec,
        "metadata": {"name": name, "annotations": annotations or {}},
    }


def running(v1, ns, name):
    def ready():
        pod = v1.read_namespaced_pod(name, ns)
        return pod.status.phase == "Running" and "ready" in v1.read_namespaced_pod_log(name, ns)

    wait_for(ready, 30, f"{name} to run")


def ended(recorder, name, timeout=60):
    wait_for(
        lambda: (
            name in recorder.deleted
            or (
                recorder.seen.get(name, {}).get("status", {}).get("phase")
                in ("Succeeded", "Failed")
            )
        ),
        timeout,
        f"{name} to end",
    )
    return recorder.last(name)


def events_of(v1, ns, pod_name, node_name):
    found = v1.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod_name}").items
    found += v1.list_namespaced_event(
        "default", field_selector=(f"involvedObject.kind=Node,involvedObject.name={node_name}")
    ).items
    return [v1.api_client.sanitize_for_serialization(e) for e in found]


# -- each flavour's run: (pod as it ended, its events, its node as last seen) ----------------
def run_flavour(flavour, cluster, client, ns, tmp_path):
    v1 = k8s.CoreV1Api(client)
    recorder = Recorder(client, ns)
    try:
        return _RUNS[flavour](cluster, v1, ns, recorder)
    finally:
        recorder.stop()


def _reclaim(pool_flavour, reclaim_flavour, *, exit_code=143, annotations=None, **pool_options):
    def run(cluster, v1, ns, recorder):
        pool, (node,) = add_test_pool(cluster, pool_flavour, **pool_options)
        v1.create_namespaced_pod(
            ns, step_pod("victim", pool, exit_code=exit_code, annotations=annotations)
        )
        running(v1, ns, "victim")
        node_obj = v1.api_client.sanitize_for_serialization(v1.read_node(node))
        reclaim = cluster.reclaim(node, reclaim_flavour)
        pod = ended(recorder, "victim")
        assert reclaim.wait(60) and reclaim.error is None, reclaim.as_dict()
        wait_for(lambda: "victim" in recorder.deleted or pod["status"].get("phase"), 5, "end")
        return recorder.last("victim"), events_of(v1, ns, "victim", node), node_obj

    return run


def _preemption(cluster, v1, ns, recorder):
    klass = f"high-{ns}"
    k8s.SchedulingV1Api(v1.api_client).create_priority_class(
        {"metadata": {"name": klass}, "value": 1000}
    )
    pool, (node,) = add_test_pool(cluster, "gke", zone="us-central1-c", pods=1)
    v1.create_namespaced_pod(ns, step_pod("victim", pool))
    running(v1, ns, "victim")
    v1.create_namespaced_pod(ns, step_pod("preemptor", pool, priority_class=klass))
    wait_for(lambda: "victim" in recorder.deleted, 60, "the victim to go")
    k8s.SchedulingV1Api(v1.api_client).delete_priority_class(klass)
    return recorder.last("victim"), events_of(v1, ns, "victim", node), None


def _taint_manager(cluster, v1, ns, recorder):
    pool, (node,) = add_test_pool(cluster, "eks")
    v1.create_namespaced_pod(ns, step_pod("victim", pool))
    running(v1, ns, "victim")
    request = urllib.request.Request(
        f"{cluster.url}/emulator/v1/nodes/{node}/taint",
        method="POST",
        data=json.dumps({"key": "example.com/out", "effect": "NoExecute"}).encode(),
        headers={"Authorization": f"Bearer {cluster.token}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=5).read()
    wait_for(lambda: "victim" in recorder.deleted, 60, "the victim to go")
    return recorder.last("victim"), events_of(v1, ns, "victim", node), None


_RUNS = {
    "gke": _reclaim("gke", "gke", zone="us-central1-a"),
    "gke-exit-0": _reclaim("gke", "gke", exit_code=0, zone="us-central1-b"),
    "aks": _reclaim("aks", "aks", zone="eastus-1"),
    "eks": _reclaim("eks", "eks"),
    "karpenter": _reclaim(
        "karpenter", "karpenter", annotations={"karpenter.sh/do-not-disrupt": "true"}
    ),
    "karpenter-consolidation": _reclaim("karpenter", "karpenter-consolidation"),
    "autoscaler-scale-down": _reclaim("eks", "autoscaler-scale-down"),
    "drain": _reclaim("eks", "drain", capacity_type="on-demand"),
    "preemption": _preemption,
    "taint-manager": _taint_manager,
}


def _disruption(pod):
    return next(
        (
            (c.get("reason"), c.get("message"))
            for c in pod["status"].get("conditions") or []
            if c["type"] == "DisruptionTarget"
        ),
        None,
    )


@pytest.mark.parametrize("flavour", sorted(_RUNS))
def test_each_flavour_produces_what_the_corpus_shows(
    flavour, kube_cluster, kube_client, kube_namespace, tmp_path
):
    documents = corpus_for(flavour)
    assert documents, f"no corpus document names the emulator flavour {flavour!r}"
    pod, events, node = run_flavour(flavour, kube_cluster, kube_client, kube_namespace, tmp_path)
    for doc in documents:
        want = doc["pod"]["status"]
        for field in ("phase", "reason", "message"):
            if field in want:
                assert pod["status"].get(field) == want[field], (field, pod["status"])
        if _disruption(doc["pod"]):
            assert _disruption(pod) == _disruption(doc["pod"])
        for event in doc.get("events", ()):
            assert any(
                e["reason"] == event["reason"]
                and e["message"] == event["message"]
                and (e.get("source") or {}).get("component") == event["source"]["component"]
                for e in events
            ), (event, events)
        # the classifier reads the emulator's pod as it reads the document, the node gone
        verdict = classify.classify_pod(
            pod,
            None if node is not None else classify.UNKNOWN,
            events=events,
            spot=doc.get("spot", _spot(node)),
            now=classify.parse_time("2040-01-01T00:00:00Z"),
        )
        assert verdict.outcome == doc["expected"]["outcome"], verdict.reason


def _spot(node):
    return None if node is None else classify.spot_of({}, node)


@pytest.mark.parametrize(
    "flavour,pool_flavour",
    [("karpenter-consolidation", "karpenter"), ("autoscaler-scale-down", "eks")],
)
def test_voluntary_flavours_leave_a_do_not_disrupt_pod_alone(
    flavour, pool_flavour, kube_cluster, kube_client, kube_namespace
):
    from spot_core.providers.kubernetes_pods import DO_NOT_DISRUPT

    v1 = k8s.CoreV1Api(kube_client)
    pool, (node,) = add_test_pool(kube_cluster, pool_flavour)
    v1.create_namespaced_pod(kube_namespace, step_pod("kept", pool, annotations=DO_NOT_DISRUPT))
    running(v1, kube_namespace, "kept")
    reclaim = kube_cluster.reclaim(node, flavour)
    assert reclaim.wait(30) and any(step.startswith("blocked") for step in reclaim.steps)
    assert v1.read_namespaced_pod("kept", kube_namespace).status.phase == "Running"
    assert not v1.read_node(node).spec.taints or all(
        t.key not in ("karpenter.sh/disrupted", "ToBeDeletedByClusterAutoscaler")
        for t in v1.read_node(node).spec.taints
    )
