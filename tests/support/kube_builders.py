"""Builders for the Kubernetes provider's tests (tests/core/test_kubernetes_provider.py):
a cluster of the emulator with the pools a test names, the provider on it, its controller,
the job's pods, and `spot-pipelines run --provider kubernetes` against it.

Unlike ``kube_helpers`` (one emulator for a whole session, a namespace per test), each
cluster here is the test's own, so a test may reclaim, lose or delete any node of it.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spot_core.adaptors import kubernetes as k8s
from spot_core.controller import Controller
from spot_core.model import Lease
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import kubernetes_pods as pods
from spot_core.providers.base import LaunchSpec
from spot_core.providers.kubernetes import KubernetesProvider
from spot_emulators.kubernetes.cluster import KubeCluster
from spot_emulators.kubernetes.config import ClusterConfig
from spot_emulators.kubernetes.pools import NodePool
from tests.support.builders import controller_for

WATCH = [sys.executable, "-m", "spot_core.cli"]
WATCH_OPTION = "watch_command=" + json.dumps(WATCH)
PRICES = {"m5.xlarge": {"spot": 0.07, "on_demand": 0.192}}
POLL_INTERVAL_SECONDS = 0.2


def mounted(path: Path) -> str:
    """--k8s-option: the checkpoint folder on a volume every step pod mounts."""
    return "pod_template=" + json.dumps(
        {
            "spec": {
                "volumes": [{"name": "ckpt", "hostPath": {"path": str(path)}}],
                "containers": [
                    {"name": "step", "volumeMounts": [{"name": "ckpt", "mountPath": str(path)}]}
                ],
            }
        }
    )


@contextlib.contextmanager
def cluster_of(workdir: Path, *pools: NodePool, time_scale: float = 0.1) -> Iterator[KubeCluster]:
    """The emulator with ``pools``, its state in ``workdir / "cluster"``."""
    with KubeCluster(
        workdir / "cluster", ClusterConfig(pools=list(pools), time_scale=time_scale)
    ) as cluster:
        yield cluster


def provider_for(cluster: KubeCluster, **options: Any) -> KubernetesProvider:
    """The provider on ``cluster``'s kubeconfig, polling fast; ``options`` override."""
    return KubernetesProvider.from_options(
        **{
            "kubeconfig": str(cluster.kubeconfig_path),
            "image": "step:1",
            "watch_command": WATCH,
            "watch_poll_interval": 0.2,
            "node_refresh_seconds": 0.2,
            "prices": PRICES,
            **options,
        }
    )


def kube_controller(
    provider: KubernetesProvider, policy: RetryPolicy, *, attempt_timeout_seconds: float
) -> Controller:
    """A controller on the provider, polling as fast as the provider does."""
    return controller_for(
        provider,
        policy,
        poll_interval_seconds=POLL_INTERVAL_SECONDS,
        attempt_timeout_seconds=attempt_timeout_seconds,
    )


def launch_on_first_pool(
    provider: KubernetesProvider, job_id: str, checkpoint_uri: str, command: tuple[str, ...]
) -> Lease:
    """The first attempt of ``job_id`` launched on the provider's first pool, directly."""
    return provider.launch(LaunchSpec(job_id, 1, command, checkpoint_uri), provider.pools()[0])


def job_pods(provider: KubernetesProvider, job_id: str | None = None) -> list[dict]:
    """The pods of ``job_id`` (of every job: None) as the API lists them."""
    listed = k8s.raw(
        "list pods",
        provider.api.list_namespaced_pod,
        "default",
        label_selector=pods.job_selector(job_id),
    )
    return listed.get("items") or []


def running_pod(provider: KubernetesProvider, job_id: str) -> dict | None:
    """The first of ``job_id``'s pods in phase Running, if any."""
    return next(
        (p for p in job_pods(provider, job_id) if p["status"].get("phase") == "Running"), None
    )


def run_argv(
    cluster: KubeCluster,
    job_id: str,
    checkpoint_uri: str,
    mount: Path,
    *command: str,
    image: str = "step:1",
) -> list[str]:
    """`spot-pipelines run --provider kubernetes` on ``cluster``: ``image``, the watch
    command of this interpreter, ``mount`` on every step pod, then ``command``."""
    return [
        sys.executable,
        "-m",
        "spot_core.cli",
        "run",
        "--provider",
        "kubernetes",
        "--kubeconfig",
        str(cluster.kubeconfig_path),
        "--job-id",
        job_id,
        "--checkpoint-uri",
        checkpoint_uri,
        "--k8s-option",
        f"image={json.dumps(image)}",
        "--k8s-option",
        WATCH_OPTION,
        "--k8s-option",
        mounted(mount),
        "--",
        *command,
    ]
