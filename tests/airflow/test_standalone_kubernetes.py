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

import pytest
from kube_helpers import add_test_pool
from kubernetes import client as k8s
from process_helpers import free_port
from spot_helpers import wait_until
from standalone_server import BIN, running_standalone, standalone_env

from spot_core.checkpoint import open_store

pytestmark = pytest.mark.timeout(900)
DAG_ID = "spot_k8s_triggerer_restart"
MANAGED = "spot-pipelines/managed=true"


@pytest.fixture(scope="module")
def k8s_standalone(tmp_path_factory, airflow_home, kube_cluster, postgres_url):
    """Its own `airflow standalone`, on PostgreSQL as in production (on SQLite a loaded
    machine once timed the execution API out before the task even started)."""
    from postgres_helpers import fresh_database, with_driver

    dags = os.environ["AIRFLOW__CORE__DAGS_FOLDER"]  # the session's, set by conftest.py
    made = {}
    for flavour, capacity, zone in (
        ("karpenter", "spot", "us-east-1a"),
        ("eks", "on-demand", "us-east-1c"),
    ):
        made[flavour], _ = add_test_pool(
            kube_cluster,
            flavour,
            capacity_type=capacity,
            zone=zone,
            instance_type="c6i.2xlarge",
            pods=4,
        )
    namespace = f"sa-{time.time_ns() % 10**8}"
    kube_cluster.api.create("namespaces", "", {"metadata": {"name": namespace}})
    home = tmp_path_factory.mktemp("k8s-standalone-home")
    work = tmp_path_factory.mktemp("k8s-standalone-work")
    port = free_port()
    env = standalone_env(home, port, dags)
    env.update(
        {
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW_CONN_SPOT_K8S_STANDALONE": json.dumps(
                {
                    "conn_type": "kubernetes",
                    "extra": {"kube_config_path": str(kube_cluster.kubeconfig_path)},
                }
            ),
            "SPOT_K8S_WORK": str(work),
            "SPOT_K8S_NAMESPACE": namespace,
            "SPOT_K8S_NODE_POOLS": ",".join(made.values()),
            "SPOT_K8S_PRICES": json.dumps(
                {made["karpenter"]: {"spot": 0.2}, made["eks"]: {"on_demand": 0.34}}
            ),
        }
    )
    # `airflow standalone` migrates its own (fresh) database on start.
    with fresh_database(postgres_url, "spot_airflow_k8s_standalone") as database:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = with_driver(database, "postgresql+psycopg2")
        try:
            with running_standalone(home, env, port) as airflow:
                yield airflow, work, namespace
        finally:
            kube_cluster.delete_namespace(namespace)


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
