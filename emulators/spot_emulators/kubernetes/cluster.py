"""An emulated Kubernetes cluster: the API objects, the control loop, a kubelet per node,
and the HTTP API server the unmodified ``kubernetes`` clients talk to.

    cluster = KubeCluster(workdir, ClusterConfig(pools=[...], time_scale=0.1)).start()
    config.load_kube_config(cluster.kubeconfig_path)     # then any client call
    cluster.reclaim(node_name, "karpenter")               # the flavour's reclaim sequence
    cluster.stop()                                        # every pod process is killed

Pods run as local processes of this machine (see ``kubelet.py``); the rest is state.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from spot_core.attempt_env import METADATA_ENDPOINT
from spot_core.localcloud.metadata import MetadataEmulator

from . import pod_status as ps
from .apiserver import ApiServer, deletion_fields
from .config import ClusterConfig
from .controllers import ControlLoop
from .errors import ApiError, conflict
from .kubelet import PodWorker
from .pools import NodePool, metadata_cloud
from .reclaim import Reclaim, start_reclaim
from .scheduler import TERMINAL
from .store import Store
from .timefmt import rfc3339

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
NUMERIC_ENV_PREFIXES = ("OPENBLAS_", "OMP_", "MKL_", "GOTO_", "BLIS_")
SYSTEM_PRIORITY_CLASSES = {
    "system-cluster-critical": 2000000000,
    "system-node-critical": 2000001000,
}


class KubeCluster:
    node_ip = "127.0.0.1"

    def __init__(
        self,
        workdir: str | Path,
        config: ClusterConfig | None = None,
        *,
        port: int = 0,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.workdir = Path(workdir)
        self.config = config or ClusterConfig()
        self.timings = self.config.timings
        self.token = token or secrets.token_urlsafe(24)
        self.clock = clock
        self.store = Store(clock)
        self.api = ApiServer(self)
        self.pools: dict[str, NodePool] = {}
        self.workers: dict[str, PodWorker] = {}  # pod uid -> its kubelet worker
        self.metadata: dict[str, MetadataEmulator] = {}  # node name -> its metadata server
        self.reclaims: list[Reclaim] = []
        self.stopping = threading.Event()
        self._port = port
        self._pulled: dict[str, set[str]] = {}
        # (uid, reason, message, component) -> the (namespace, name) of its Event
        self._events: dict[tuple[str, str, str, str], tuple[str, str]] = {}
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._loop = ControlLoop(self)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> KubeCluster:
        from .server import serve

        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in SYSTEM_NAMESPACES:
            self.api.create("namespaces", "", {"metadata": {"name": name}})
        for account_ns in SYSTEM_NAMESPACES:
            self.store.create(
                "serviceaccounts", {"metadata": {"name": "default", "namespace": account_ns}}
            )
        for name, value in SYSTEM_PRIORITY_CLASSES.items():
            self.api.create(
                "priorityclasses",
                "",
                {
                    "metadata": {"name": name},
                    "value": value,
                    "description": "Used for system critical pods that must run in the cluster.",
                },
            )
        for pool in self.config.pools:
            self.add_pool(pool)
        self._server = serve(self, self._port)
        self._port = self._server.server_address[1]
        self._write_kubeconfig()
        self._loop.start()
        return self

    def stop(self) -> None:
        """Stop serving and kill every pod process (nothing is left running)."""
        self.stopping.set()
        self.store.close()
        self._loop.join(5.0)
        for worker in list(self.workers.values()):
            worker.kill_now()
        for worker in list(self.workers.values()):
            worker.done.wait(10.0)
        for reclaim in self.reclaims:
            if reclaim.thread is not None:  # start_reclaim sets it before it is listed
                reclaim.thread.join(2.0)
        for emulator in self.metadata.values():
            emulator.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kubeconfig"

    def _write_kubeconfig(self) -> None:
        """JSON is YAML: the clients' loaders read it. 0600, as it holds the token."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "spot-emulator",
            "clusters": [{"name": "spot-emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "spot-emulator", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "spot-emulator",
                    "context": {
                        "cluster": "spot-emulator",
                        "user": "spot-emulator",
                        "namespace": "default",
                    },
                }
            ],
            "preferences": {},
        }
        path = self.kubeconfig_path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(config, handle, indent=2)
        os.chmod(path, 0o600)

    def scaled(self, seconds: float) -> float:
        return max(0.0, float(seconds)) * self.config.time_scale

    def wake(self) -> None:
        with self.store.changed:
            self.store.changed.notify_all()

    # -- nodes and pools -------------------------------------------------------------------
    def add_pool(self, pool: NodePool) -> list[str]:
        """Add a pool and register its nodes; returns their names."""
        if pool.name in self.pools:
            raise ValueError(f"node pool {pool.name!r} exists already")
        self.pools[pool.name] = pool
        return [self.add_node(pool.name) for _ in range(pool.nodes)]

    def add_node(self, pool_name: str) -> str:
        pool = self.pools[pool_name]
        node = pool.node_object()
        name: str = node["metadata"]["name"]
        now = self.clock()
        ps.set_condition(
            node["status"],
            "MemoryPressure",
            "False",
            now,
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        )
        ps.set_condition(
            node["status"],
            "DiskPressure",
            "False",
            now,
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        )
        ps.set_condition(
            node["status"],
            "PIDPressure",
            "False",
            now,
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        )
        ps.set_condition(
            node["status"], "Ready", "True", now, "KubeletReady", "kubelet is posting ready status"
        )
        for condition in node["status"]["conditions"]:
            condition["lastHeartbeatTime"] = condition.pop("lastProbeTime") or rfc3339(now)
        if pool.metadata:
            emulator = MetadataEmulator(
                clouds=(metadata_cloud(pool.flavour),),
                zone=pool.zone,
                instance_type=pool.instance_type,
            )
            self.metadata[name] = emulator.start()
        self.api.create("nodes", "", node)
        self.event(
            self.store.get("nodes", "", name),
            "Normal",
            "RegisteredNode",
            f"Node {name} event: Registered Node {name} in Controller",
            component="node-controller",
        )
        return name

    def pool_of(self, node: dict[str, Any]) -> NodePool | None:
        return self.pools.get((node["metadata"].get("labels") or {}).get("spot-emulator/pool", ""))

    def reclaim(self, node_name: str, flavour: str | None = None) -> Reclaim:
        """Run ``flavour``'s reclaim of the node in the background (default: its pool's
        flavour); ``.wait(timeout)`` on the result to block until the node is gone."""
        node = self.store.get("nodes", "", node_name)
        pool = self.pool_of(node)
        chosen = flavour or (pool.flavour if pool else None)
        if chosen is None:
            raise ValueError(f"node {node_name} has no pool: name the flavour to reclaim it")
        reclaim = start_reclaim(self, node_name, chosen)
        self.reclaims.append(reclaim)
        return reclaim

    def node_deleted(self, node: dict[str, Any]) -> None:
        """A node left the cluster: its metadata server stops, its pool may replace it."""
        name = node["metadata"]["name"]
        emulator = self.metadata.pop(name, None)
        if emulator is not None:
            emulator.stop()
        pool = self.pool_of(node)
        if pool is not None and pool.replace_after_seconds is not None:
            self._loop.replace_later(pool.name, self.scaled(pool.replace_after_seconds))

    # -- pods ------------------------------------------------------------------------------
    def delete_pod(self, namespace: str, name: str, grace: Any = None) -> dict[str, Any]:
        pod = self.store.get("pods", namespace, name)
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        grace = max(0, int(grace))
        if not pod["spec"].get("nodeName") or pod["status"].get("phase") in TERMINAL:
            grace = 0
        if grace == 0:
            final = self.store.delete("pods", namespace, name)
            self.wake()
            return final
        current = pod["metadata"].get("deletionGracePeriodSeconds")
        if current is not None and current <= grace:
            return pod
        now = self.clock()
        return self.store.update(
            "pods", namespace, name, lambda p: p["metadata"].update(deletion_fields(now, grace))
        )

    def finish_deletion(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet has stopped a deleted pod's containers: the object goes."""
        pod = self.store.find("pods", namespace, name)
        if pod is not None and pod["metadata"]["uid"] == uid:
            try:
                self.store.delete("pods", namespace, name)
            except ApiError:
                pass

    def mark_disruption(
        self,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        phase: str | None = None,
        status_reason: str | None = None,
    ) -> None:
        """Add ``DisruptionTarget=True`` (and a terminal phase) as the controllers do."""
        now = self.clock()

        def mutate(pod: dict[str, Any]) -> None:
            ps.set_condition(pod["status"], "DisruptionTarget", "True", now, reason, message)
            if phase and pod["status"].get("phase") not in TERMINAL:
                pod["status"]["phase"] = phase
                if status_reason:
                    pod["status"]["reason"] = status_reason
                    pod["status"]["message"] = message

        self.store.update("pods", namespace, name, mutate)

    def bind(self, namespace: str, name: str, node_name: str) -> None:
        now = self.clock()

        def mutate(pod: dict[str, Any]) -> None:
            if pod["spec"].get("nodeName"):
                raise conflict(
                    "pods/binding",
                    name,
                    f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"',
                )
            pod["spec"]["nodeName"] = node_name
            ps.set_condition(pod["status"], "PodScheduled", "True", now)

        pod = self.store.update("pods", namespace, name, mutate)
        self.event(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {namespace}/{name} to {node_name}",
            component="default-scheduler",
        )

    def delete_namespace(self, name: str) -> dict[str, Any]:
        if name in SYSTEM_NAMESPACES:
            raise ApiError(
                403,
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                "Forbidden",
            )
        now = self.clock()
        namespace = self.store.update(
            "namespaces",
            "",
            name,
            lambda ns: (
                ns["metadata"].update(deletion_fields(now, 0)),
                ns["status"].update(phase="Terminating"),
            ),
        )
        for pod in self.store.list("pods", name)[0]:
            self.delete_pod(name, pod["metadata"]["name"])
        return namespace

    # -- what kubelets need ----------------------------------------------------------------
    def lookup(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.store.find(resource, namespace, name)

    def image_error(self, image: str) -> str | None:
        return self.config.images.error(image, ps.normalized_image(image))

    def image_present(self, node: str, image: str) -> bool:
        return image in self._pulled.get(node, set())

    def mark_pulled(self, node: str, image: str) -> None:
        self._pulled.setdefault(node, set()).add(image)

    def pod_dir(self, uid: str) -> str:
        return str(self.workdir / "pods" / uid)

    def base_env(self, pod: dict[str, Any]) -> dict[str, str]:
        """What every container sees besides its spec's env: this machine's PATH with the
        emulator's interpreter directory first (so ``spot-pipelines`` and ``python`` are
        the emulator's venv's even when it was not activated), the in-cluster service
        variables and, as the stand-in for a mounted service-account token, ``KUBECONFIG``.
        The machine's BLAS / OpenMP settings (``OPENBLAS_CORETYPE``, ``OMP_NUM_THREADS``,
        ...) pass through as a real node's image bakes in its own: they choose the numeric
        kernels, so a step resumed in a pod computes bit for bit what the same step
        computes outside one."""
        env = {k: v for k, v in os.environ.items() if k.startswith(NUMERIC_ENV_PREFIXES)}
        env |= {
            "PATH": _interpreter_first(os.environ.get("PATH", "")),
            "HOME": os.environ.get("HOME", "/"),
            "HOSTNAME": pod["metadata"]["name"],
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self._port),
            "KUBECONFIG": str(self.kubeconfig_path),
        }
        emulator = self.metadata.get(pod["spec"].get("nodeName", ""))
        if emulator is not None:
            env[METADATA_ENDPOINT] = emulator.url
        return env

    def event(
        self,
        obj: Mapping[str, Any],
        type_: str,
        reason: str,
        message: str,
        host: str | None = None,
        component: str = "kubelet",
    ) -> None:
        """Record a core/v1 Event (repeats bump ``count``, as the event recorder does)."""
        meta = obj["metadata"]
        key = (meta["uid"], reason, message, component)
        now = self.clock()
        with self._lock:
            existing = self._events.get(key)
            if existing is not None:
                namespace, name = existing
                try:
                    self.store.update(
                        "events",
                        namespace,
                        name,
                        lambda e: e.update(count=e.get("count", 1) + 1, lastTimestamp=rfc3339(now)),
                    )
                    return
                except ApiError:
                    self._events.pop(key, None)  # expired, or its namespace went
            namespace = meta.get("namespace") or "default"
            name = f"{meta['name']}.{time.time_ns():x}"
            involved = {
                "kind": obj["kind"],
                "name": meta["name"],
                "uid": meta["uid"],
                "apiVersion": obj["apiVersion"],
                "resourceVersion": meta.get("resourceVersion", ""),
            }
            if meta.get("namespace"):
                involved["namespace"] = meta["namespace"]
            source = {"component": component}
            if host:
                source["host"] = host
            self.store.create(
                "events",
                {
                    "metadata": {"name": name, "namespace": namespace},
                    "involvedObject": involved,
                    "reason": reason,
                    "message": message,
                    "source": source,
                    "type": type_,
                    "firstTimestamp": rfc3339(now),
                    "lastTimestamp": rfc3339(now),
                    "count": 1,
                    "eventTime": None,
                    "reportingComponent": component,
                    "reportingInstance": host or "",
                },
            )
            self._events[key] = (namespace, name)

    def start_worker(self, pod: dict[str, Any]) -> PodWorker:
        worker = PodWorker(self, pod)
        self.workers[pod["metadata"]["uid"]] = worker
        worker.start()
        return worker

    def cleanup_workdir(self) -> None:
        shutil.rmtree(self.workdir / "pods", ignore_errors=True)


def _interpreter_first(path: str) -> str:
    here = os.path.dirname(sys.executable)
    rest = [p for p in path.split(os.pathsep) if p and p != here]
    return os.pathsep.join([here, *rest])
