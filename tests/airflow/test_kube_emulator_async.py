"""The Kubernetes API emulator through ``kubernetes_asyncio`` and cncf-kubernetes'
``AsyncKubernetesHook``: what the deferrable pod operator's trigger calls (get the pod,
its events, watch its events, read its logs, delete it) works against the emulator and
every answer deserialises into the async client's models."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tests.support.kube_helpers import wait_for

kubernetes_asyncio = pytest.importorskip("kubernetes_asyncio")
from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook  # noqa: E402
from kubernetes_asyncio import client as aclient  # noqa: E402
from kubernetes_asyncio import config as aconfig  # noqa: E402
from kubernetes_asyncio import watch as awatch  # noqa: E402


def _pod(name: str, script: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "base",
                    "image": "python:3.11-slim",
                    "command": [sys.executable, "-c", script],
                }
            ],
        },
    }


def test_async_client_creates_watches_and_reads_a_pod(kube_cluster, kube_namespace):
    async def scenario():
        api = await aconfig.new_client_from_config(config_file=str(kube_cluster.kubeconfig_path))
        async with api:
            v1 = aclient.CoreV1Api(api)
            created = await v1.create_namespaced_pod(
                kube_namespace, _pod("async-pod", "print('from the async test')")
            )
            phases = []
            stream = awatch.Watch()
            async with stream:
                async for event in stream.stream(
                    v1.list_namespaced_pod, kube_namespace, timeout_seconds=30
                ):
                    phases.append(event["object"].status.phase)
                    if event["object"].status.phase == "Succeeded":
                        stream.stop()
            log = await v1.read_namespaced_pod_log("async-pod", kube_namespace)
            return created, phases, log

    created, phases, log = asyncio.run(scenario())
    assert created.status.phase == "Pending"
    assert phases[-1] == "Succeeded"
    assert log == "from the async test\n"


def test_the_deferrable_operators_hook_calls_work(kube_cluster, kube_namespace):
    hook = AsyncKubernetesHook(
        conn_id=None, connection_extras={"kube_config_path": str(kube_cluster.kubeconfig_path)}
    )
    kube_cluster.api.create(
        "pods",
        kube_namespace,
        _pod("hooked", "import time; print('step 1', flush=True); time.sleep(30)"),
    )
    wait_for(
        lambda: (
            kube_cluster.store.get("pods", kube_namespace, "hooked")["status"].get("phase")
            == "Running"
        ),
        30,
        "the pod to run",
    )

    async def scenario():
        pod = await hook.get_pod("hooked", kube_namespace)
        events = await hook.get_pod_events("hooked", kube_namespace)
        watched = []
        async for event in hook.watch_pod_events("hooked", kube_namespace, timeout_seconds=1):
            watched.append(event.reason)
            if event.reason == "Started":
                break
        logs = []
        for _ in range(50):
            logs = await hook.read_logs("hooked", kube_namespace)
            if logs:
                break
            await asyncio.sleep(0.1)
        await hook.delete_pod("hooked", kube_namespace, grace_period_seconds=1)
        return pod, events, watched, logs

    pod, events, watched, logs = asyncio.run(scenario())
    assert pod.status.phase == "Running" and pod.status.container_statuses[0].ready
    assert [e.reason for e in events.items][:1] == ["Scheduled"]
    assert "Started" in watched
    assert any(line.endswith("step 1") for line in logs)
    wait_for(
        lambda: kube_cluster.store.find("pods", kube_namespace, "hooked") is None,
        30,
        "the pod to be deleted",
    )
