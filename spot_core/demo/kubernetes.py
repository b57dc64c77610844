"""The main job on Kubernetes spot node pools: ``spot-pipelines demo --provider kubernetes``.

prepare data -> train (a spot job whose attempts are pods) -> evaluate, on the project's
Kubernetes API emulator (no cluster can run here): an EKS-style cluster with a Karpenter
spot NodePool in us-east-1b, an EKS managed spot node group in us-east-1a and an EKS
on-demand node group of two nodes in us-east-1c. Spot capacity is scarce (a reclaimed node
is not replaced), and the nodes are reclaimed the way each flavour does it while the step
trains: Karpenter's interruption (its taint; the step pod, annotated do-not-disrupt, goes
down with the instance), then the managed node group's rebalance (cordon and drain). The
step's watcher sees each notice (its node's taint or cordon, the kubelet's SIGTERM),
saves an emergency checkpoint, and the controller resumes it on the next pool; after two
preemptions the rest runs on the on-demand node group, whose node is then drained for an
upgrade: a voluntary disruption, resumed on the other on-demand node without spending a
preemption. The final weights are compared with an uninterrupted run of the same training.

The emulator is the separate distribution spot-pipelines-emulators (not in this package's
wheel, which every Airflow worker installs): it is imported lazily, and when it is missing
the demo names the extra to install in one line (``require_emulator``).
"""

from __future__ import annotations

import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spot_core.checkpoint import open_store
from spot_core.controller import Controller, JobSpec, Listener
from spot_core.demo.pipeline import DemoData, DemoReport, demo_policy
from spot_core.errors import ConfigError
from spot_core.model import Market
from spot_core.policy.pod_outcomes import ANNOTATION_POOL, node_of
from spot_core.providers import kubernetes_pods as pods
from spot_core.providers.kubernetes import KubernetesProvider
from spot_core.workloads.example_pipeline import train_command

if TYPE_CHECKING:
    from spot_emulators.kubernetes.cluster import KubeCluster
    from spot_emulators.kubernetes.config import ClusterConfig

# `pip install "spot-pipelines[emulators]"` installs the Kubernetes emulator.
EMULATORS_EXTRA = "emulators"

# $/h of m5.xlarge (us-east-1): spot as configured per node pool; on-demand the list price.
PRICES = {
    "karpenter-spot": {"spot": 0.0651},
    "eks-spot": {"spot": 0.0725},
    "m5.xlarge": {"on_demand": 0.192},
}


@dataclass(frozen=True)
class KubernetesDemoConfig:
    steps: int = 2000
    step_seconds: float = 0.006  # about 12 s of training
    checkpoint_every_seconds: float = 1.0
    # Reclaim the running spot node once the step has saved past these fractions...
    reclaim_at: tuple[float, ...] = (0.25, 0.6)
    # ...then drain its on-demand node (an upgrade: voluntary) past this one (None: never).
    drain_at: float | None = 0.85
    max_preemptions: int = 2
    time_scale: float = 0.1  # the emulator's grace periods, scaled
    timeout_seconds: float = 240.0


def require_emulator() -> None:
    """Check, before anything starts, that the Kubernetes emulator can be imported.

    Raises:
        ConfigError: it is not installed; the one line names the extra that installs it.
    """
    try:
        import spot_emulators.kubernetes  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "spot_emulators":
            raise  # the emulator is there but something it imports is not
        raise ConfigError(
            "--provider kubernetes runs on the Kubernetes emulator, which is not "
            f'installed: pip install "spot-pipelines[{EMULATORS_EXTRA}]"'
        ) from None


def emulated_cluster(workdir: Path, cfg: KubernetesDemoConfig) -> KubeCluster:
    """The demo's cluster in ``workdir`` (a context manager: it runs inside the block).

    Raises:
        ConfigError: the emulator is not installed (``require_emulator``).
    """
    require_emulator()
    from spot_emulators.kubernetes.cluster import KubeCluster

    return KubeCluster(workdir, cluster_config(cfg))


def cluster_config(cfg: KubernetesDemoConfig) -> ClusterConfig:
    from spot_emulators.kubernetes.config import ClusterConfig
    from spot_emulators.kubernetes.pools import NodePool

    return ClusterConfig(
        pools=[
            NodePool(
                "karpenter-spot", "karpenter", "spot", "us-east-1b", replace_after_seconds=None
            ),
            NodePool("eks-spot", "eks", "spot", "us-east-1a", replace_after_seconds=None),
            NodePool("eks-on-demand", "eks", "on-demand", "us-east-1c", nodes=2),
        ],
        time_scale=cfg.time_scale,
    )


def cluster_watcher(cluster: KubeCluster) -> KubernetesProvider:
    """A provider over the emulated ``cluster`` that a ``Reclaimer`` reads node and pod
    state through (the Airflow demo's: its job's own provider lives in the DAG)."""
    return KubernetesProvider.from_options(
        kubeconfig=str(cluster.kubeconfig_path), node_refresh_seconds=0.5
    )


def run_demo(
    workdir: Path,
    cfg: KubernetesDemoConfig = KubernetesDemoConfig(),
    listener: Listener | None = None,
) -> DemoReport:
    require_emulator()
    demo = DemoData.prepare(workdir, cfg.steps)
    store_uri = demo.store_uri
    with (
        emulated_cluster(workdir / "cluster", cfg) as cluster,
        KubernetesProvider.from_options(
            kubeconfig=str(cluster.kubeconfig_path),
            image="spot-pipelines-step:demo",
            watch_command=[sys.executable, "-m", "spot_core.cli"],
            watch_poll_interval=0.2,
            prices=PRICES,
            node_refresh_seconds=0.5,
        ) as provider,
    ):
        spec = JobSpec(
            job_id=f"demo-train-{uuid.uuid4().hex[:6]}",
            command=tuple(
                train_command(
                    str(demo.data), cfg.steps, cfg.step_seconds, cfg.checkpoint_every_seconds
                )
            ),
            checkpoint_uri=store_uri,
            pools=provider.pools(),
        )
        controller = Controller(
            provider,
            provider.market,
            demo_policy(cfg.max_preemptions),
            listener=listener,
            poll_interval_seconds=0.2,
            attempt_timeout_seconds=cfg.timeout_seconds,
        )
        reclaimer = Reclaimer(cluster, provider, spec.job_id, store_uri, cfg)
        with reclaimer:
            record = controller.run(spec)
    return demo.report(record, cfg.checkpoint_every_seconds, 1.0)


class Reclaimer:
    """Takes the running attempt's node away each time the step has checkpointed past the
    next threshold (a background thread): a spot node by its flavour's reclaim for each of
    ``cfg.reclaim_at``, then an on-demand node by a drain at ``cfg.drain_at``. A
    ``job_id`` of None watches every managed job's pods."""

    def __init__(
        self,
        cluster: KubeCluster,
        provider: KubernetesProvider,
        job_id: str | None,
        store_uri: str,
        cfg: KubernetesDemoConfig,
    ) -> None:
        self.cluster, self.provider, self.job_id = cluster, provider, job_id
        self.store = open_store(store_uri)
        self.thresholds = [int(f * cfg.steps) for f in cfg.reclaim_at]
        self.drain_step = None if cfg.drain_at is None else int(cfg.drain_at * cfg.steps)
        self.reclaimed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="reclaimer")

    def __enter__(self) -> Reclaimer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def _run(self) -> None:
        while (self.thresholds or self.drain_step is not None) and not self._stop.wait(0.2):
            if self.thresholds:
                node = self._spot_node_past(self.thresholds[0])
                if node is not None:
                    self.cluster.reclaim(node)
                    self.reclaimed.append(node)
                    self.thresholds.pop(0)
                continue
            if self.drain_step is None:  # not reached: the loop's condition
                break
            node = self._node_past(self.drain_step, Market.ON_DEMAND)
            if node is not None:
                self.cluster.reclaim(node, "drain")
                self.reclaimed.append(node)
                self.drain_step = None

    def _spot_node_past(self, step: int) -> str | None:
        return self._node_past(step, Market.SPOT)

    def _node_past(self, step: int, market: Market) -> str | None:
        """The node of the job's running pod on ``market`` once a checkpoint of this
        attempt is at or past ``step``."""
        from spot_core.adaptors import kubernetes as k8s

        listed = k8s.raw(
            "list pods",
            self.provider.api.list_namespaced_pod,
            "default",
            label_selector=pods.job_selector(self.job_id),
        )
        for pod in listed.get("items") or []:
            node = node_of(pod)
            attempt = int(pod["metadata"]["labels"].get(pods.LABEL_ATTEMPT, 0))
            latest = self.store.latest()
            if node in self.reclaimed or node is None or latest is None:
                continue
            if (pod.get("status") or {}).get("phase") != "Running" or latest.attempt != attempt:
                continue
            pool = self.provider.market.refresh().get(
                pod["metadata"]["annotations"].get(ANNOTATION_POOL, "")
            )
            if latest.step >= step and pool is not None and pool.pool.market is market:
                return node
        return None
