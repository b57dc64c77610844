"""The Kubernetes API emulator for tests: one cluster per session, a namespace per test.

``kube_cluster`` starts ``KubeCluster`` (emulators/spot_emulators/kubernetes) once per test
session with a short time scale; tests that need nodes of their own add a pool with a
unique name (``add_test_pool``) and pin their pods to it with a nodeSelector, so reclaims
in one test never touch another's pods. ``kube_namespace`` gives each test a fresh
namespace and deletes it (and so its pods) afterwards. ``kube_client`` is a
``kubernetes.client.ApiClient`` built from the emulator's kubeconfig.
"""

from __future__ import annotations

import itertools
import time
import uuid

import pytest

from spot_core.localcloud.lease_processes import _PROC
from spot_emulators.kubernetes import ClusterConfig, KubeCluster, NodePool, Timings
from spot_emulators.kubernetes.processes import MARKER

TIME_SCALE = 0.1
_pools = itertools.count(1)


def test_config() -> ClusterConfig:
    return ClusterConfig(
        time_scale=TIME_SCALE,
        timings=Timings(
            image_pull_seconds=0.05,
            node_gone_seconds=1.0,
            gke_shutdown_grace_seconds=30,
            gke_shutdown_critical_seconds=10,
            vm_shutdown_seconds=10,
        ),
    )


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory):
    cluster = KubeCluster(tmp_path_factory.mktemp("kube"), test_config()).start()
    yield cluster
    cluster.stop()
    left = {pid: _describe(pid) for pid in emulator_processes(cluster)}
    assert not left, f"pod processes outlived the emulator: {left}"


@pytest.fixture(scope="session")
def kube_client(kube_cluster):
    kubernetes = pytest.importorskip("kubernetes")
    client = kubernetes.config.new_client_from_config(str(kube_cluster.kubeconfig_path))
    yield client
    client.close()


@pytest.fixture
def kube_namespace(kube_cluster):
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube_cluster.api.create("namespaces", "", {"metadata": {"name": name}})
    yield name
    kube_cluster.delete_namespace(name)
    wait_for(
        lambda: kube_cluster.store.find("namespaces", "", name) is None,
        30,
        f"namespace {name} to go",
    )


def add_test_pool(cluster: KubeCluster, flavour: str, **options) -> tuple[str, list[str]]:
    """A pool of this test's own: (pool name, node names)."""
    name = f"{flavour}-{options.get('capacity_type', 'spot')[:4]}-{next(_pools)}"
    nodes = cluster.add_pool(NodePool(name, flavour, **{"replace_after_seconds": None, **options}))
    return name, nodes


def emulator_processes(cluster: KubeCluster | None = None) -> list[int]:
    """Live processes of emulated containers (by their marker): of ``cluster`` only when
    given (other emulators may run on this machine at the same time)."""
    mine = f"KUBECONFIG={cluster.kubeconfig_path}".encode() if cluster else None
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state == "Z" or not any(v.startswith(MARKER.encode() + b"=") for v in environ):
            continue
        if mine is None or mine in environ:
            found.append(int(entry.name))
    return found


def _describe(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate`` until truthy (returned) or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
