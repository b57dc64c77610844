"""SpotTaskRunner with provider="kubernetes", against a real Prefect server and the
Kubernetes API emulator: each attempt of a task is a pod on a spot node pool; reclaimed
(Karpenter: taint and evict) after its first checkpoint, the task resumes from it on the
on-demand node group within the same Prefect try. No secret reaches the pod: the runner
signs the call with an Ed25519 key it keeps and gives the pod only the public half; the
pod signs its result with its own key and publishes the public half as an annotation on
its own pod, where the runner reads it. A result that does not verify is refused."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
from prefect import flow, task

from prefect_spot import SpotConfiguration, SpotTaskRunner, spot_record
from prefect_spot._remote import CALL_PUBKEY_ENV, PUBKEY_TAG, UntrustedObject
from spot_core.checkpoint import open_store
from spot_core.model import Market, Outcome
from spot_emulators.kubernetes import ClusterConfig, KubeCluster, NodePool
from tests.support.prefect_helpers import count_to

pytestmark = pytest.mark.timeout(240)
TESTS = str(Path(__file__).resolve().parent)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A Karpenter spot pool and an EKS on-demand pool; the pods' `python3` is this
    environment's (the emulator's pods get its PATH, as an image has its own Python)."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    pools = [
        NodePool("karpenter-spot", "karpenter", "spot", "us-east-1b", replace_after_seconds=None),
        NodePool("eks-on-demand", "eks", "on-demand", "us-east-1c"),
    ]
    with KubeCluster(tmp_path / "cluster", ClusterConfig(pools=pools, time_scale=0.1)) as kube:
        yield kube


def k8s_config(cluster, root: Path, **fields) -> SpotConfiguration:
    template = {
        "spec": {
            "volumes": [{"name": "store", "hostPath": {"path": str(root)}}],
            "containers": [
                {
                    "name": "step",
                    "env": [{"name": "PYTHONPATH", "value": TESTS}],
                    "volumeMounts": [{"name": "store", "mountPath": str(root)}],
                }
            ],
        }
    }
    options = {
        "kubeconfig": str(cluster.kubeconfig_path),
        "image": "tasks:1",
        "watch_command": [sys.executable, "-m", "spot_core.cli"],
        "watch_poll_interval": 0.2,
        "pod_template": template,
        "prices": {"m5.xlarge": {"spot": 0.07, "on_demand": 0.192}},
    }
    return SpotConfiguration(
        provider="kubernetes",
        provider_options=options,
        capacity_wait=0.5,
        poll_interval=0.2,
        **fields,
    )


def reclaim_first_attempt(cluster, root: Path) -> threading.Thread:
    def run():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = cluster.store.list("pods", None)[0]
            running = [
                p
                for p in pods
                if p["status"].get("phase") == "Running"
                and (p["metadata"].get("labels") or {}).get("spot-pipelines/attempt") == "1"
            ]
            for pod in running:
                job = pod["metadata"]["annotations"]["spot-pipelines/job-id"]
                store = open_store((root / job).as_uri())
                if any(r.attempt == 1 for r in store.list()):
                    cluster.reclaim(pod["spec"]["nodeName"], "karpenter")
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=run, daemon=True, name="reclaimer")
    thread.start()
    return thread


def test_task_preempted_on_kubernetes_resumes_on_demand_and_its_result_verifies(
    prefect_api, cluster, tmp_path
):
    root = tmp_path / "tasks"
    root.mkdir()
    config = k8s_config(cluster, root, max_preemptions=1)
    seen: dict[str, dict] = {}

    @flow(
        task_runner=SpotTaskRunner(
            config,
            checkpoint_storage=root.as_uri(),
            checkpoint_every_steps=10,
            workdir=tmp_path / "runner",
        )
    )
    def pipeline():
        future = count_to.submit(200, 0.02)
        return future.result(), spot_record(future)

    reclaimer = reclaim_first_attempt(cluster, root)
    watcher = threading.Thread(target=_remember_pods, args=(cluster, seen), daemon=True)
    watcher.start()
    result, record = pipeline()
    reclaimer.join(timeout=5)

    assert result["total"] == 200
    assert record.preemptions == 1
    first, last = record.attempts[0], record.attempts[-1]
    assert first.outcome is Outcome.PREEMPTED and first.pool.market is Market.SPOT
    assert last.outcome is Outcome.SUCCEEDED and last.pool.market is Market.ON_DEMAND
    assert result["started_at"] > 0 and result["started_at"] == last.checkpoint_step_start
    assert not cluster.store.list("pods", None)[0], "every pod deleted"
    # Each pod published its own public key on itself; the pod spec held only the
    # runner's public key, never a secret.
    published = {name: pod["metadata"]["annotations"].get(PUBKEY_TAG) for name, pod in seen.items()}
    assert set(published) == {a.lease_id for a in record.attempts}
    assert all(published.values()) and len(set(published.values())) == len(published)
    for pod in seen.values():
        env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
        assert CALL_PUBKEY_ENV in env and "SPOT_CALL_KEY" not in env


@task(retries=0)
def forge_own_result_key() -> str:
    """Re-publish another key on its own pod after signing: the runner must refuse."""
    from prefect_spot._remote import Ed25519Seal
    from spot_core.providers.kubernetes import annotate_own_pod

    return annotate_own_pod(PUBKEY_TAG, Ed25519Seal.generate().public_hex())


def test_a_result_that_does_not_verify_with_the_pods_key_is_refused(prefect_api, cluster, tmp_path):
    """The annotation a pod publishes is the only key its result verifies with: a result
    signed by one key while the pod shows another is refused unread."""
    root = tmp_path / "forged"
    root.mkdir()
    config = k8s_config(cluster, root, max_preemptions=0)

    @flow(task_runner=SpotTaskRunner(config, checkpoint_storage=root.as_uri()))
    def pipeline():
        future = forge_own_result_key.submit()
        return future.wait() or future.state

    with pytest.raises(UntrustedObject, match="does not verify"):
        pipeline()
    assert not cluster.store.list("pods", None)[0], "every pod deleted"


def _remember_pods(cluster, seen: dict) -> None:
    """Every spot-pipelines pod as last seen alive (they are deleted when attempts close)."""
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        for pod in cluster.store.list("pods", None)[0]:
            if (pod["metadata"].get("labels") or {}).get("spot-pipelines/managed"):
                seen[pod["metadata"]["name"]] = pod
        time.sleep(0.05)
