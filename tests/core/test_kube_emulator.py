"""The Kubernetes API emulator, through the unmodified ``kubernetes`` client.

Every object read here goes through the client's models (a field the emulator got wrong
fails deserialisation), and every behaviour asserted is one a provider relies on: pods
run their command and their logs come back, the scheduler honours affinity and taints
and says why it cannot place a pod, the kubelet reports image, configuration and memory
failures as a real one does, and each flavour's reclaim leaves the documented conditions
and phase behind, with SIGTERM reaching the process before anything else.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest

from tests.support.kube_helpers import add_test_pool, emulator_processes, wait_for

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client as k8s  # noqa: E402
from kubernetes import watch  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from spot_emulators.kubernetes import (  # noqa: E402
    ClusterConfig,
    KubeCluster,
    NodePool,
    Timings,
)

AKS_SPOT_TOLERATION = {
    "key": "kubernetes.azure.com/scalesetpriority",
    "operator": "Equal",
    "value": "spot",
    "effect": "NoSchedule",
}
SIGTERM_SCRIPT = """
import pathlib, signal, sys, time
def on_term(*_):
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)   # a slow emergency save
    pathlib.Path(sys.argv[1]).write_text("TERM")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _ready(v1, name: str, namespace: str) -> bool:
    """A SIGTERM_SCRIPT pod is running and has said so: its handler is in place (Running
    alone comes before Python has even started, on a loaded machine long before)."""
    if v1.read_namespaced_pod(name, namespace).status.phase != "Running":
        return False
    return "ready" in v1.read_namespaced_pod_log(name, namespace)


def pod_body(name, command, *, pool=None, env=None, restart="Never", grace=10, **extra):
    container = {"name": "base", "image": "python:3.11-slim", "command": command}
    if env:
        container["env"] = env
    container.update(extra.pop("container", {}))
    spec = {
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": grace,
        "containers": [container],
        **extra,
    }
    if pool:
        spec["nodeSelector"] = {"spot-emulator/pool": pool}
        spec.setdefault("tolerations", []).append(AKS_SPOT_TOLERATION)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "kube-emu-test"}},
        "spec": spec,
    }


def core(kube_client) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_client)


def wait_phase(v1, ns, name, phases, timeout=30):
    return wait_for(
        lambda: (p := v1.read_namespaced_pod(name, ns)).status.phase in phases and p,
        timeout,
        f"pod {name} to reach {phases}",
    )


def gone(v1, ns, name) -> bool:
    try:
        v1.read_namespaced_pod(name, ns)
    except ApiException as exc:
        return exc.status == 404
    return False


class PodWatch:
    """Every pod event of a namespace, seen through the client's watch (deserialised)."""

    def __init__(self, api_client, namespace):
        self.events: list[tuple[str, k8s.V1Pod]] = []
        self._watch = watch.Watch()
        v1 = k8s.CoreV1Api(api_client)
        self._thread = threading.Thread(target=self._run, args=(v1, namespace), daemon=True)
        self._thread.start()

    def _run(self, v1, namespace):
        for event in self._watch.stream(v1.list_namespaced_pod, namespace, timeout_seconds=90):
            self.events.append((event["type"], event["object"]))

    def conditions(self, name):
        found = []
        for _, pod in self.events:
            if pod.metadata.name == name:
                found += [(c.type, c.status, c.reason) for c in pod.status.conditions or []]
        return found

    def types(self, name):
        return [kind for kind, pod in self.events if pod.metadata.name == name]


# -- API basics ------------------------------------------------------------------------------
def test_requests_without_the_token_get_a_401_status(kube_cluster):
    request = urllib.request.Request(f"{kube_cluster.url}/api/v1/namespaces/default/pods")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    body = json.loads(caught.value.read())
    assert caught.value.code == 401
    assert body["kind"] == "Status" and body["reason"] == "Unauthorized"
    assert stat.S_IMODE(os.stat(kube_cluster.kubeconfig_path).st_mode) == 0o600


def test_discovery_version_and_nodes_deserialize(kube_client, kube_cluster):
    assert k8s.VersionApi(kube_client).get_code().major == "1"
    groups = k8s.ApisApi(kube_client).get_api_versions()
    assert [g.name for g in groups.groups] == ["policy", "scheduling.k8s.io"]
    resources = k8s.CoreV1Api(kube_client).get_api_resources()
    assert {"pods", "pods/eviction", "pods/log", "nodes"} <= {r.name for r in resources.resources}
    nodes = core(kube_client).list_node().items
    spot = [n for n in nodes if n.metadata.labels.get("eks.amazonaws.com/capacityType") == "SPOT"]
    assert spot and spot[0].metadata.labels["topology.kubernetes.io/zone"] == "us-east-1a"
    ready = {c.type: c.status for c in nodes[0].status.conditions}
    assert ready["Ready"] == "True"


def test_errors_are_status_objects(kube_client, kube_namespace):
    v1 = core(kube_client)
    with pytest.raises(ApiException) as missing:
        v1.read_namespaced_pod("nope", kube_namespace)
    assert missing.value.status == 404
    assert json.loads(missing.value.body)["reason"] == "NotFound"
    body = pod_body("dup", [sys.executable, "-c", "pass"])
    v1.create_namespaced_pod(kube_namespace, body)
    with pytest.raises(ApiException) as exists:
        v1.create_namespaced_pod(kube_namespace, body)
    assert exists.value.status == 409
    bad = pod_body("bad", [sys.executable])
    del bad["spec"]["containers"][0]["image"]
    with pytest.raises(ApiException) as invalid:
        v1.create_namespaced_pod(kube_namespace, bad)
    assert invalid.value.status == 422
    assert "spec.containers[0].image: Required value" in json.loads(invalid.value.body)["message"]


# -- pods run, report and log ------------------------------------------------------------------
def test_a_pod_runs_its_command_with_its_env_and_its_logs_come_back(kube_client, kube_namespace):
    v1 = core(kube_client)
    v1.create_namespaced_secret(
        kube_namespace, {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}}
    )
    v1.create_namespaced_config_map(
        kube_namespace, {"metadata": {"name": "cfg"}, "data": {"steps": "7"}}
    )
    script = (
        "import os, sys; print('out', os.environ['POD'], os.environ['NODE'], "
        "os.environ['STEPS']); print('err', len(os.environ['TOKEN']), file=sys.stderr)"
    )
    env = [
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "STEPS", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "steps"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
    ]
    created = v1.create_namespaced_pod(
        kube_namespace, pod_body("hello", [sys.executable, "-c", script], env=env)
    )
    assert created.status.phase == "Pending" and created.metadata.uid
    assert created.spec.termination_grace_period_seconds == 10
    pod = wait_phase(v1, kube_namespace, "hello", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    conditions = {c.type: c.status for c in pod.status.conditions}
    assert conditions["PodScheduled"] == "True" and conditions["Ready"] == "False"
    log = v1.read_namespaced_pod_log("hello", kube_namespace)
    assert f"out hello {pod.spec.node_name} 7" in log and "err 6" in log
    stamped = v1.read_namespaced_pod_log("hello", kube_namespace, timestamps=True, tail_lines=1)
    assert len(stamped.splitlines()) == 1 and stamped[:4].isdigit() and "Z " in stamped
    reasons = [
        e.reason
        for e in v1.list_namespaced_event(
            kube_namespace, field_selector="involvedObject.name=hello"
        ).items
    ]
    assert reasons[:1] == ["Scheduled"] and "Started" in reasons


def test_a_pods_commands_resolve_to_the_emulators_venv(kube_client, kube_namespace):
    v1 = core(kube_client)
    v1.create_namespaced_pod(
        kube_namespace,
        pod_body(
            "venv",
            ["sh", "-c", "command -v spot-pipelines; python -c 'import sys; print(sys.prefix)'"],
        ),
    )
    wait_phase(v1, kube_namespace, "venv", ("Succeeded",))
    found, prefix = v1.read_namespaced_pod_log("venv", kube_namespace).split()
    assert found == os.path.join(os.path.dirname(sys.executable), "spot-pipelines")
    assert prefix == sys.prefix


def test_follow_streams_the_log_until_the_container_ends(kube_client, kube_namespace):
    v1 = core(kube_client)
    script = (
        "import time\nfor i in range(5):\n    print('line', i, flush=True)\n    time.sleep(0.1)"
    )
    v1.create_namespaced_pod(kube_namespace, pod_body("follow", [sys.executable, "-c", script]))
    wait_phase(v1, kube_namespace, "follow", ("Running", "Succeeded"))
    lines = list(
        watch.Watch().stream(v1.read_namespaced_pod_log, "follow", kube_namespace, follow=True)
    )
    assert lines == [f"line {i}" for i in range(5)]


def test_watch_from_a_resource_version_with_selectors(kube_client, kube_namespace):
    v1 = core(kube_client)
    listed = v1.list_namespaced_pod(kube_namespace)
    body = pod_body("watched", [sys.executable, "-c", "pass"])
    body["metadata"]["labels"]["tier"] = "gold"
    v1.create_namespaced_pod(kube_namespace, body)
    v1.create_namespaced_pod(kube_namespace, pod_body("other", [sys.executable, "-c", "pass"]))
    seen = []
    stream = watch.Watch()
    for event in stream.stream(
        v1.list_namespaced_pod,
        kube_namespace,
        timeout_seconds=20,
        resource_version=listed.metadata.resource_version,
        label_selector="tier in (gold,silver),app",
    ):
        seen.append((event["type"], event["object"].metadata.name, event["object"].status.phase))
        if event["object"].status.phase == "Succeeded":
            stream.stop()
    assert seen[0][:2] == ("ADDED", "watched")
    assert {name for _, name, _ in seen} == {"watched"}
    done = v1.list_namespaced_pod(
        kube_namespace, field_selector="status.phase=Succeeded,metadata.name=watched"
    )
    assert [p.metadata.name for p in done.items] == ["watched"]


def test_lists_page_with_limit_and_continue_and_delete_by_selector(kube_client, kube_namespace):
    v1 = core(kube_client)
    for index in range(5):
        v1.create_namespaced_config_map(kube_namespace, {"metadata": {"name": f"cm-{index}"}})
    first = v1.list_namespaced_config_map(kube_namespace, limit=2)
    assert [c.metadata.name for c in first.items] == ["cm-0", "cm-1"]
    assert first.metadata.remaining_item_count == 3
    rest = v1.list_namespaced_config_map(
        kube_namespace, limit=10, _continue=first.metadata._continue
    )
    assert [c.metadata.name for c in rest.items] == ["cm-2", "cm-3", "cm-4"]
    assert rest.metadata._continue is None
    v1.delete_collection_namespaced_config_map(kube_namespace, field_selector="metadata.name!=cm-0")
    assert [c.metadata.name for c in v1.list_namespaced_config_map(kube_namespace).items] == [
        "cm-0"
    ]


def test_patch_labels_and_cordon_a_node(kube_client, kube_cluster, kube_namespace):
    v1 = core(kube_client)
    v1.create_namespaced_pod(kube_namespace, pod_body("patched", [sys.executable, "-c", "pass"]))
    patched = v1.patch_namespaced_pod(
        "patched", kube_namespace, {"metadata": {"labels": {"checked": "yes"}}}
    )
    assert patched.metadata.labels == {"app": "kube-emu-test", "checked": "yes"}
    _, (node,) = add_test_pool(kube_cluster, "eks")
    cordoned = v1.patch_node(node, {"spec": {"unschedulable": True}})
    assert cordoned.spec.unschedulable is True
    wait_for(
        lambda: (
            [t.key for t in v1.read_node(node).spec.taints or []]
            == ["node.kubernetes.io/unschedulable"]
        ),
        10,
        "the cordon taint",
    )
    v1.patch_node(node, {"spec": {"unschedulable": None}})
    wait_for(lambda: not v1.read_node(node).spec.taints, 10, "the cordon taint to go")


def test_graceful_delete_sends_sigterm_and_waits_for_the_process(
    kube_client, kube_cluster, kube_namespace, tmp_path
):
    v1 = core(kube_client)
    marker = tmp_path / "term"
    v1.create_namespaced_pod(
        kube_namespace, pod_body("graceful", [sys.executable, "-c", SIGTERM_SCRIPT, str(marker)])
    )
    wait_for(lambda: _ready(v1, "graceful", kube_namespace), 30, "the pod to run")
    deleting = v1.delete_namespaced_pod("graceful", kube_namespace, grace_period_seconds=20)
    assert deleting.metadata.deletion_timestamp is not None
    assert deleting.metadata.deletion_grace_period_seconds == 20
    wait_for(lambda: gone(v1, kube_namespace, "graceful"), 30, "the pod to be removed")
    assert marker.read_text() == "TERM"


def test_a_stopped_container_hears_sigterm_only_through_its_pid_1(
    kube_client, kube_namespace, tmp_path
):
    """A kubelet stopping a container signals its PID 1; a child that PID 1 does not pass
    the signal on to (a shell's background job) hears nothing until the SIGKILL. So the
    pods' tests prove that ``spot-pipelines watch``, PID 1 of every step pod, forwards it."""
    v1 = core(kube_client)
    marker = tmp_path / "term"
    child = f'"{sys.executable}" -c "$SCRIPT" "{marker}" & wait'
    v1.create_namespaced_pod(
        kube_namespace,
        pod_body(
            "shell", ["sh", "-c", child], env=[{"name": "SCRIPT", "value": SIGTERM_SCRIPT}], grace=2
        ),
    )
    wait_for(lambda: _ready(v1, "shell", kube_namespace), 30, "the child to run")
    v1.delete_namespaced_pod("shell", kube_namespace)
    wait_for(lambda: gone(v1, kube_namespace, "shell"), 30, "the pod to be removed")
    assert not marker.exists(), "SIGTERM reached a process that PID 1 did not pass it to"


def test_a_force_delete_removes_the_object_at_once_and_still_stops_the_process(
    kube_client, kube_namespace, tmp_path
):
    v1 = core(kube_client)
    marker = tmp_path / "term"
    v1.create_namespaced_pod(
        kube_namespace, pod_body("forced", [sys.executable, "-c", SIGTERM_SCRIPT, str(marker)])
    )
    wait_for(lambda: _ready(v1, "forced", kube_namespace), 30, "run")
    v1.delete_namespaced_pod("forced", kube_namespace, grace_period_seconds=0)
    assert gone(v1, kube_namespace, "forced")
    wait_for(marker.exists, 10, "SIGTERM to reach the force-deleted pod's process")


# -- scheduling --------------------------------------------------------------------------------
def test_scheduler_honours_affinity_taints_and_tolerations(
    kube_client, kube_cluster, kube_namespace
):
    v1 = core(kube_client)
    aks_pool, (aks_node,) = add_test_pool(kube_cluster, "aks")
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.azure.com/agentpool",
                                "operator": "In",
                                "values": [aks_pool],
                            },
                            {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Exists"},
                        ]
                    }
                ]
            }
        }
    }
    v1.create_namespaced_pod(
        kube_namespace, pod_body("intolerant", [sys.executable, "-c", "pass"], affinity=affinity)
    )
    toleration = {
        "key": "kubernetes.azure.com/scalesetpriority",
        "operator": "Equal",
        "value": "spot",
        "effect": "NoSchedule",
    }
    v1.create_namespaced_pod(
        kube_namespace,
        pod_body(
            "tolerant", [sys.executable, "-c", "pass"], affinity=affinity, tolerations=[toleration]
        ),
    )
    placed = wait_for(
        lambda: v1.read_namespaced_pod("tolerant", kube_namespace).spec.node_name,
        20,
        "the tolerant pod to be bound",
    )
    assert placed == aks_node
    condition = wait_for(
        lambda: next(
            (
                c
                for c in v1.read_namespaced_pod("intolerant", kube_namespace).status.conditions
                or []
                if c.type == "PodScheduled"
            ),
            None,
        ),
        20,
        "PodScheduled on the intolerant pod",
    )
    assert (condition.status, condition.reason) == ("False", "Unschedulable")
    # Other tests' nodes share the session cluster (one may be cordoned): read the count.
    total = int(condition.message.split("/", 1)[1].split(" ", 1)[0])
    assert total >= 2
    assert condition.message.startswith(
        f"0/{total} nodes are available: 1 node(s) had "
        "untolerated taint {kubernetes.azure.com/"
        "scalesetpriority: spot}, "
    )
    assert "node(s) didn't match Pod's node affinity/selector." in condition.message
    assert condition.message.endswith(
        f"preemption: 0/{total} nodes are available: {total} "
        "Preemption is not helpful for scheduling."
    )
    events = v1.list_namespaced_event(
        kube_namespace, field_selector="involvedObject.name=intolerant"
    ).items
    assert any(e.reason == "FailedScheduling" and e.type == "Warning" for e in events)


def test_an_unschedulable_pod_is_placed_when_capacity_appears(
    kube_client, kube_cluster, kube_namespace
):
    v1 = core(kube_client)
    pool = f"later-{kube_namespace}"
    v1.create_namespaced_pod(
        kube_namespace, pod_body("waits", [sys.executable, "-c", "pass"], pool=pool)
    )
    wait_for(
        lambda: any(
            c.reason == "Unschedulable"
            for c in v1.read_namespaced_pod("waits", kube_namespace).status.conditions or []
        ),
        20,
        "Unschedulable",
    )
    (node,) = kube_cluster.add_pool(NodePool(pool, "gke", zone="us-central1-a"))
    assert wait_phase(v1, kube_namespace, "waits", ("Succeeded",)).spec.node_name == node


def test_pod_capacity_and_cpu_requests_limit_a_node(kube_client, kube_cluster, kube_namespace):
    v1 = core(kube_client)
    pool, _ = add_test_pool(kube_cluster, "gke", zone="us-central1-b", pods=1, cpu="2")
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    v1.create_namespaced_pod(kube_namespace, pod_body("first", sleeper, pool=pool, grace=0))
    wait_phase(v1, kube_namespace, "first", ("Running",))
    v1.create_namespaced_pod(kube_namespace, pod_body("second", sleeper, pool=pool, grace=0))
    message = wait_for(
        lambda: next(
            (
                c.message
                for c in v1.read_namespaced_pod("second", kube_namespace).status.conditions or []
                if c.reason == "Unschedulable"
            ),
            None,
        ),
        20,
        "the second pod to be unschedulable",
    )
    assert "1 Too many pods" in message


# -- kubelet failures --------------------------------------------------------------------------
def _waiting(v1, ns, name, reason):
    def check():
        statuses = v1.read_namespaced_pod(name, ns).status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return waiting if waiting is not None and waiting.reason == reason else None

    return wait_for(check, 30, f"{name} waiting with {reason}")


def test_an_unknown_image_is_err_image_pull_then_back_off(kube_client, kube_namespace):
    v1 = core(kube_client)
    body = pod_body("pull", [sys.executable, "-c", "pass"])
    body["spec"]["containers"][0]["image"] = "example.com/doesnotexist:1"
    v1.create_namespaced_pod(kube_namespace, body)
    pulled = _waiting(v1, kube_namespace, "pull", "ErrImagePull")
    assert 'failed to pull and unpack image "example.com/doesnotexist:1"' in pulled.message
    backoff = _waiting(v1, kube_namespace, "pull", "ImagePullBackOff")
    assert backoff.message.startswith('Back-off pulling image "example.com/doesnotexist:1"')
    assert v1.read_namespaced_pod("pull", kube_namespace).status.phase == "Pending"


def test_a_missing_secret_is_create_container_config_error_until_it_exists(
    kube_client, kube_namespace
):
    v1 = core(kube_client)
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "t"}}}]
    v1.create_namespaced_pod(
        kube_namespace,
        pod_body(
            "config", [sys.executable, "-c", "import os; print(os.environ['TOKEN'])"], env=env
        ),
    )
    waiting = _waiting(v1, kube_namespace, "config", "CreateContainerConfigError")
    assert waiting.message == 'secret "later" not found'
    v1.create_namespaced_secret(
        kube_namespace, {"metadata": {"name": "later"}, "stringData": {"t": "value"}}
    )
    assert wait_phase(v1, kube_namespace, "config", ("Succeeded",), timeout=30)
    assert v1.read_namespaced_pod_log("config", kube_namespace) == "value\n"


def test_a_failed_container_reports_its_exit_code_and_log_tail(kube_client, kube_namespace):
    v1 = core(kube_client)
    script = "import sys; print('loss exploded', file=sys.stderr); sys.exit(3)"
    v1.create_namespaced_pod(
        kube_namespace,
        pod_body(
            "broken",
            [sys.executable, "-c", script],
            container={"terminationMessagePolicy": "FallbackToLogsOnError"},
        ),
    )
    pod = wait_phase(v1, kube_namespace, "broken", ("Failed", "Succeeded"))
    terminated = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, terminated.exit_code, terminated.reason) == ("Failed", 3, "Error")
    assert terminated.message == "loss exploded\n"


def test_memory_above_the_limit_is_oom_killed(kube_client, kube_namespace):
    v1 = core(kube_client)
    script = (
        "import time\nblocks = []\nwhile True:\n    blocks.append(bytearray(8 << 20))\n"
        "    time.sleep(0.01)"
    )
    limits = {"resources": {"limits": {"memory": "64Mi"}}}
    v1.create_namespaced_pod(
        kube_namespace, pod_body("hungry", [sys.executable, "-c", script], container=limits)
    )
    v1.create_namespaced_pod(
        kube_namespace,
        pod_body(
            "modest",
            [sys.executable, "-c", "import time; b = bytearray(8 << 20); time.sleep(1)"],
            container=limits,
        ),
    )
    assert (
        wait_phase(v1, kube_namespace, "modest", ("Failed", "Succeeded")).status.phase
        == "Succeeded"
    )
    pod = wait_phase(v1, kube_namespace, "hungry", ("Failed", "Succeeded"))
    terminated = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, terminated.reason, terminated.exit_code) == (
        "Failed",
        "OOMKilled",
        137,
    )
    assert pod.status.qos_class == "Burstable"  # a memory limit alone, no cpu


def test_on_failure_restarts_the_container_with_its_previous_log(
    kube_client, kube_namespace, tmp_path
):
    v1 = core(kube_client)
    counter = tmp_path / "runs"
    script = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = len(p.read_text()) "
        "if p.exists() else 0; p.write_text('x' * (n + 1)); print('run', n); "
        "sys.exit(3 if n == 0 else 0)"
    )
    v1.create_namespaced_pod(
        kube_namespace,
        pod_body("flaky", [sys.executable, "-c", script, str(counter)], restart="OnFailure"),
    )
    pod = wait_phase(v1, kube_namespace, "flaky", ("Succeeded", "Failed"), timeout=60)
    status = pod.status.container_statuses[0]
    assert (pod.status.phase, status.restart_count) == ("Succeeded", 1)
    assert status.last_state.terminated.exit_code == 3
    assert v1.read_namespaced_pod_log("flaky", kube_namespace, previous=True) == "run 0\n"
    assert v1.read_namespaced_pod_log("flaky", kube_namespace) == "run 1\n"


# -- disruption --------------------------------------------------------------------------------
def _running_sigterm_pod(v1, ns, name, pool, marker, grace=10):
    v1.create_namespaced_pod(
        ns,
        pod_body(name, [sys.executable, "-c", SIGTERM_SCRIPT, str(marker)], pool=pool, grace=grace),
    )
    wait_for(lambda: _ready(v1, name, ns), 30, f"{name} to run")


def test_eviction_api_respects_a_disruption_budget(
    kube_client, kube_cluster, kube_namespace, tmp_path
):
    v1, policy = core(kube_client), k8s.PolicyV1Api(kube_client)
    pool, _ = add_test_pool(kube_cluster, "karpenter")
    _running_sigterm_pod(v1, kube_namespace, "guarded", pool, tmp_path / "term")
    policy.create_namespaced_pod_disruption_budget(
        kube_namespace,
        {
            "metadata": {"name": "keep-one"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "kube-emu-test"}}},
        },
    )
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "guarded", "namespace": kube_namespace},
    }
    with pytest.raises(ApiException) as blocked:
        v1.create_namespaced_pod_eviction("guarded", kube_namespace, eviction)
    assert blocked.value.status == 429
    assert "disruption budget" in json.loads(blocked.value.body)["message"]
    policy.delete_namespaced_pod_disruption_budget("keep-one", kube_namespace)
    pods = PodWatch(kube_client, kube_namespace)
    v1.create_namespaced_pod_eviction("guarded", kube_namespace, eviction)
    wait_for(lambda: gone(v1, kube_namespace, "guarded"), 30, "the evicted pod to go")
    wait_for(lambda: "DELETED" in pods.types("guarded"), 10, "the DELETED watch event")
    assert ("DisruptionTarget", "True", "EvictionByEvictionAPI") in pods.conditions("guarded")
    assert any(pod.metadata.deletion_timestamp for _, pod in pods.events)
    assert (tmp_path / "term").read_text() == "TERM"


@pytest.mark.parametrize("flavour", ["karpenter", "eks", "gke", "aks"])
def test_each_flavours_reclaim_leaves_the_documented_trail(
    flavour, kube_client, kube_cluster, kube_namespace, tmp_path
):
    v1 = core(kube_client)
    zone = {"gke": "us-central1-a", "aks": "eastus-1"}.get(flavour, "us-east-1a")
    pool, (node,) = add_test_pool(kube_cluster, flavour, zone=zone)
    marker = tmp_path / "term"
    pods = PodWatch(kube_client, kube_namespace)
    _running_sigterm_pod(v1, kube_namespace, "victim", pool, marker)
    reclaim = kube_cluster.reclaim(node)
    assert reclaim.wait(60) and reclaim.error is None, reclaim.as_dict()
    wait_for(lambda: gone(v1, kube_namespace, "victim"), 30, "the reclaimed pod to go")
    wait_for(lambda: "DELETED" in pods.types("victim"), 10, "the DELETED watch event")
    assert marker.read_text() == "TERM"  # SIGTERM reached the step first
    with pytest.raises(ApiException) as missing:
        v1.read_node(node)
    assert missing.value.status == 404
    conditions = pods.conditions("victim")
    expected = {
        "karpenter": "EvictionByEvictionAPI",
        "eks": "EvictionByEvictionAPI",
        "gke": "TerminationByKubelet",
        "aks": "DeletionByPodGC",
    }[flavour]
    assert ("DisruptionTarget", "True", expected) in conditions
    last = [pod for kind, pod in pods.events if pod.metadata.name == "victim"][-1]
    if flavour == "gke":
        assert (last.status.phase, last.status.reason, last.status.message) == (
            "Failed",
            "Terminated",
            "Pod was terminated in response to imminent node shutdown.",
        )
    if flavour == "aks":
        assert last.status.phase == "Failed"
    taints = {
        "karpenter": "tainted karpenter.sh/disrupted:NoSchedule",
        "eks": "cordoned",
        "gke": "tainted cloud.google.com/impending-node-termination:NoSchedule",
        "aks": "VM evicted",
    }[flavour]
    assert taints in reclaim.steps


def test_karpenter_leaves_a_pod_tolerating_its_taint_to_go_down_with_the_instance(
    kube_client, kube_cluster, kube_namespace, tmp_path
):
    v1 = core(kube_client)
    pool, (node,) = add_test_pool(kube_cluster, "karpenter")
    marker = tmp_path / "term"
    pods = PodWatch(kube_client, kube_namespace)
    v1.create_namespaced_pod(
        kube_namespace,
        pod_body(
            "stubborn",
            [sys.executable, "-c", SIGTERM_SCRIPT, str(marker)],
            pool=pool,
            tolerations=[{"operator": "Exists"}],
        ),
    )
    wait_for(
        lambda: _ready(v1, "stubborn", kube_namespace),
        30,
        "the pod to run with its SIGTERM handler in place",
    )
    reclaim = kube_cluster.reclaim(node)
    assert reclaim.wait(60) and reclaim.error is None, reclaim.as_dict()
    wait_for(lambda: "DELETED" in pods.types("stubborn"), 30, "the pod to go")
    assert marker.read_text() == "TERM"
    conditions = pods.conditions("stubborn")
    assert ("DisruptionTarget", "True", "DeletionByPodGC") in conditions
    assert not any(reason == "EvictionByEvictionAPI" for _, _, reason in conditions)


def test_gke_shutdown_stops_regular_pods_before_critical_ones(
    kube_client, kube_cluster, kube_namespace, tmp_path
):
    v1 = core(kube_client)
    pool, (node,) = add_test_pool(kube_cluster, "gke", zone="us-central1-f")
    for name, klass, save in (("regular", None, "0.5"), ("critical", "system-node-critical", "0")):
        extra = {"priorityClassName": klass} if klass else {}
        v1.create_namespaced_pod(
            kube_namespace,
            pod_body(
                name,
                [sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path / name), save],
                pool=pool,
                **extra,
            ),
        )
    for name in ("regular", "critical"):
        wait_for(lambda name=name: _ready(v1, name, kube_namespace), 30, f"{name} to run")
    assert kube_cluster.reclaim(node).wait(60)
    regular, critical = ((tmp_path / n).stat().st_mtime_ns for n in ("regular", "critical"))
    assert regular < critical  # the critical pod's SIGTERM came after the regular one ended


def test_a_noexecute_taint_evicts_through_the_taint_manager(
    kube_client, kube_cluster, kube_namespace, tmp_path
):
    v1 = core(kube_client)
    pool, (node,) = add_test_pool(kube_cluster, "eks")
    body = pod_body("tainted", [sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path / "t")])
    body["spec"]["nodeSelector"] = {"spot-emulator/pool": pool}
    v1.create_namespaced_pod(kube_namespace, body)
    wait_for(lambda: _ready(v1, "tainted", kube_namespace), 30, "the pod to run")
    pods = PodWatch(kube_client, kube_namespace)
    request = urllib.request.Request(
        f"{kube_cluster.url}/emulator/v1/nodes/{node}/taint",
        method="POST",
        data=json.dumps({"key": "example.com/out", "effect": "NoExecute"}).encode(),
        headers={
            "Authorization": f"Bearer {kube_cluster.token}",
            "Content-Type": "application/json",
        },
    )
    urllib.request.urlopen(request, timeout=5).read()
    wait_for(lambda: gone(v1, kube_namespace, "tainted"), 30, "the tainted pod to go")
    wait_for(
        lambda: (
            ("DisruptionTarget", "True", "DeletionByTaintManager") in pods.conditions("tainted")
        ),
        10,
        "DeletionByTaintManager",
    )


def test_reclaim_over_http_needs_the_token(kube_cluster):
    _, (node,) = add_test_pool(kube_cluster, "karpenter", replace_after_seconds=0.5)
    url = f"{kube_cluster.url}/emulator/v1/nodes/{node}/reclaim?flavour=karpenter&wait=true"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=5)
    assert refused.value.code == 401
    request = urllib.request.Request(
        url, method="POST", headers={"Authorization": f"Bearer {kube_cluster.token}"}
    )
    answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
    assert answer["done"] and answer["error"] is None
    assert kube_cluster.store.find("nodes", "", node) is None
    pool = answer["node"].rsplit("-", 2)[0]
    wait_for(
        lambda: [
            n
            for n in kube_cluster.store.all("nodes")
            if n["metadata"]["labels"]["spot-emulator/pool"] == pool
        ],
        20,
        "the pool to replace its node",
    )


# -- lifecycle ---------------------------------------------------------------------------------
def test_stop_kills_every_pod_process(tmp_path):
    cluster = KubeCluster(tmp_path / "k", ClusterConfig(time_scale=0.1)).start()
    try:
        cluster.api.create(
            "pods",
            "default",
            pod_body(
                "forever",
                [
                    sys.executable,
                    "-c",
                    "import subprocess, sys, time; subprocess.Popen([sys.executable,"
                    " '-c', 'import os, time; os.setsid(); time.sleep(600)']); time.sleep(600)",
                ],
            ),
        )
        wait_for(
            lambda: len(emulator_processes(cluster)) >= 2,
            30,
            "the pod and its child (in a session of its own) to run",
        )
    finally:
        cluster.stop()
    assert not emulator_processes(cluster)


def test_the_command_line_emulator_serves_and_stops_cleanly(tmp_path):
    config = tmp_path / "cluster.json"
    config.write_text(
        json.dumps(
            {
                "pools": [
                    {"name": "gke-spot", "flavour": "gke", "zone": "us-central1-a", "nodes": 2}
                ],
                "time_scale": 0.1,
            }
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spot_emulators.kubernetes",
            "--workdir",
            str(tmp_path / "w"),
            "--cluster",
            str(config),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        info = json.loads(proc.stdout.readline())
        api = kubernetes.config.new_client_from_config(info["kubeconfig"])
        nodes = k8s.CoreV1Api(api).list_node().items
        assert sorted(n.metadata.labels["cloud.google.com/gke-spot"] for n in nodes) == [
            "true",
            "true",
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_a_bad_cluster_file_is_one_clear_line(tmp_path):
    config = tmp_path / "cluster.json"
    config.write_text(json.dumps({"pools": [{"name": "p", "flavour": "openshift"}]}))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_emulators.kubernetes",
            "--workdir",
            str(tmp_path),
            "--cluster",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: pool 'p': flavour must be one of ('eks', 'karpenter', 'gke', 'aks'), "
        "got 'openshift'"
    ]


def test_a_node_with_metadata_serves_the_spot_notice_to_its_pods(
    kube_client, kube_cluster, kube_namespace
):
    v1 = core(kube_client)
    pool, (node,) = add_test_pool(kube_cluster, "eks", metadata=True)
    script = "import os; print(os.environ['SPOT_METADATA_ENDPOINT'])"
    v1.create_namespaced_pod(
        kube_namespace, pod_body("imds", [sys.executable, "-c", script], pool=pool)
    )
    wait_phase(v1, kube_namespace, "imds", ("Succeeded",))
    endpoint = v1.read_namespaced_pod_log("imds", kube_namespace).strip()
    assert endpoint == kube_cluster.metadata[node].url
    reclaim = kube_cluster.reclaim(node)
    token = (
        urllib.request.urlopen(
            urllib.request.Request(
                f"{endpoint}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
            ),
            timeout=5,
        )
        .read()
        .decode()
    )
    action = wait_for(lambda: _imds(endpoint, token, "spot/instance-action"), 10, "the spot notice")
    assert json.loads(action)["action"] == "terminate"
    assert reclaim.wait(30) and "metadata notice served" in reclaim.steps


def _imds(endpoint: str, token: str, path: str) -> str | None:
    request = urllib.request.Request(
        f"{endpoint}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token}
    )
    try:
        return urllib.request.urlopen(request, timeout=5).read().decode()
    except urllib.error.HTTPError:
        return None


def test_node_watch_sees_the_taint_then_the_deletion(kube_client, kube_cluster):
    v1 = core(kube_client)
    _, (node,) = add_test_pool(kube_cluster, "karpenter")
    listed = v1.list_node()
    reclaim = kube_cluster.reclaim(node)
    seen = []
    stream = watch.Watch()
    for event in stream.stream(
        v1.list_node,
        field_selector=f"metadata.name={node}",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=30,
    ):
        taints = [
            (t.key, t.effect, t.time_added is not None) for t in event["object"].spec.taints or []
        ]
        seen.append((event["type"], taints))
        if event["type"] == "DELETED":
            stream.stop()
    assert reclaim.wait(10)
    assert seen[0] == ("MODIFIED", [("karpenter.sh/disrupted", "NoSchedule", True)])
    assert seen[-1][0] == "DELETED"


def test_namespaces_and_budgets_deserialize(kube_client, kube_namespace):
    v1, policy = core(kube_client), k8s.PolicyV1Api(kube_client)
    namespace = v1.read_namespace(kube_namespace)
    assert namespace.status.phase == "Active"
    assert kube_namespace in [n.metadata.name for n in v1.list_namespace().items]
    budget = policy.create_namespaced_pod_disruption_budget(
        kube_namespace,
        {
            "metadata": {"name": "b"},
            "spec": {"maxUnavailable": "50%", "selector": {"matchLabels": {"a": "b"}}},
        },
    )
    assert budget.spec.max_unavailable == "50%"
    secret = v1.create_namespaced_secret(
        kube_namespace, {"metadata": {"name": "s"}, "stringData": {"k": "v"}}
    )
    assert secret.data == {"k": "dg=="} and secret.type == "Opaque"


def test_a_higher_priority_pod_preempts_a_lower_one(
    kube_client, kube_cluster, kube_namespace, tmp_path
):
    v1, scheduling = core(kube_client), k8s.SchedulingV1Api(kube_client)
    name = f"high-{kube_namespace}"
    scheduling.create_priority_class({"metadata": {"name": name}, "value": 1000})
    pool, (node,) = add_test_pool(kube_cluster, "gke", zone="us-central1-c", pods=1)
    marker = tmp_path / "term"
    pods = PodWatch(kube_client, kube_namespace)
    _running_sigterm_pod(v1, kube_namespace, "low", pool, marker)
    high = pod_body(
        "high", [sys.executable, "-c", "print('mine now')"], pool=pool, priorityClassName=name
    )
    created = v1.create_namespaced_pod(kube_namespace, high)
    assert created.spec.priority == 1000
    done = wait_phase(v1, kube_namespace, "high", ("Succeeded",))
    assert done.spec.node_name == node
    assert marker.read_text() == "TERM"
    assert ("DisruptionTarget", "True", "PreemptionByScheduler") in pods.conditions("low")
    assert gone(v1, kube_namespace, "low")
    unknown = pod_body("nobody", [sys.executable, "-c", "pass"], priorityClassName="missing")
    with pytest.raises(ApiException) as refused:
        v1.create_namespaced_pod(kube_namespace, unknown)
    assert refused.value.status == 403
    scheduling.delete_priority_class(name)


def test_events_expire_after_the_event_ttl(tmp_path):
    config = ClusterConfig(time_scale=0.1, timings=Timings(event_ttl_seconds=10))
    with KubeCluster(tmp_path / "k", config) as cluster:
        cluster.api.create("pods", "default", pod_body("brief", [sys.executable, "-c", "pass"]))
        wait_for(lambda: cluster.store.list("events", "default")[0], 10, "events")
        wait_for(
            lambda: (
                not [
                    e
                    for e in cluster.store.list("events", "default")[0]
                    if e["involvedObject"]["name"] == "brief"
                ]
            ),
            15,
            "the pod's events to expire",
        )
