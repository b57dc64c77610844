"""The kubernetes provider end to end, with the unmodified ``kubernetes`` client talking to
the project's Kubernetes API emulator: each flavour's reclaim is a preemption and the job
resumes from its checkpoint with the same final weights; an OOM kill is the step's own
failure; an unschedulable pod moves to the next pool; a bad image is one clear error; and
no pod is left behind on any exit path, a crashed controller's included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_core.adaptors import kubernetes as k8s
from spot_core.checkpoint import open_store
from spot_core.errors import ConfigError
from spot_core.model import JobStatus, Market, Outcome
from spot_core.policy.retry import RetryPolicy
from spot_core.workloads.softmax_regression import TrainConfig, prepare_dataset, train
from spot_emulators.kubernetes.cluster import KubeCluster
from spot_emulators.kubernetes.config import ClusterConfig
from spot_emulators.kubernetes.pools import NodePool
from tests.support import SUPPORT
from tests.support.builders import finished_record, job_spec, run_in_thread, store_uri
from tests.support.kube_builders import (
    cluster_of,
    job_pods,
    kube_controller,
    launch_on_first_pool,
    provider_for,
    run_argv,
    running_pod,
)
from tests.support.kube_helpers import wait_for

STEPS = 600


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    data = prepare_dataset(TrainConfig(), tmp_path_factory.mktemp("data") / "dataset.npz")
    return data, train(TrainConfig(steps=STEPS), data=data).weights_sha256


def train_command(data: Path, step_seconds: float = 0.01) -> tuple[str, ...]:
    return (
        sys.executable,
        "-m",
        "spot_core.workloads.softmax_regression",
        "--data",
        str(data),
        "--steps",
        str(STEPS),
        "--step-seconds",
        str(step_seconds),
        "--checkpoint-every-seconds",
        "0.5",
    )


# -- each flavour's reclaim -------------------------------------------------------------------
FLAVOUR_ZONES = {
    "eks": "us-east-1a",
    "karpenter": "us-east-1b",
    "gke": "us-central1-a",
    "aks": "eastus-1",
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flavour", ["karpenter", "gke", "eks", "aks"])
def test_each_flavours_reclaim_is_a_preemption_and_the_job_resumes(tmp_path, dataset, flavour):
    data, reference = dataset
    zone = FLAVOUR_ZONES[flavour]
    with cluster_of(
        tmp_path,
        NodePool(f"{flavour}-spot", flavour, "spot", zone, replace_after_seconds=None),
        NodePool(f"{flavour}-od", flavour, "on-demand", zone),
    ) as cluster:
        provider = provider_for(cluster)
        spec = job_spec(tmp_path, provider, train_command(data), job_id=f"train-{flavour}")
        controller = kube_controller(
            provider,
            RetryPolicy(max_preemptions=1, capacity_wait_seconds=0.5, min_on_demand_seconds=1e9),
            attempt_timeout_seconds=150,
        )
        thread, result = run_in_thread(controller, spec)
        store = open_store(store_uri(tmp_path))
        pod = wait_for(
            lambda: running_pod(provider, spec.job_id), 30, "the first attempt's pod to run"
        )
        wait_for(
            lambda: (store.latest() or 0) and store.latest().step >= STEPS // 4,
            60,
            "a checkpoint a quarter in",
        )
        cluster.reclaim(pod["spec"]["nodeName"])
        record = finished_record(thread, result, 150)
        assert record.status is JobStatus.SUCCEEDED
        first, last = record.attempts[0], record.attempts[-1]
        assert first.outcome is Outcome.PREEMPTED and first.pool.market is Market.SPOT
        assert record.preemptions == 1 and record.user_failures == 0
        assert last.pool.market is Market.ON_DEMAND and last.checkpoint_step_start >= STEPS // 4
        from spot_core.workloads.softmax_regression import evaluate

        assert evaluate(store, data)[0] == reference
        assert 0 < first.cost < first.on_demand_cost
        wait_for(lambda: not job_pods(provider), 30, "every pod to be gone")
        provider.close()


# -- the step's own failure -------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_oom_kill_is_the_users_failure_and_is_not_retried(tmp_path):
    with cluster_of(tmp_path, NodePool("spot", "karpenter", "spot", "us-east-1b")) as cluster:
        provider = provider_for(
            cluster,
            pod_template={
                "spec": {
                    "containers": [{"name": "step", "resources": {"limits": {"memory": "64Mi"}}}]
                }
            },
        )
        hog = (
            sys.executable,
            "-c",
            "import time; b = bytearray(400 * 2**20); "
            "b[::4096] = b'x' * len(b[::4096]); time.sleep(30)",
        )
        spec = job_spec(
            tmp_path, provider, hog, job_id="oom", checkpoint_uri=(tmp_path / "c").as_uri()
        )
        record = kube_controller(
            provider, RetryPolicy(max_user_retries=0), attempt_timeout_seconds=60
        ).run(spec)
        assert record.status is JobStatus.FAILED and len(record.attempts) == 1
        (attempt,) = record.attempts
        assert attempt.outcome is Outcome.USER_FAILED and "OOMKilled" in attempt.message
        wait_for(lambda: not job_pods(provider), 30, "the pod to be gone")


# -- capacity and configuration ---------------------------------------------------------------
@pytest.mark.timeout(120)
def test_an_unschedulable_pod_is_deleted_and_the_next_pool_tried(tmp_path):
    small = NodePool("small-spot", "karpenter", "spot", "us-east-1a", cpu="1")
    big = NodePool("big-spot", "eks", "spot", "us-east-1b", cpu="8")
    with cluster_of(tmp_path, small, big) as cluster:
        provider = provider_for(
            cluster,
            unschedulable_timeout=2,
            prices={
                "small-spot": {"spot": 0.03, "on_demand": 0.192},
                "big-spot": {"spot": 0.09, "on_demand": 0.192},
            },
            pod_template={
                "spec": {"containers": [{"name": "step", "resources": {"requests": {"cpu": "2"}}}]}
            },
        )
        spec = job_spec(
            tmp_path,
            provider,
            (sys.executable, "-c", "print('ok')"),
            job_id="fit",
            checkpoint_uri=(tmp_path / "c").as_uri(),
        )
        record = kube_controller(provider, RetryPolicy(), attempt_timeout_seconds=60).run(spec)
        assert record.status is JobStatus.SUCCEEDED
        assert record.attempts[-1].pool.zone == "us-east-1b"  # the small pool had no room
        assert not provider.market.offers(
            [p for p in provider.pools() if p.zone == "us-east-1a"], time.time()
        )[0].available
        wait_for(lambda: not job_pods(provider), 30, "every pod to be gone")


@pytest.mark.timeout(120)
def test_a_bad_image_is_one_clear_configuration_failure(tmp_path):
    with cluster_of(tmp_path, NodePool("spot", "gke", "spot", "us-central1-a")) as cluster:
        proc = subprocess.run(
            run_argv(
                cluster,
                "bad-image",
                (tmp_path / "c").as_uri(),
                tmp_path,
                *("python", "-c", "print(1)"),
                image="registry.example/doesnotexist:1",
            ),
            capture_output=True,
            text=True,
            timeout=100,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "ErrImagePull" in line or "ImagePullBackOff" in line, line
        assert "doesnotexist" in line and "Traceback" not in proc.stderr
        provider = provider_for(cluster)
        wait_for(lambda: not job_pods(provider), 30, "the pod to be gone")


def test_bad_options_fail_in_one_line_before_any_api_call():
    from spot_core.providers import check_provider

    with pytest.raises(ConfigError, match="unknown kubernetes provider option"):
        check_provider("kubernetes", {"namepsace": "ml"})
    with pytest.raises(ConfigError, match="unschedulable_timeout"):
        check_provider("kubernetes", {"unschedulable_timeout": 0})
    with pytest.raises(ConfigError, match="credential"):
        check_provider(
            "kubernetes",
            {
                "pod_template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "step",
                                "env": [{"name": "X", "value": "AKIAIOSFODNN7EXAMPLE"}],
                            }
                        ]
                    }
                }
            },
        )


# -- no pod left behind ---------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_no_pod_outlives_a_crashed_or_stopped_controller(tmp_path):
    with cluster_of(tmp_path, NodePool("spot", "eks", "spot", "us-east-1a", pods=4)) as cluster:
        provider = provider_for(cluster)

        def run(job_id: str, folder: str) -> list[str]:
            uri = (tmp_path / folder).as_uri()
            return run_argv(cluster, job_id, uri, tmp_path, "sleep", "120")

        # SIGTERM (as Ctrl-C): the run deletes its pod before it exits.
        stopped = subprocess.Popen(
            run("stopped", "s"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: running_pod(provider, "stopped"), 60, "the stopped run's pod")
        stopped.send_signal(signal.SIGTERM)
        stopped.wait(60)
        wait_for(lambda: not job_pods(provider, "stopped"), 90, "the stopped run's pod to go")

        # SIGKILL: nobody deletes the pod; cleanup_orphans does.
        killed = subprocess.Popen(
            run("killed", "k"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: running_pod(provider, "killed"), 60, "the killed run's pod")
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        assert job_pods(provider, "killed"), "a SIGKILLed controller leaves its pod"
        assert provider.cleanup_orphans(job_id="killed")
        wait_for(lambda: not job_pods(provider), 30, "every pod to be gone")
        provider.close()


class StoppedAfterCreate:
    """The client's CoreV1Api, where a Ctrl-C lands just after the API server created the
    pod, while its answer is read (where a SIGTERM in `spot-pipelines run` once left a pod)."""

    def __init__(self, api) -> None:
        self._api = api

    def __getattr__(self, name):
        return getattr(self._api, name)

    def create_namespaced_pod(self, *args, **kwargs):
        self._api.create_namespaced_pod(*args, **kwargs)
        raise KeyboardInterrupt


def test_a_stop_landing_in_the_create_call_deletes_the_pod(tmp_path):
    with cluster_of(tmp_path, NodePool("spot", "eks", "spot", "us-east-1a", pods=4)) as cluster:
        provider = provider_for(cluster)
        provider.api = StoppedAfterCreate(provider.api)
        with pytest.raises(KeyboardInterrupt):
            launch_on_first_pool(provider, "cut", (tmp_path / "c").as_uri(), ("sleep", "30"))
        wait_for(lambda: not job_pods(provider, "cut"), 30, "the interrupted launch's pod to go")
        provider.close()


def test_run_refuses_a_store_the_pods_cannot_reach(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "run",
            "--provider",
            "kubernetes",
            "--checkpoint-uri",
            (tmp_path / "c").as_uri(),
            "--",
            "python",
            "-c",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "needs --checkpoint-uri 's3://" in line and "volumeMount" in line


class CountingApi:
    """The client's CoreV1Api, counting the calls made through it by name."""

    def __init__(self, api) -> None:
        self._api, self.calls = api, {}

    def __getattr__(self, name):
        target = getattr(self._api, name)
        if not callable(target):
            return target

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return target(*args, **kwargs)

        return counted


@pytest.mark.timeout(120)
def test_observe_answers_many_leases_with_one_pod_list_and_one_node_list(tmp_path):
    from spot_core.providers.base import LeaseState

    with cluster_of(
        tmp_path, NodePool("spot", "karpenter", "spot", "us-east-1b", pods=8)
    ) as cluster:
        provider = provider_for(cluster)
        store = open_store((tmp_path / "c").as_uri())
        store.fence(1)
        leases = [
            launch_on_first_pool(provider, f"job-{i}", store.uri, ("sleep", "30")) for i in range(5)
        ]
        provider.api = counting = CountingApi(provider.api)
        statuses = provider.observe(leases)
        assert [s.state for s in statuses.values()] == [LeaseState.RUNNING] * 5
        assert counting.calls == {"list_namespaced_pod": 1, "list_node": 1}
        provider.close()
        wait_for(lambda: not job_pods(provider), 30, "close() to delete every pod")


# -- voluntary disruption and notices ---------------------------------------------------------
@pytest.mark.timeout(120)
def test_step_pods_carry_the_do_not_disrupt_annotations_unless_turned_off(tmp_path):
    """What the API receives: Karpenter's and cluster-autoscaler's annotations that keep a
    node under a running step from being consolidated or scaled down; off on request."""
    with cluster_of(tmp_path, NodePool("spot", "karpenter", "spot", "us-east-1b")) as cluster:
        for option, expected in (
            (
                True,
                {
                    "karpenter.sh/do-not-disrupt": "true",
                    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                },
            ),
            (False, {}),
        ):
            provider = provider_for(cluster, do_not_disrupt=option)
            lease = launch_on_first_pool(
                provider, f"annotated-{option}", (tmp_path / str(option)).as_uri(), ("sleep", "30")
            )
            received = provider.api.read_namespaced_pod(lease.lease_id, "default")
            annotations = received.metadata.annotations or {}
            assert {k: annotations[k] for k in expected} == expected
            if not option:
                assert "karpenter.sh/do-not-disrupt" not in annotations
                assert "cluster-autoscaler.kubernetes.io/safe-to-evict" not in annotations
            provider.close()
        with pytest.raises(ConfigError, match="do_not_disrupt"):
            provider_for(cluster, do_not_disrupt="no")


SECOND_ATTEMPT_FINISHES = (
    "import os, time\nif os.environ['SPOT_ATTEMPT'] == '1':\n    time.sleep(600)\n"
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("node_fate", ["not-ready", "gone"])
def test_a_pod_on_a_lost_node_ends_within_its_grace_and_a_margin(tmp_path, node_fate):
    """The kubelet goes with its machine: the pod stays Running in the API (its node
    NotReady, or its Node object deleted with no pod GC to follow). The attempt ends at the
    notice plus the pod's grace period plus the margin, not at attempt_timeout; a pod whose
    node is gone is deleted with grace 0; the replacement runs on another pool."""
    from spot_emulators.kubernetes import Timings
    from spot_emulators.kubernetes import reclaim as reclaims

    config = ClusterConfig(
        pools=[
            NodePool("first", "eks", "spot", "us-east-1a"),
            NodePool("second", "karpenter", "spot", "us-east-1b"),
        ],
        time_scale=0.1,
        timings=Timings(pod_gc_seconds=36000),
    )
    with KubeCluster(tmp_path / "cluster", config) as cluster:
        provider = provider_for(
            cluster,
            notice_margin_seconds=1.0,
            pod_template={"spec": {"terminationGracePeriodSeconds": 2}},
        )
        spec = job_spec(
            tmp_path,
            provider,
            (sys.executable, "-c", SECOND_ATTEMPT_FINISHES),
            job_id=f"lost-{node_fate}",
            checkpoint_uri=(tmp_path / "c").as_uri(),
        )
        controller = kube_controller(
            provider, RetryPolicy(capacity_wait_seconds=0.5), attempt_timeout_seconds=3600
        )
        thread, result = run_in_thread(controller, spec)
        pod = wait_for(
            lambda: running_pod(provider, spec.job_id), 30, "the first attempt's pod to run"
        )
        node = pod["spec"]["nodeName"]
        lost_at = time.time()
        reclaims._mark_node_not_ready(
            cluster, node, "Kubelet stopped posting node status.", "Unknown", "NodeStatusUnknown"
        )
        for worker in [w for w in list(cluster.workers.values()) if w.node == node]:
            worker.machine_lost(0.0)
        if node_fate == "gone":
            provider.api.delete_node(node)
        record = finished_record(thread, result, 120)
        first, last = record.attempts[0], record.attempts[-1]
        assert record.status is JobStatus.SUCCEEDED and len(record.attempts) == 2
        assert first.outcome is Outcome.PREEMPTED and last.pool != first.pool
        # bounded: the notice (seen within a poll) + 2 s grace + 1 s margin, plus polls
        assert first.ended_at - lost_at < 15, first
        assert "still not ended past its notice" in first.message
        if node_fate == "gone":  # deleted with grace 0: no kubelet was left to confirm it
            with pytest.raises(k8s.NotFound):
                k8s.raw(
                    "get pod", provider.api.read_namespaced_pod, pod["metadata"]["name"], "default"
                )
        provider.close()


@pytest.mark.timeout(180)
def test_handover_starts_the_replacement_pod_on_the_notice_and_resumes_its_emergency_save(
    tmp_path,
):
    """handover=on_notice (the provider's default): Karpenter's reclaim taints the node;
    the replacement pod is created on that notice while the old pod saves, resumes from
    the old pod's emergency checkpoint, and the old attempt can no longer save."""
    from spot_core.checkpoint.resumed import read_resumed
    from spot_core.errors import FencedOut

    step = SUPPORT / "handover_step.py"
    result = tmp_path / "result.json"
    with cluster_of(
        tmp_path,
        NodePool("karpenter-spot", "karpenter", "spot", "us-east-1b", replace_after_seconds=None),
        NodePool("karpenter-od", "karpenter", "on-demand", "us-east-1b"),
        time_scale=0.5,  # the lost machine's TERM -> KILL: 2.5 s, room for the emergency save
    ) as cluster:
        provider = provider_for(cluster)
        spec = job_spec(
            tmp_path,
            provider,
            (sys.executable, str(step), "400", "0.02", "0.5", str(result)),
            job_id="train-handover",
        )
        controller = kube_controller(
            provider,
            RetryPolicy(max_preemptions=1, capacity_wait_seconds=0.5, min_on_demand_seconds=1e9),
            attempt_timeout_seconds=150,
        )
        thread, outcome = run_in_thread(controller, spec)
        store = open_store(store_uri(tmp_path))
        pod = wait_for(
            lambda: running_pod(provider, spec.job_id), 30, "the first attempt's pod to run"
        )
        wait_for(lambda: any(r.attempt == 1 for r in store.list()), 60, "a first checkpoint")
        cluster.reclaim(pod["spec"]["nodeName"])
        record = finished_record(thread, outcome, 150)
        assert record.status is JobStatus.SUCCEEDED, [a.message for a in record.attempts]
        old, new = record.attempts[0], record.attempts[1]
        assert old.outcome is Outcome.PREEMPTED and new.started_at < old.ended_at
        assert old.replacement is not None and old.replacement["state"] == "adopted"
        emergency = [r for r in store.list() if r.attempt == 1 and "emergency" in r.metadata]
        assert len(emergency) == 1
        resumed = read_resumed(store, new.number)
        assert resumed is not None and resumed.step == emergency[0].step
        assert json.loads(result.read_text())["total"] == sum(range(400))
        with pytest.raises(FencedOut):
            store.save(10**6, {"state.json": b"{}"}, attempt=old.number)
        wait_for(lambda: not job_pods(provider), 30, "every pod to be gone")
        provider.close()
