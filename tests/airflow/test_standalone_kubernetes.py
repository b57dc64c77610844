"""SpotKubernetesPodOperator under ``airflow standalone`` with a real triggerer that is
killed (SIGKILL) while it watches the pod and replaced; then the pod's node is reclaimed
the Karpenter way. The task succeeds in its first try, resumed from its checkpoint, and
no pod is left. The cluster is the Kubernetes emulator (in this process); Airflow reaches
it only through the connection ``spot_k8s_standalone`` (a kubeconfig path), resolved by
the worker and by the triggerer in their own processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client as k8s

from spot_core.checkpoint import open_store
from tests.support.spot_helpers import wait_until
from tests.support.standalone_server import BIN

pytestmark = pytest.mark.timeout(900)
DAG_ID = "spot_k8s_triggerer_restart"
MANAGED = "spot-pipelines/managed=true"


@pytest.fixture(scope="module")
def k8s_standalone(standalone):
    """The session's `airflow standalone` (standalone_server.py), on PostgreSQL as in
    production (on SQLite a loaded machine once timed the execution API out before the
    task even started), with the emulator as its connection: (it, work folder, namespace)."""
    return standalone, Path(standalone.env["SPOT_K8S_WORK"]), standalone.env["SPOT_K8S_NAMESPACE"]


def test_a_killed_triggerer_and_a_reclaim_cost_no_try_and_leave_no_pod(
    k8s_standalone, kube_cluster, kube_client
):
    airflow, work, namespace = k8s_standalone
    api = k8s.CoreV1Api(kube_client)
    pods = lambda: api.list_namespaced_pod(namespace, label_selector=MANAGED).items  # noqa: E731
    store = open_store((work / "ckpt").as_uri())
    run_id = airflow.trigger(DAG_ID)

    def deferred_and_training():
        ref = store.latest()
        state = airflow.state(DAG_ID)["tis"].get("train:-1", [None])[0]
        return state == "deferred" and ref is not None and ref.step >= 100

    assert wait_until(deferred_and_training, timeout=300, interval=1), airflow.state(DAG_ID)

    pids = airflow.triggerer_pids()
    assert pids, "no triggerer process found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)  # our own standalone's triggerer, by pid
    time.sleep(3)
    running = pods()
    assert len(running) == 1 and running[0].metadata.deletion_timestamp is None, (
        "a killed triggerer must not stop the attempt"
    )
    airflow.extra.append(
        subprocess.Popen(
            [str(BIN / "airflow"), "triggerer"],
            env=airflow.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    )
    step_before = store.latest().step
    kube_cluster.reclaim(running[0].spec.node_name, "karpenter")

    state = airflow.wait_run(DAG_ID, run_id, timeout=400)
    assert state["runs"][run_id] == "success", state
    assert state["tis"]["train:-1"] == ["success", 1], "the restart or the reclaim cost a try"
    record = state["xcom"]["train:-1:spot_job_record"]
    record = json.loads(record) if isinstance(record, str) else record
    outcomes = [a["outcome"] for a in record["attempts"]]
    assert outcomes == ["preempted", "succeeded"], outcomes
    assert record["attempts"][1]["checkpoint_step_start"] >= step_before
    assert record["attempts"][1]["pool"]["market"] == "on-demand"
    assert wait_until(lambda: not pods(), timeout=60), "a pod was left behind"
