"""SpotJobOperator(provider="kubernetes") through the provider registry, against the
Kubernetes API emulator: deferrable, the real trigger watches the pod; its spot node is
reclaimed the Karpenter way after the first checkpoint, and the job resumes from it on
the on-demand node group without spending an Airflow retry."""

from __future__ import annotations

import sys
import threading
import time
from datetime import datetime

import pytest
from airflow.sdk import DAG

from airflow_spot.operators.spot import RECORD_KEY, SpotJobOperator
from spot_core.checkpoint import open_store
from spot_core.model import JobRecord
from spot_emulators.kubernetes import ClusterConfig, KubeCluster, NodePool
from tests.support.spot_helpers import train_command
from tests.support.task_context import TI, StateStore, drive_deferrals

pytestmark = pytest.mark.timeout(240)


def _reclaim_after_first_checkpoint(cluster, store_uri: str) -> threading.Thread:
    store = open_store(store_uri)

    def run():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = cluster.store.list("pods", None)[0]
            node = next(
                (
                    p["spec"].get("nodeName")
                    for p in pods
                    if (p["metadata"].get("labels") or {}).get("spot-pipelines/attempt") == "1"
                    and p["status"].get("phase") == "Running"
                ),
                None,
            )
            if node and any(r.attempt == 1 for r in store.list()):
                cluster.reclaim(node, "karpenter")
                return
            time.sleep(0.1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_deferrable_job_on_kubernetes_is_preempted_and_resumes_on_demand(tmp_path):
    pools = [
        NodePool("karpenter-spot", "karpenter", "spot", "us-east-1b", replace_after_seconds=None),
        NodePool("eks-on-demand", "eks", "on-demand", "us-east-1c"),
    ]
    uri = (tmp_path / "ckpt").as_uri()
    with KubeCluster(tmp_path / "cluster", ClusterConfig(pools=pools, time_scale=0.1)) as cluster:
        with DAG("k8s_dag", schedule=None, start_date=datetime(2026, 1, 1)):
            op = SpotJobOperator(
                task_id="train",
                provider="kubernetes",
                checkpoint_uri=uri,
                command=list(train_command(steps=300, every_steps=25)),
                provider_options={
                    "kubeconfig": str(cluster.kubeconfig_path),
                    "image": "train:1",
                    "watch_command": [sys.executable, "-m", "spot_core.cli"],
                    "watch_poll_interval": 0.2,
                    "prices": {"m5.xlarge": {"spot": 0.07, "on_demand": 0.192}},
                },
                max_preemptions=1,
                poll_interval=0.2,
                capacity_wait=1.0,
                deferrable=True,
            )
        store, ti = StateStore(), TI()
        _reclaim_after_first_checkpoint(cluster, uri)
        summary = drive_deferrals(op, {"task_state_store": store, "ti": ti})
        left = [p["metadata"]["name"] for p in cluster.store.list("pods", None)[0]]
    assert summary["status"] == "succeeded" and summary["preemptions"] == 1, summary
    record = JobRecord.from_dict(store.data[RECORD_KEY])
    assert [str(a.pool.market) for a in record.attempts] == ["spot", "on-demand"]
    assert record.attempts[0].outcome.value == "preempted"
    assert record.attempts[1].checkpoint_step_start > 0
    assert ti.xcom[RECORD_KEY]["status"] == "succeeded"
    assert not left, f"pods left behind: {left}"


def test_the_cluster_can_come_from_a_kubernetes_connection(tmp_path, monkeypatch):
    """``kubernetes_conn_id`` instead of a kubeconfig in provider_options: the connection is
    resolved through cncf-kubernetes' hook into the provider's API client."""
    import json

    pools = [NodePool("eks-spot", "eks", "spot", "us-east-1a")]
    uri = (tmp_path / "ckpt").as_uri()
    with KubeCluster(tmp_path / "cluster", ClusterConfig(pools=pools, time_scale=0.1)) as cluster:
        monkeypatch.setenv(
            "AIRFLOW_CONN_K8S_SPOT",
            json.dumps(
                {
                    "conn_type": "kubernetes",
                    "extra": {"kube_config_path": str(cluster.kubeconfig_path)},
                }
            ),
        )
        with DAG("k8s_conn_dag", schedule=None, start_date=datetime(2026, 1, 1)):
            op = SpotJobOperator(
                task_id="train",
                provider="kubernetes",
                checkpoint_uri=uri,
                kubernetes_conn_id="k8s_spot",
                command=list(train_command(steps=100, every_steps=25)),
                provider_options={
                    "image": "train:1",
                    "watch_command": [sys.executable, "-m", "spot_core.cli"],
                    "watch_poll_interval": 0.2,
                },
                poll_interval=0.2,
                deferrable=False,
            )
        summary = drive_deferrals(op, {"task_state_store": StateStore(), "ti": TI()})
        left = [p["metadata"]["name"] for p in cluster.store.list("pods", None)[0]]
    assert summary["status"] == "succeeded", summary
    assert not left, f"pods left behind: {left}"
