"""A deferred SpotKubernetesPodOperator hands over in the triggerer, end to end.

The operator (deferrable) launches its pod on the cheaper of two spot pools of the
Kubernetes API emulator and defers; the real trigger, recreated from its kwargs as a
triggerer does, watches the pod. The node is then reclaimed as each flavour's
documentation says: Karpenter (the ``karpenter.sh/disrupted`` taint, the machine shut
down under the pod: SIGTERM, then SIGKILL) or GKE (the impending-node-termination taint,
the node NotReady, the pod's ``DisruptionTarget`` condition and the kubelet's graceful
shutdown). On that notice the trigger's controller launches the replacement pod on the
pool the policy chooses, while the old pod writes its emergency checkpoint and the task
stays deferred; it adopts the replacement once the old pod has ended and watches it to
its end. Only then does a worker wake (``execute_complete`` of a fresh operator). What a
user sees is asserted: the pods as the cluster's API served them, the step's result, the
store's fence, the record in XCom and the Spot tab (while deferred too), and no pod left."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from airflow_spot.operators import controller_driver
from airflow_spot.operators.controller_driver import RECORD_KEY
from airflow_spot.operators.kubernetes import SpotKubernetesPodOperator
from airflow_spot.triggers.kubernetes import SpotKubernetesPodTrigger
from spot_core.checkpoint import open_store
from spot_core.checkpoint.resumed import read_resumed
from spot_core.errors import FencedOut
from spot_core.model import JobRecord, Outcome
from spot_emulators.kubernetes import ClusterConfig, KubeCluster, NodePool
from tests.support import SUPPORT
from tests.support.kube_helpers import emulator_processes
from tests.support.spot_helpers import wait_until
from tests.support.task_context import StateStore, first_event

pytestmark = pytest.mark.timeout(240)

STEP = SUPPORT / "handover_step.py"
# The emergency save takes 2 s (a big model's): the old pod outlives the notice long
# enough for the trigger to see it and create the new pod, however busy the machine.
STEPS, STEP_SECONDS, SAVE_SECONDS = 300, 0.03, 2.0
CONN_ID = "spot_k8s_handover"
MANAGED = "spot-pipelines/managed=true"
NAMESPACE = "default"
# Three pools of one instance type: the job starts on the cheapest spot pool (Karpenter),
# whose node is reclaimed and never replaced; the policy picks the next one for the
# replacement.
POOLS = (
    NodePool(
        "karp-spot", "karpenter", "spot", "us-east-1a", "m5.xlarge", replace_after_seconds=None
    ),
    NodePool("gke-spot", "gke", "spot", "us-east-1b", "m5.xlarge", replace_after_seconds=None),
    NodePool("eks-od", "eks", "on-demand", "us-east-1c", "m5.xlarge"),
)
# Per reclaiming flavour: the spot pool the job starts on (the cheaper) and the one the
# policy moves it to on the notice.
PRICES = {
    "karpenter": {"karp-spot": {"spot": 0.07}, "gke-spot": {"spot": 0.09}},
    "gke": {"karp-spot": {"spot": 0.09}, "gke-spot": {"spot": 0.07}},
}
NEXT_POOL = {"karpenter": ("gke-spot", "us-east-1b"), "gke": ("karp-spot", "us-east-1a")}


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """This test's own emulated cluster at real time (a lost machine's SIGTERM -> SIGKILL
    is 5 s, GKE's shutdown grace for regular pods 15 s: room for the emergency save) and
    the Airflow connection to it."""
    with KubeCluster(tmp_path / "cluster", ClusterConfig(pools=list(POOLS), time_scale=1.0)) as c:
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{CONN_ID.upper()}",
            json.dumps(
                {"conn_type": "kubernetes", "extra": {"kube_config_path": str(c.kubeconfig_path)}}
            ),
        )
        yield c
    assert not emulator_processes(c), "a pod's processes outlived the cluster"


class TI:
    """What KubernetesPodOperator reads of the task instance, plus XCom."""

    dag_id, task_id, run_id, map_index, try_number = "k8s_handover", "train", "manual__1", -1, 1

    def __init__(self):
        self.xcom = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


def _operator(uri: str, result: Path, flavour: str) -> SpotKubernetesPodOperator:
    folder = uri.removeprefix("file://")
    with DAG("k8s_handover", schedule=None, start_date=datetime(2026, 1, 1)):
        return SpotKubernetesPodOperator(
            task_id="train",
            kubernetes_conn_id=CONN_ID,
            namespace=NAMESPACE,
            image="python:3.11",
            cmds=[sys.executable, str(STEP)],
            arguments=[str(STEPS), str(STEP_SECONDS), str(SAVE_SECONDS), str(result)],
            checkpoint_uri=uri,
            # the store on a volume every pod mounts (hostPath here, a PVC on a cluster)
            volumes=[k8s.V1Volume(name="ckpt", host_path=k8s.V1HostPathVolumeSource(folder))],
            volume_mounts=[k8s.V1VolumeMount(name="ckpt", mount_path=folder)],
            provider_options={
                "watch_command": [sys.executable, "-m", "spot_core.cli"],
                "watch_poll_interval": 0.2,
                "node_refresh_seconds": 0.3,
                "prices": {**PRICES[flavour], "eks-od": {"on_demand": 0.192}},
            },
            deferrable=True,
            handover="on_notice",
            max_preemptions=2,
            poll_interval=0.3,
            capacity_wait=1.0,
            heartbeat_timeout=120,
        )


class PodLog:
    """Every managed pod as the API served it, polled every 0.1 s in a thread."""

    def __init__(self, api: k8s.CoreV1Api):
        self.api, self.seen = api, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                pods = self.api.list_namespaced_pod(NAMESPACE, label_selector=MANAGED).items
            except Exception:  # noqa: BLE001 - a missed poll is a gap, not a failure
                continue
            self.seen.append(
                {
                    p.metadata.labels["spot-pipelines/attempt"]: {
                        "phase": p.status.phase,
                        "node": p.spec.node_name,
                        "deleting": p.metadata.deletion_timestamp is not None,
                        "running": any(
                            s.state.running is not None for s in (p.status.container_statuses or [])
                        ),
                    }
                    for p in pods
                }
            )

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def _reclaim_once_checkpointed(
    cluster, api, uri: str, flavour: str, reclaimed: dict
) -> threading.Thread:
    """Once attempt 1 has saved a checkpoint, ``flavour`` reclaims its node."""

    def run():
        def checkpointed():
            ref = open_store(uri).latest()
            return ref is not None and ref.attempt == 1 and ref.step >= 30

        if not wait_until(checkpointed, timeout=120, interval=0.1):
            return
        pods = api.list_namespaced_pod(
            NAMESPACE, label_selector=f"{MANAGED},spot-pipelines/attempt=1"
        ).items
        if pods and pods[0].spec.node_name:
            reclaimed["node"] = pods[0].spec.node_name
            reclaimed["reclaim"] = cluster.reclaim(pods[0].spec.node_name, flavour)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _recreate(trigger) -> SpotKubernetesPodTrigger:
    """What a triggerer does with a row of the trigger table (its kwargs through JSON)."""
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))


@pytest.mark.parametrize("flavour", ["karpenter", "gke"])
def test_a_deferred_pod_operator_hands_over_to_a_new_pod_on_the_reclaim_notice(
    cluster, tmp_path, monkeypatch, flavour
):
    monkeypatch.setattr(controller_driver, "MIN_DEFER_SECONDS", 1.0)  # the event's hold
    uri, result = (tmp_path / "ckpt").as_uri(), tmp_path / "result.json"
    api = k8s.CoreV1Api(k8s_config.new_client_from_config(str(cluster.kubeconfig_path)))
    pods = PodLog(api)
    store = StateStore()
    context = {"ti": TI(), "run_id": TI.run_id, "dag": None, "task_state_store": store}
    reclaimed: dict = {}
    try:
        with pytest.raises(TaskDeferred) as deferred:  # the worker launches, then defers
            _operator(uri, result, flavour).execute(context)
        trigger = _recreate(deferred.value.trigger)
        assert trigger.launch is not None  # the trigger can launch the replacement itself
        reclaimer = _reclaim_once_checkpointed(cluster, api, uri, flavour, reclaimed)
        event, deferred_tab = asyncio.run(
            asyncio.wait_for(_run_watching_the_tab(trigger, uri, store), timeout=180)
        )
        woke_at = time.time()  # the task resumes on a worker only now, with the one event
        reclaimer.join(timeout=5)
        assert event["status"] == "ended", event
        # Airflow resumes the task on a fresh operator
        summary = _operator(uri, result, flavour).execute_complete(context, event)
        assert wait_until(
            lambda: not api.list_namespaced_pod(NAMESPACE, label_selector=MANAGED).items,
            timeout=30,
        ), "a pod was left behind"
    finally:
        pods.close()
    assert "node" in reclaimed and reclaimed["reclaim"].wait(30)

    assert summary["status"] == "succeeded", summary
    record = JobRecord.from_dict(store.data[RECORD_KEY])
    old, new = record.attempts
    assert old.outcome is Outcome.PREEMPTED and new.outcome is Outcome.SUCCEEDED
    # the replacement was launched by the trigger on the notice, before the old pod ended,
    # on the pool the policy chose (not the reclaimed one), and adopted there: both
    # attempts were closed before a worker woke
    assert old.replacement is not None and old.replacement["state"] == "adopted"
    assert old.notice_at is not None and old.notice_at <= old.replacement["launched_at"]
    # (pod timestamps have whole seconds: the strict order is the API's, below)
    assert new.started_at <= old.ended_at and new.ended_at < woke_at
    next_pool, next_zone = NEXT_POOL[flavour]
    assert new.pool.key != old.pool.key and new.pool.zone == next_zone
    # ... as the cluster's API showed it: the new pod existed while the old one still ran
    overlap = [s for s in pods.seen if "2" in s and s.get("1", {}).get("running")]
    assert overlap, "the replacement pod was not created before the old pod ended"
    assert all(s["1"]["node"] == reclaimed["node"] for s in pods.seen if "1" in s)
    new_nodes = {s["2"]["node"] for s in pods.seen if "2" in s and s["2"]["node"]}
    assert new_nodes and {
        cluster.pool_of(cluster.store.get("nodes", "", n)).name for n in new_nodes
    } == {next_pool}
    # resumed from the old attempt's emergency checkpoint, not an older one
    ckpt = open_store(uri)
    emergency = [r for r in ckpt.list() if r.attempt == old.number and "emergency" in r.metadata]
    resumed = read_resumed(ckpt, new.number)
    assert len(emergency) == 1 and resumed is not None and resumed.step == emergency[0].step
    assert new.checkpoint_step_start == emergency[0].step
    # the result equals an uninterrupted run's
    assert json.loads(result.read_text())["total"] == sum(range(STEPS))
    # a zombie of the old attempt cannot save any more
    with pytest.raises(FencedOut):
        ckpt.save(STEPS + 1, {"state.json": b"{}"}, attempt=old.number)
    # the XCom record and summary, and the Spot tab, show both attempts and the resume
    pushed = JobRecord.from_dict(context["ti"].xcom[RECORD_KEY])
    assert [a.number for a in pushed.attempts] == [1, 2]
    assert summary["attempts"] == 2 and summary["preemptions"] == 1
    assert summary["spot_cost"] < summary["on_demand_cost"]  # both pods billed, still cheaper
    (resume_seconds,) = summary["time_to_resume_seconds"]
    assert 0 <= resume_seconds < 60
    html = _spot_tab(pushed, "success")
    assert html.count('class="attempt-row"') == 2 and 'class="handover-row"' not in html
    assert f"{resume_seconds:.1f} s" in html
    # while the task was deferred, its tab showed the replacement the trigger launched
    assert deferred_tab is not None, "the replacement never reached the job's store"
    assert deferred_tab.count('class="attempt-row"') == 1
    (row,) = re.findall(r'<tr class="handover-row">(.*?)</tr>', deferred_tab)
    assert ">2<" in row and f"{next_zone} m5.xlarge" in row and "handing over" in row


async def _run_watching_the_tab(trigger, uri: str, store: StateStore) -> tuple[dict, str | None]:
    """The trigger to its event; meanwhile, once its replacement is in the job's store,
    the Spot tab as a user opening it then sees it (the task deferred)."""
    from spot_core.checkpoint.handover import read_launched

    running = asyncio.ensure_future(first_event(trigger))
    tab = None
    while not running.done():
        if tab is None and await asyncio.to_thread(read_launched, open_store(uri), 1):
            tab = _spot_tab(JobRecord.from_dict(store.data[RECORD_KEY]), "deferred")
        await asyncio.sleep(0.1)
    return running.result(), tab


def _spot_tab(record: JobRecord, state: str) -> str:
    """The Spot tab of the task instance, from the record the operator keeps."""
    from airflow_spot.ui.jobs import SpotJob, with_handover
    from airflow_spot.ui.pages import task_tab

    job = SpotJob(TI.dag_id, TI.run_id, TI.task_id, -1, record, "xcom", state, datetime.now(UTC))
    return task_tab(
        with_handover(job),
        dag_id=TI.dag_id,
        run_id=TI.run_id,
        task_id=TI.task_id,
        map_index=-1,
        now=time.time(),
    )
