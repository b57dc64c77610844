"""Test DAG for SpotKubernetesPodOperator under ``airflow standalone``; the cluster and
its node pools come from the environment the test sets (defaults parse anywhere).

``spot_k8s_triggerer_restart`` trains in a pod on the Kubernetes emulator, deferred to
the triggerer; the test kills the triggerer, starts another, and reclaims the pod's node.
The cluster is the Airflow connection ``spot_k8s_standalone`` (AIRFLOW_CONN_...).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG
from kubernetes.client import models as k8s

from airflow_spot.operators.kubernetes import SpotKubernetesPodOperator

WORK = os.environ.get("SPOT_K8S_WORK", "/tmp/spot-k8s-work")
NODE_POOLS = [p for p in os.environ.get("SPOT_K8S_NODE_POOLS", "").split(",") if p]
OPTIONS = {
    "watch_command": [sys.executable, "-m", "spot_core.cli"],
    "watch_poll_interval": 0.2,
    "node_refresh_seconds": 0.5,
    "capacity_cooldown_seconds": 5,
    "prices": json.loads(os.environ.get("SPOT_K8S_PRICES", "{}")),
}
TRAIN = [
    sys.executable,
    "-m",
    "spot_core.workloads.softmax_regression",
    "--steps",
    "1500",
    "--step-seconds",
    "0.02",
    "--seed",
    "7",
    "--checkpoint-every-steps",
    "20",
]

with DAG(
    "spot_k8s_triggerer_restart", schedule=None, start_date=datetime(2026, 1, 1), catchup=False
):
    SpotKubernetesPodOperator(
        task_id="train",
        kubernetes_conn_id="spot_k8s_standalone",
        namespace=os.environ.get("SPOT_K8S_NAMESPACE", "default"),
        image="python:3.11",
        cmds=TRAIN,
        checkpoint_uri=f"file://{WORK}/ckpt",
        volumes=[k8s.V1Volume(name="work", host_path=k8s.V1HostPathVolumeSource(WORK))],
        volume_mounts=[k8s.V1VolumeMount(name="work", mount_path=WORK)],
        provider_options=OPTIONS,
        node_pools=NODE_POOLS,
        max_preemptions=1,
        poll_interval=0.5,
        capacity_wait=1.0,
        heartbeat_timeout=120,
        attempt_timeout=timedelta(minutes=10),
        deferrable=True,
        retries=0,
    )
