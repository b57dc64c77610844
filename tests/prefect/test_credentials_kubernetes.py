"""Kubernetes work whose cluster credentials come only from a saved prefect-kubernetes
``KubernetesClusterConfig`` block (the emulator's kubeconfig, bearer token included):
no kubeconfig in provider_options, and ``$KUBECONFIG`` pointing at nothing, so the
provider could reach the cluster no other way.

- SpotTaskRunner: a saved SpotConfiguration that references the saved block runs a task
  as a pod on the emulator's spot pool; the configuration's document holds a reference to
  the block, not a copy of the kubeconfig (a token rotated in the block is what it loads).
- The spot worker: the work pool's ``cluster_config`` variable defaults to a reference to
  the block; the worker resolves it into its job configuration, launches and kills a pod
  with it, and keeps a provider per block (a block with a wrong token is refused, not
  served by the other block's provider).
- Bad input: a block on another provider, or beside kubeconfig options, is refused in one
  line.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from prefect import flow
from pydantic import ValidationError

from prefect_spot import SpotConfiguration, SpotTaskRunner, spot_record
from prefect_spot.workers import SpotJobConfiguration, SpotJobVariables
from spot_core.errors import ConfigError
from spot_core.model import Market, Outcome
from tests.support.aws_helpers import unique
from tests.support.kube_helpers import add_test_pool, kube_cluster, kube_namespace, wait_for  # noqa: F401
from tests.support.prefect_helpers import count_to

pytestmark = pytest.mark.timeout(240)
TESTS = str(Path(__file__).resolve().parent)
# This module's own spot pool (no other test's pods or reclaims), in the region of the
# session cluster's other pools: a cluster's nodes are in one region.
ZONE = "us-east-1d"


def _cluster_block(kubeconfig: Path, **changes):
    from prefect_kubernetes.credentials import KubernetesClusterConfig

    block = KubernetesClusterConfig.from_file(kubeconfig)
    for key, value in changes.items():
        block.config["users"][0]["user"][key] = value
    return block


@pytest.fixture(scope="module")
def spot_pool(kube_cluster):
    """A Karpenter spot pool of this module's own, in a zone no other pool uses."""
    add_test_pool(kube_cluster, "karpenter", capacity_type="spot", zone=ZONE, pods=4)
    return ZONE


@pytest.fixture
def block_only(prefect_api, kube_cluster, spot_pool, tmp_path, monkeypatch):
    """A saved cluster block made from the emulator's kubeconfig; then a process whose
    default kubeconfig does not exist and that is in no pod. The pods' `python3` is this
    environment's (the emulator's pods get its PATH, as an image has its own Python)."""
    name = unique("spot-k8s")
    _cluster_block(kube_cluster.kubeconfig_path).save(name)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return name


def _provider_options(namespace: str, root: Path, image: str) -> dict:
    """No kubeconfig, context or in_cluster: the cluster comes from the block. The
    checkpoint folder is on a volume every pod mounts at the same path."""
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
    return {
        "namespace": namespace,
        "image": image,
        "watch_command": [sys.executable, "-m", "spot_core.cli"],
        "watch_poll_interval": 0.2,
        "pod_template": template,
        "prices": {"m5.xlarge": {"spot": 0.07, "on_demand": 0.192}},
    }


def test_a_saved_cluster_block_runs_a_task_as_a_pod_on_the_spot_pool(
    block_only, kube_cluster, kube_namespace, tmp_path
):
    from prefect import get_client
    from prefect_kubernetes.credentials import KubernetesClusterConfig

    root = tmp_path / "tasks"
    root.mkdir()
    cluster = KubernetesClusterConfig.load(block_only)
    config_name = unique("spot-k8s-config")
    SpotConfiguration(
        provider="kubernetes",
        zones=[ZONE],
        capacity_wait=0.5,
        poll_interval=0.2,
        cluster_config=cluster,
        provider_options=_provider_options(kube_namespace, root, "tasks:1"),
    ).save(config_name)

    @flow(
        task_runner=SpotTaskRunner(
            config_name,
            checkpoint_storage=root.as_uri(),
            checkpoint_every_steps=10,
            workdir=tmp_path / "runner",
        )
    )
    def pipeline():
        future = count_to.submit(30, 0.01)
        return future.result(), spot_record(future)

    result, record = pipeline()
    assert result["total"] == 30
    last = record.attempts[-1]
    assert last.outcome is Outcome.SUCCEEDED and last.cost > 0
    assert last.pool.market is Market.SPOT and last.pool.zone == ZONE
    assert last.lease["details"]["namespace"] == kube_namespace  # the pod, in our namespace
    wait_for(
        lambda: not kube_cluster.store.list("pods", kube_namespace)[0],
        30,
        "the task's pod to be deleted",
    )

    # The saved configuration holds a reference to the cluster block, not a copy of the
    # kubeconfig: a credential rotated in the block is what the configuration loads next.
    with get_client(sync_client=True) as client:
        document = client.read_block_document_by_name(config_name, "spot-configuration")
    reference = document.block_document_references["cluster_config"]
    assert str(reference["block_document"]["id"]) == str(cluster._block_document_id)
    _cluster_block(kube_cluster.kubeconfig_path, token="rotated").save(block_only, overwrite=True)
    loaded = SpotConfiguration.load(config_name).cluster_config
    assert loaded.config["users"][0]["user"]["token"] == "rotated"


def test_the_work_pool_references_the_block_and_the_worker_reaches_the_cluster_with_it(
    block_only, kube_cluster, kube_namespace, tmp_path
):
    """As prefect-kubernetes' own pools: the work pool's ``cluster_config`` variable
    defaults to a reference to the saved block; deployments carry no credential, and the
    worker resolves the reference when it builds the job configuration."""
    import anyio
    from prefect import get_client
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.credentials import KubernetesClusterConfig

    from prefect_spot.workers import SpotWorker
    from spot_core.providers.base import LaunchSpec
    from tests.support.prefect_helpers import deploy_example_flow

    root = tmp_path / "flows"
    root.mkdir()
    block_id = str(KubernetesClusterConfig.load(block_only)._block_document_id)
    reference = {"$ref": {"block_document_id": block_id}}
    template = SpotWorker.get_default_base_job_template()
    template["variables"]["properties"]["cluster_config"]["default"] = reference
    pool = unique("spot-k8s-pool")
    options = _provider_options(kube_namespace, root, "flows:1")
    deployment_id = deploy_example_flow(
        pool,
        "k8s-block-credentials",
        {
            "provider": "kubernetes",
            "zones": [ZONE],
            "checkpoint_root": root.as_uri(),
            "provider_options": options,
        },
        base_job_template=template,
    )
    wrong = unique("spot-k8s-wrong")
    _cluster_block(kube_cluster.kubeconfig_path, token="not-the-token").save(wrong)
    with get_client(sync_client=True) as client:
        stored = client.read_deployment(deployment_id).job_variables
        pool_template = client.read_work_pool(pool).base_job_template
        wrong_id = str(client.read_block_document_by_name(wrong, "kubernetes-cluster-config").id)
    assert kube_cluster.token not in json.dumps(stored) + json.dumps(pool_template)

    async def scenario():
        async with get_client() as client:
            configuration = await SpotJobConfiguration.from_template_and_values(
                pool_template, stored, client=client
            )
            impostor = await SpotJobConfiguration.from_template_and_values(
                pool_template,
                {**stored, "cluster_config": {"$ref": {"block_document_id": wrong_id}}},
                client=client,
            )
        assert configuration.cluster_config.context_name == "spot-emulator"  # resolved here
        flow_run = FlowRun(id=uuid.uuid4(), name="k8s-block-run", flow_id=uuid.uuid4())
        configuration.prepare_for_flow_run(flow_run)
        assert kube_cluster.token not in json.dumps(configuration.env, default=str)
        async with SpotWorker(work_pool_name=pool) as worker:
            provider = worker._provider(configuration)
            spot = [p for p in provider.pools() if p.zone == ZONE and p.market is Market.SPOT]
            lease = provider.launch(
                LaunchSpec(
                    job_id="k8s-block-job",
                    attempt=1,
                    command=("sleep", "60"),
                    checkpoint_uri=(root / "k8s-block-job").as_uri(),
                ),
                spot[0],
            )
            assert kube_cluster.store.find("pods", kube_namespace, lease.lease_id)
            await worker.kill_infrastructure(lease.lease_id, configuration, grace_seconds=1)
            wait_for(
                lambda: kube_cluster.store.find("pods", kube_namespace, lease.lease_id) is None,
                30,
                "the killed pod to go",
            )
            # Another block is another provider: its wrong token is refused by the API,
            # not answered with the first block's cached provider.
            with pytest.raises(ConfigError, match="refused access"):
                worker._provider(impostor).pools()

    anyio.run(scenario)


def test_cluster_config_only_on_kubernetes_and_instead_of_kubeconfig_options(kube_cluster):
    block = _cluster_block(kube_cluster.kubeconfig_path)
    for model, extra in (
        (SpotConfiguration, {}),
        (SpotJobVariables, {"checkpoint_root": "s3://b/flows"}),
        (SpotJobConfiguration, {"checkpoint_root": "s3://b/flows"}),
    ):
        with pytest.raises(
            ValidationError, match="set provider='kubernetes' or remove cluster_config"
        ):
            model(provider="local", cluster_config=block)
        for given in ({"kubeconfig": "/etc/kube.yaml"}, {"context": "prod"}, {"in_cluster": True}):
            with pytest.raises(
                ValidationError,
                match=rf"remove \['{next(iter(given))}'\] "
                "from provider_options",
            ):
                model(provider="kubernetes", cluster_config=block, provider_options=given, **extra)
        assert model(provider="kubernetes", cluster_config=block, **extra).cluster_config
