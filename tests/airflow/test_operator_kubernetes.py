"""SpotKubernetesPodOperator against the Kubernetes API emulator (``SpotJobOperator(provider=
"kubernetes")`` is in test_spot_job_kubernetes.py): a real HTTP API server the unmodified
``kubernetes`` client talks to, a kubelet per node running each pod's command as local
processes, and each flavour's reclaim sequence.

The cluster is reached only through an Airflow connection (``AIRFLOW_CONN_SPOT_K8S``,
its kubeconfig path in ``extra__kubernetes__kube_config_path``), resolved by
cncf-kubernetes' KubernetesHook in the "worker" (this process) and in the trigger. The
deferrable test drives the operator as Airflow does: ``execute`` defers, the real
trigger (recreated from its serialized kwargs, as a triggerer does) watches the pod, is
cancelled halfway as by a triggerer restart, a fresh copy resumes from the kwargs, and
``execute_complete`` of a fresh operator gets its event.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import threading
from datetime import datetime

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred
from kubernetes import client as k8s

from airflow_spot.operators.controller_driver import RECORD_KEY, SpotUserStepFailed
from airflow_spot.operators.kubernetes import SpotKubernetesPodOperator
from airflow_spot.triggers.kubernetes import SpotKubernetesPodTrigger
from spot_core.checkpoint import open_store
from spot_core.model import JobRecord, Outcome
from spot_core.workloads.softmax_regression import STATE_FILE, TrainConfig, train, weights_sha256
from tests.support.kube_helpers import add_test_pool
from tests.support.spot_helpers import train_command, wait_until
from tests.support.task_context import StateStore, first_event

pytestmark = pytest.mark.timeout(300)

CONN_ID = "spot_k8s"
MANAGED = "spot-pipelines/managed=true"
# The kubelet runs the pod's command on this machine: the watcher from this environment.
WATCH = [sys.executable, "-m", "spot_core.cli"]
OPTIONS = {
    "watch_command": WATCH,
    "unschedulable_timeout": 20,
    "watch_poll_interval": 0.2,
    "node_refresh_seconds": 0.5,
    "capacity_cooldown_seconds": 5,
}
STEPS, EVERY = 400, 20
# An instance type per test (the emulator's default pools are m5.xlarge): a pool is
# (zone, instance type, market), so no test's pods land on another test's nodes, and every
# pool has a list price for a job that sees them all (SpotJobOperator has no node_pools).
_types = iter(
    [
        "g5.xlarge",
        "g5.2xlarge",
        "g6.xlarge",
        "g6.2xlarge",
        "m5.large",
        "m5.2xlarge",
        "m6i.large",
        "m6i.xlarge",
        "c5.large",
        "c5.xlarge",
        "c6i.xlarge",
        "t3.large",
    ]
)


@pytest.fixture
def pools(kube_cluster):
    """This test's own node pools (a Karpenter and a GKE spot pool, an EKS on-demand
    node group), of an instance type no other test uses, and their prices."""
    instance_type = next(_types)
    made = {}
    for flavour, capacity, zone in (
        ("karpenter", "spot", "us-east-1a"),
        ("gke", "spot", "us-east-1b"),
        ("eks", "on-demand", "us-east-1c"),
    ):
        name, _ = add_test_pool(
            kube_cluster,
            flavour,
            capacity_type=capacity,
            zone=zone,
            instance_type=instance_type,
            pods=4,
        )
        made[flavour] = name
    prices = {
        made["karpenter"]: {"spot": 0.3},
        made["gke"]: {"spot": 0.25},
        made["eks"]: {"on_demand": 1.0},
    }
    return made, {**OPTIONS, "prices": prices}


@pytest.fixture
def conn(kube_cluster, monkeypatch):
    """The Airflow connection the operator and the trigger resolve (as a deployment would)."""
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}",
        json.dumps(
            {
                "conn_type": "kubernetes",
                "extra": {"extra__kubernetes__kube_config_path": str(kube_cluster.kubeconfig_path)},
            }
        ),
    )
    return CONN_ID


@pytest.fixture
def core(kube_client, kube_namespace, conn):
    """The test's namespace through the official client; asserts no spot pod is left."""
    api = k8s.CoreV1Api(kube_client)
    api.namespace = kube_namespace
    yield api
    assert wait_until(lambda: not _pods(api), timeout=60), (
        f"pods left behind: {[p.metadata.name for p in _pods(api)]}"
    )


def _pods(api, selector: str = MANAGED) -> list:
    return api.list_namespaced_pod(api.namespace, label_selector=selector).items


class TI:
    """What KubernetesPodOperator reads of the task instance, plus XCom."""

    dag_id, task_id, run_id, map_index, try_number = "k8s_dag", "train", "manual__1", -1, 1

    def __init__(self, task_id: str):
        self.task_id = task_id
        self.xcom = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


def _context(task_id: str, store: StateStore | None = None) -> dict:
    ti = TI(task_id)
    return {"ti": ti, "run_id": ti.run_id, "dag": None, "task_state_store": store or StateStore()}


def _operator(
    task_id: str, *, conn: str, cmds, pools, api, checkpoint_uri: str, **kwargs
) -> SpotKubernetesPodOperator:
    """The operator with its checkpoint folder mounted into every pod (hostPath here, a
    PVC on a real cluster): a store the pods cannot see is refused."""
    names, options = pools
    folder = checkpoint_uri.removeprefix("file://")
    with DAG(f"k8s_{task_id}", schedule=None, start_date=datetime(2026, 1, 1)):
        return SpotKubernetesPodOperator(
            task_id=task_id,
            kubernetes_conn_id=conn,
            namespace=api.namespace,
            image="python:3.11",
            cmds=list(cmds),
            provider_options=options,
            checkpoint_uri=checkpoint_uri,
            node_pools=list(names.values()),
            volumes=[k8s.V1Volume(name="ckpt", host_path=k8s.V1HostPathVolumeSource(folder))],
            volume_mounts=[k8s.V1VolumeMount(name="ckpt", mount_path=folder)],
            poll_interval=0.3,
            capacity_wait=1.0,
            heartbeat_timeout=120,
            **kwargs,
        )


def _final_weights(uri: str) -> str:
    from spot_core.checkpoint.state import arrays_from_bytes

    store = open_store(uri)
    return weights_sha256(arrays_from_bytes(store.load(store.latest())[STATE_FILE]))


UNINTERRUPTED = None


def _uninterrupted() -> str:
    global UNINTERRUPTED
    if UNINTERRUPTED is None:
        UNINTERRUPTED = train(TrainConfig(steps=STEPS, seed=7)).weights_sha256
    return UNINTERRUPTED


def _reclaim_when_checkpointed(
    cluster,
    api,
    uri: str,
    attempt: int,
    flavour: str,
    seen: dict,
    after: threading.Event | None = None,
) -> threading.Thread:
    """Once attempt ``attempt`` has saved a checkpoint (and ``after`` is set), reclaim its
    node the way ``flavour`` does; keep the pod as it ran (for the assertions)."""

    def run():
        def checkpointed():
            ref = open_store(uri).latest()
            return ref is not None and ref.attempt == attempt and ref.step >= 2 * EVERY

        if not wait_until(checkpointed, timeout=120, interval=0.1):
            return
        if after is not None and not after.wait(timeout=120):
            return
        pods = _pods(api, f"{MANAGED},spot-pipelines/attempt={attempt}")
        if pods and pods[0].spec.node_name:
            seen[attempt] = pods[0]
            cluster.reclaim(pods[0].spec.node_name, flavour)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_reclaimed_pod_resumes_on_a_new_pod_in_one_airflow_try(
    kube_cluster, core, conn, pools, tmp_path, capfd
):
    cluster = kube_cluster
    uri = (tmp_path / "ckpt").as_uri()
    op = _operator(
        "train_sync",
        conn=conn,
        pools=pools,
        api=core,
        cmds=train_command(STEPS, 0.02, 7, EVERY),
        checkpoint_uri=uri,
        env_vars={"MODEL": "softmax"},
        labels={"team": "ml"},
        max_preemptions=2,
        deferrable=False,
    )
    context, seen = _context("train_sync"), {}
    reclaimer = _reclaim_when_checkpointed(cluster, core, uri, 1, "karpenter", seen)
    summary = op.execute(context)  # one Airflow try: no exception
    reclaimer.join(timeout=5)

    record = JobRecord.from_dict(context["task_state_store"].data[RECORD_KEY])
    assert summary["status"] == "succeeded" and summary["preemptions"] == 1, summary
    assert [a.outcome for a in record.attempts] == [Outcome.PREEMPTED, Outcome.SUCCEEDED]
    assert record.attempts[1].checkpoint_step_start >= 2 * EVERY, "resumed from its checkpoint"
    assert record.attempts[0].lease_id != record.attempts[1].lease_id  # a new pod
    assert _final_weights(uri) == _uninterrupted()
    assert context["ti"].xcom[RECORD_KEY]["status"] == "succeeded"
    # The user's KubernetesPodOperator parameters reached the pod, under the spot ones.
    pod = seen[1]
    step = pod.spec.containers[0]
    env = {e.name: e.value for e in step.env}
    assert env["MODEL"] == "softmax" and env["SPOT_CHECKPOINT_URI"] == uri
    assert env["SPOT_ATTEMPT"] == "1"
    assert pod.metadata.labels["team"] == "ml" and pod.metadata.labels["task_id"] == "train_sync"
    assert pod.metadata.labels["spot-pipelines/managed"] == "true"
    assert step.command[: len(WATCH) + 1] == [*WATCH, "watch"]
    assert context["ti"].xcom["spot_kubernetes_pod_link"].startswith(cluster.url)
    # KPO's get_logs: the step's own output (its final report line) is in the task log.
    assert '"steps_done": 400' in capfd.readouterr().out


def _recreate(trigger):
    """What a triggerer does with a row of the trigger table."""
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))


async def _restart_then_run(trigger, api, after: float, restarted: threading.Event) -> dict:
    """Run ``trigger`` for ``after`` seconds, stop it as a triggerer restart does (cancel,
    then ``cleanup``), check its pod still runs, and run a fresh copy to its event."""
    task = asyncio.ensure_future(first_event(trigger))
    done, _ = await asyncio.wait({task}, timeout=after)
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await trigger.cleanup()  # still deferred (no task instance): the lease must live on
    running = await asyncio.to_thread(_pods, api)
    assert running and all(p.metadata.deletion_timestamp is None for p in running), (
        "a triggerer restart must not stop the attempt"
    )
    restarted.set()
    return await asyncio.wait_for(first_event(_recreate(trigger)), timeout=240)


def test_the_deferrable_operator_survives_a_triggerer_restart_and_a_reclaim(
    kube_cluster, core, conn, pools, tmp_path
):
    cluster = kube_cluster
    uri = (tmp_path / "ckpt").as_uri()

    def make():
        return _operator(
            "train_defer",
            conn=conn,
            pools=pools,
            api=core,
            cmds=train_command(STEPS, 0.03, 7, EVERY),
            checkpoint_uri=uri,
            max_preemptions=1,
            deferrable=True,
        )

    context, seen = _context("train_defer"), {}
    restarted = threading.Event()  # the reclaim comes after the triggerer's restart
    reclaimer = _reclaim_when_checkpointed(cluster, core, uri, 1, "gke", seen, restarted)
    try:
        make().execute(context)
        raise AssertionError("a deferrable operator defers while its pod runs")
    except TaskDeferred as deferred:
        pending = deferred
    triggers, summary = [], None
    for round_ in range(10):
        trigger = _recreate(pending.trigger)
        assert isinstance(trigger, SpotKubernetesPodTrigger)
        assert "kubeconfig" not in trigger.provider_options  # the conn id, never its contents
        triggers.append(trigger)
        event = asyncio.run(
            _restart_then_run(trigger, core, 1.0, restarted)
            if round_ == 0
            else asyncio.wait_for(first_event(trigger), timeout=240)
        )
        try:
            summary = getattr(make(), pending.method_name)(context, event)
            break
        except TaskDeferred as deferred:
            pending = deferred
    reclaimer.join(timeout=5)
    record = JobRecord.from_dict(context["task_state_store"].data[RECORD_KEY])
    assert summary is not None and summary["status"] == "succeeded", record.summary()
    assert [a.outcome for a in record.attempts] == [Outcome.PREEMPTED, Outcome.SUCCEEDED]
    assert str(record.attempts[1].pool.market) == "on-demand"  # max_preemptions=1: fallback
    assert record.attempts[1].checkpoint_step_start >= 2 * EVERY
    assert _final_weights(uri) == _uninterrupted()
    assert record.attempts[0].cost > 0 and record.ledger.spent < record.ledger.on_demand_equivalent


def test_an_oom_kill_is_the_steps_failure_and_spends_an_airflow_retry(core, conn, pools, tmp_path):
    hog = "b = bytearray(400 * 1024 * 1024); import time; time.sleep(30)"
    op = _operator(
        "oom",
        conn=conn,
        pools=pools,
        api=core,
        cmds=[sys.executable, "-c", hog],
        checkpoint_uri=(tmp_path / "ckpt").as_uri(),
        deferrable=False,
        container_resources=k8s.V1ResourceRequirements(limits={"memory": "64Mi"}),
    )
    context = _context("oom")
    with pytest.raises(SpotUserStepFailed, match="OOMKilled"):
        op.execute(context)
    record = JobRecord.from_dict(context["task_state_store"].data[RECORD_KEY])
    assert [a.outcome for a in record.attempts] == [Outcome.USER_FAILED]  # no relaunch
    assert record.preemptions == 0


def test_on_kill_deletes_the_running_pod(core, conn, pools, tmp_path):
    op = _operator(
        "killed",
        conn=conn,
        pools=pools,
        api=core,
        cmds=[sys.executable, "-c", "import time; time.sleep(120)"],
        checkpoint_uri=(tmp_path / "ckpt").as_uri(),
        deferrable=False,
    )
    errors: list[BaseException] = []

    def work():
        try:
            op.execute(_context("killed"))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    assert wait_until(lambda: op._lease is not None, timeout=60)
    assert _pods(core)
    op.on_kill()
    worker.join(timeout=60)
    assert not worker.is_alive() and errors and "killed" in str(errors[0])
    assert wait_until(lambda: not _pods(core), timeout=60), "on_kill left the pod"


def test_a_store_outside_the_pods_volumes_fails_before_any_pod(core, conn, pools, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    op = _operator(
        "unmounted",
        conn=conn,
        pools=pools,
        api=core,
        cmds=["true"],
        checkpoint_uri=(tmp_path / "mounted").as_uri(),
    )
    op.checkpoint_uri = (tmp_path / "elsewhere").as_uri()  # as a template could render it
    context = _context("unmounted")
    with pytest.raises(AirflowFailException, match="which the pods cannot see"):
        op.execute(context)
    assert not _pods(core) and "spot_job_record" not in context["task_state_store"].data
