"""The spot worker with provider="kubernetes": the flow run itself runs as a pod on a spot
node pool of the Kubernetes API emulator; its node is reclaimed (Karpenter: taint and
evict) after the first checkpoint; the worker reschedules the run instead of leaving it
Crashed, and the next attempt resumes from the checkpoint on the on-demand node group."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from pydantic import ValidationError

from prefect_spot.workers import SpotJobConfiguration, SpotJobVariables
from tests.support.kube_helpers import add_test_pool, kube_cluster, kube_namespace, wait_for  # noqa: F401

pytestmark = pytest.mark.timeout(300)


def test_kubernetes_job_variables_need_a_store_every_pod_reaches(tmp_path):
    for model in (SpotJobVariables, SpotJobConfiguration):
        with pytest.raises(ValidationError, match="its pods cannot see this machine's disk"):
            model(provider="kubernetes", checkpoint_root=tmp_path.as_uri())
        with pytest.raises(ValidationError, match="unknown kubernetes provider option"):
            model(
                provider="kubernetes",
                provider_options={"nmespace": "ml"},
                checkpoint_root="s3://bucket/flows",
            )
    mounted = SpotJobConfiguration(
        provider="kubernetes",
        checkpoint_root=(tmp_path / "flows").as_uri(),
        provider_options={"pod_template": _shared_volume(tmp_path)},
    )
    assert mounted.spot_configuration().provider == "kubernetes"


def _shared_volume(path) -> dict:
    """The checkpoint folder on a volume every step pod mounts at the same path."""
    return {
        "spec": {
            "volumes": [{"name": "ckpt", "hostPath": {"path": str(path)}}],
            "containers": [
                {"name": "step", "volumeMounts": [{"name": "ckpt", "mountPath": str(path)}]}
            ],
        }
    }


def _reclaim_after_checkpoint(cluster, store_uri: str, timeout: float):
    """Once the flow run's first attempt committed a checkpoint, reclaim the spot node its
    pod runs on, the Karpenter way."""
    from spot_core.checkpoint import open_store

    store = open_store(store_uri)
    reclaimed: list[str] = []

    def victim():
        pods = cluster.store.list("pods", None)[0]
        return next(
            (
                p["spec"].get("nodeName")
                for p in pods
                if (p["metadata"].get("labels") or {}).get("spot-pipelines/attempt") == "1"
                and p["status"].get("phase") == "Running"
            ),
            None,
        )

    def run():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not reclaimed:
            try:
                saved = any(r.attempt == 1 for r in store.list())
            except Exception:  # noqa: BLE001 - the store appears with the first attempt
                saved = False
            node = victim() if saved else None
            if node:
                cluster.reclaim(node, "karpenter")
                reclaimed.append(node)
            time.sleep(0.1)

    thread = threading.Thread(target=run, daemon=True, name="reclaimer")
    thread.start()
    return thread, reclaimed


def test_worker_reschedules_a_flow_run_preempted_on_kubernetes_and_it_completes(
    prefect_api, tmp_path
):
    from prefect import get_client
    from prefect.deployments import run_deployment

    from spot_core.model import Market, Outcome
    from spot_emulators.kubernetes import ClusterConfig, KubeCluster, NodePool
    from tests.support.prefect_helpers import (
        deploy_example_flow,
        final_record,
        running_worker,
        wait_completed,
    )

    root = tmp_path / "flows"
    pools = [
        NodePool("karpenter-spot", "karpenter", "spot", "us-east-1b", replace_after_seconds=None),
        NodePool("eks-on-demand", "eks", "on-demand", "us-east-1c"),
    ]
    with KubeCluster(tmp_path / "cluster", ClusterConfig(pools=pools, time_scale=0.1)) as cluster:
        deployment_id = deploy_example_flow(
            "spot-k8s-e2e",
            "k8s-e2e",
            {
                "provider": "kubernetes",
                "max_preemptions": 1,
                # the reschedule path (the default hands over: test_worker_handover.py)
                "handover": "off",
                "capacity_wait": 0.5,
                "checkpoint_root": root.as_uri(),
                # the flow run's engine in the pod: this environment's Python (the image's)
                "command": f"{sys.executable} -m prefect_spot._engine",
                "provider_options": {
                    "kubeconfig": str(cluster.kubeconfig_path),
                    "image": "flows:1",
                    "watch_command": [sys.executable, "-m", "spot_core.cli"],
                    "watch_poll_interval": 0.2,
                    "pod_template": _shared_volume(root),
                    "prices": {"m5.xlarge": {"spot": 0.07, "on_demand": 0.192}},
                },
            },
        )
        with running_worker("spot-k8s-e2e", tmp_path / "worker.log"):
            run = run_deployment(
                deployment_id,
                timeout=0,
                parameters={"workdir": str(tmp_path / "work"), "steps": 600, "step_seconds": 0.01},
            )
            thread, reclaimed = _reclaim_after_checkpoint(
                cluster, f"{root.as_uri()}/{run.id}", timeout=150
            )
            with get_client(sync_client=True) as client:
                run = wait_completed(client, run.id, timeout=240)
                states = client.read_flow_run_states(run.id)
            record = final_record(run.id)
            thread.join(5)
            left = [
                p["metadata"]["name"]
                for p in cluster.store.list("pods", None)[0]
                if (p["metadata"].get("labels") or {}).get("spot-pipelines/managed")
            ]
    logs = (tmp_path / "worker.log").read_text(errors="replace")
    assert reclaimed, f"the first attempt never checkpointed\n{logs[-3000:]}"
    assert run.state.is_completed(), f"{run.state!r}\n{logs[-3000:]}"
    names = [s.name for s in states]
    # the reclaimed pod's run is handed back, never shown Failed or Crashed on the way
    assert "AwaitingRetry" in names and not {"Failed", "Crashed"} & set(names), names
    assert record.preemptions == 1 and record.attempts[0].outcome is Outcome.PREEMPTED
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED
    assert record.attempts[-1].pool.market is Market.ON_DEMAND
    assert record.attempts[-1].checkpoint_step_start > 0
    assert not left, f"pods left behind: {left}"


def test_cancelling_a_flow_run_deletes_its_pod_when_the_pools_span_two_regions(
    prefect_api, kube_cluster, kube_namespace, tmp_path
):
    """Prefect hands ``kill_infrastructure`` the infrastructure id alone; the worker tries
    it in every region its pools cover (an EC2 id does not say its region). A cluster is
    one place whatever its nodes' regions: every try must find the pod, and it is deleted."""
    import anyio

    from prefect_spot.workers import SpotWorker
    from spot_core.model import Market
    from spot_core.providers import open_provider
    from spot_core.providers.base import LaunchSpec

    zones = ["eu-west-1a", "ap-south-1b"]  # this test's own pools, in two regions
    for zone in zones:
        add_test_pool(kube_cluster, "karpenter", capacity_type="spot", zone=zone, pods=2)
    options = {
        "kubeconfig": str(kube_cluster.kubeconfig_path),
        "namespace": kube_namespace,
        "image": "flows:1",
        "pod_template": _shared_volume(tmp_path),
    }
    configuration = SpotJobConfiguration(
        provider="kubernetes",
        zones=zones,
        checkpoint_root=(tmp_path / "flows").as_uri(),
        provider_options=options,
    )
    launcher = open_provider("kubernetes", **options)  # the run's worker, not this one
    assert {p.region for p in launcher.pools()} >= {"eu-west-1", "ap-south-1"}
    pool = next(p for p in launcher.pools() if p.zone == zones[1] and p.market is Market.SPOT)
    lease = launcher.launch(
        LaunchSpec(
            job_id="cancel-me",
            attempt=1,
            command=("sleep", "120"),
            checkpoint_uri=(tmp_path / "flows" / "cancel-me").as_uri(),
        ),
        pool,
    )
    assert kube_cluster.store.find("pods", kube_namespace, lease.lease_id)

    async def cancel():
        async with SpotWorker(
            work_pool_name="spot-kill-k8s", create_pool_if_not_found=True
        ) as worker:
            await worker.kill_infrastructure(lease.lease_id, configuration, grace_seconds=1)
            wait_for(
                lambda: kube_cluster.store.find("pods", kube_namespace, lease.lease_id) is None,
                30,
                "the cancelled flow run's pod to go",
            )

    try:
        anyio.run(cancel)
    finally:
        launcher.close()
