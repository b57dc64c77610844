"""The kubelet's side of one pod: pull, configure, run its containers as local processes,
report status, and stop them the way the kubelet does (SIGTERM, the grace period, SIGKILL).

One ``PodWorker`` thread per pod bound to a node. It owns ``status.containerStatuses``,
the phase and the kubelet's conditions; controllers add theirs (DisruptionTarget,
PodScheduled) to the same object through the store, so neither overwrites the other.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
import uuid
from typing import Any

from . import pod_status as ps
from .env import ContainerConfigError, container_env, expand
from .errors import ApiError
from .logs import ContainerLog
from .processes import ContainerProcess
from .quantity import parse_quantity
from .timefmt import rfc3339

Cluster = Any  # a KubeCluster (cluster.py imports this module, so not imported here)

logger = logging.getLogger(__name__)
_pod_ips = itertools.count(2)
MAX_BACKOFF = 300.0  # the kubelet's back-off cap (image pulls, crash loops)
IMAGE_BACKOFF = 10.0  # first image pull back-off
CONFIG_RETRY = 2.0  # re-check of a missing secret / config map


class PodGone(Exception):
    """The pod object was removed (force delete, pod GC): stop its processes."""


class PodWorker:
    def __init__(self, cluster: Cluster, pod: dict[str, Any]) -> None:
        self.cluster = cluster
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.node = pod["spec"]["nodeName"]
        self.spec = pod["spec"]
        self.logs: dict[str, ContainerLog] = {}
        self.previous_logs: dict[str, ContainerLog] = {}
        self.processes: dict[str, ContainerProcess] = {}
        self.statuses: dict[str, dict[str, Any]] = {}
        self.done = threading.Event()
        self._terminate = threading.Event()
        self._grace = 0.0
        self._delete_after = True
        self._final_phase: str | None = None
        self._final_reason: tuple[str, str] | None = None
        self._silent = False
        self._lock = threading.Lock()
        n = next(_pod_ips)
        self.pod_ip = f"10.244.{n // 250}.{n % 250 + 2}"
        self._started_at = time.time()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"kubelet-{self.name}")

    # -- requests from the cluster ---------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def request_termination(
        self,
        grace: float,
        *,
        delete: bool = True,
        final_phase: str | None = None,
        final_reason: tuple[str, str] | None = None,
    ) -> None:
        """Stop the pod's containers within ``grace`` seconds (a later, shorter grace
        wins, as with a second delete); remove the object afterwards if ``delete``.
        ``final_reason``: (reason, message) the kubelet writes with the final phase, once
        the containers have stopped (graceful node shutdown's ``Terminated``)."""
        with self._lock:
            if self._terminate.is_set():
                self._grace = min(self._grace, grace)
                self._delete_after = self._delete_after or delete
                return
            self._grace, self._delete_after, self._final_phase = grace, delete, final_phase
            self._final_reason = final_reason
            self._terminate.set()

    def kill_now(self) -> None:
        """The node is gone or the emulator stops: every process dies at once."""
        self._grace = 0.0
        self._terminate.set()
        for process in list(self.processes.values()):
            process.kill_now()

    def machine_lost(self, grace: float) -> None:
        """The machine under the node goes away and its kubelet with it: the processes get
        the OS shutdown's SIGTERM, then SIGKILL after ``grace``; no status is reported."""
        self._silent = True
        live = [p for p in self.processes.values() if not p.exited.is_set()]
        for process in live:
            process.send(signal.SIGTERM)
        deadline = time.monotonic() + self.cluster.scaled(grace)
        for process in live:
            process.exited.wait(max(0.0, deadline - time.monotonic()))
        for process in live:
            if not process.exited.is_set():
                process.kill_now()
        self._terminate.set()
        self._delete_after = False

    @property
    def terminating(self) -> bool:
        return self._terminate.is_set()

    # -- the pod's life --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._publish(initial=True)
            for container in self.spec["containers"]:
                if not self._prepare_and_start(container):
                    break
            if not self._terminate.is_set():
                self._publish()
                self._supervise()
            self._finish()
        except PodGone:
            for process in list(self.processes.values()):
                process.kill_now()
        except Exception:  # noqa: BLE001 - a kubelet bug must not leave processes behind
            logger.exception("kubelet worker for pod %s/%s failed", self.namespace, self.name)
            for process in list(self.processes.values()):
                process.kill_now()
        finally:
            for log in self.logs.values():
                log.close()
            self.done.set()
            self.cluster.wake()

    def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` (scaled); True if termination was requested meanwhile."""
        return self._terminate.wait(self.cluster.scaled(seconds))

    def _prepare_and_start(
        self, container: dict[str, Any], restart_count: int = 0, last: dict[str, Any] | None = None
    ) -> bool:
        name, image = container["name"], container["image"]
        if not self._pull(
            name, image, container.get("imagePullPolicy", "IfNotPresent"), restart_count, last
        ):
            return False
        backoff = CONFIG_RETRY
        while True:
            try:
                pod = self._pod()
                env = container_env(pod, container, self.cluster.lookup)
                if not (container.get("command") or container.get("args")):
                    raise ContainerConfigError(
                        f"container {name} has no command: the emulator runs the pod's "
                        "command and args; it has no image entrypoints"
                    )
                break
            except ContainerConfigError as exc:
                self._set(
                    name,
                    ps.waiting(
                        name, image, "CreateContainerConfigError", str(exc), restart_count, last
                    ),
                )
                self.cluster.event(pod, "Warning", "Failed", f"Error: {exc}", self.node)
                if self._wait(backoff):
                    return False
                backoff = min(backoff * 2, MAX_BACKOFF)
        self._spawn(pod, container, env, restart_count, last)
        return True

    def _pull(
        self, name: str, image: str, policy: str, restart_count: int, last: dict[str, Any] | None
    ) -> bool:
        """Pull the image (or find it on the node); False if the pod was stopped while the
        pull kept failing (ErrImagePull, then ImagePullBackOff with a growing back-off)."""
        pod = self._pod()
        if policy != "Always" and self.cluster.image_present(self.node, image):
            self.cluster.event(
                pod,
                "Normal",
                "Pulled",
                f'Container image "{image}" already present on machine',
                self.node,
            )
            return True
        backoff = IMAGE_BACKOFF
        while True:
            self.cluster.event(pod, "Normal", "Pulling", f'Pulling image "{image}"', self.node)
            error = self.cluster.image_error(image)
            if error is None:
                break
            if not self._pull_failed(pod, name, image, error, backoff, restart_count, last):
                return False
            backoff = min(backoff * 2, MAX_BACKOFF)
        started = time.time()
        if self._wait(self.cluster.timings.image_pull_seconds):
            return False
        took = time.time() - started
        self.cluster.mark_pulled(self.node, image)
        self.cluster.event(
            pod,
            "Normal",
            "Pulled",
            f'Successfully pulled image "{image}" in '
            f"{took:.3f}s ({took:.3f}s including waiting). Image size: "
            f"{len(image) * 1048576} bytes.",
            self.node,
        )
        return True

    def _pull_failed(
        self,
        pod: dict[str, Any],
        name: str,
        image: str,
        error: str,
        backoff: float,
        restart_count: int,
        last: dict[str, Any] | None,
    ) -> bool:
        self._set(name, ps.waiting(name, image, "ErrImagePull", error, restart_count, last))
        self.cluster.event(
            pod, "Warning", "Failed", f'Failed to pull image "{image}": {error}', self.node
        )
        self.cluster.event(pod, "Warning", "Failed", "Error: ErrImagePull", self.node)
        if self._wait(1.0):  # until the pod worker's next sync
            return False
        self._set(
            name,
            ps.waiting(
                name,
                image,
                "ImagePullBackOff",
                f'Back-off pulling image "{image}": ErrImagePull: {error}',
                restart_count,
                last,
            ),
        )
        self.cluster.event(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"', self.node)
        self.cluster.event(pod, "Warning", "Failed", "Error: ImagePullBackOff", self.node)
        return not self._wait(backoff)

    def _spawn(
        self,
        pod: dict[str, Any],
        container: dict[str, Any],
        env: dict[str, str],
        restart_count: int,
        last: dict[str, Any] | None,
    ) -> None:
        name, image = container["name"], container["image"]
        argv = [
            expand(str(a), env)
            for a in (container.get("command") or []) + (container.get("args") or [])
        ]
        limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        cwd = container.get("workingDir") or self.cluster.pod_dir(self.uid)
        os.makedirs(cwd, exist_ok=True)
        if name in self.logs:
            self.previous_logs[name] = self.logs[name]
        log = self.logs[name] = ContainerLog()
        full_env = {**self.cluster.base_env(pod), **env}
        container_id = uuid.uuid4().hex + uuid.uuid4().hex
        try:
            process = ContainerProcess(
                container_id, argv, full_env, cwd, log, parse_quantity(limit) if limit else None
            )
        except OSError as exc:
            message = (
                f"failed to create containerd task: failed to create shim task: OCI "
                f'runtime create failed: exec: "{argv[0]}": {exc.strerror}'
            )
            finished = time.time()
            state = ps.terminated_state(
                container_id, 128, "StartError", finished, finished, message=message
            )
            self._set(name, ps.terminated(name, image, container_id, state, restart_count, last))
            self.cluster.event(pod, "Warning", "Failed", f"Error: {message}", self.node)
            return
        self.processes[name] = process
        self.cluster.event(pod, "Normal", "Created", f"Created container: {name}", self.node)
        self.cluster.event(pod, "Normal", "Started", f"Started container {name}", self.node)
        self._set(
            name, ps.running(name, image, container_id, process.started_at, restart_count, last)
        )

    def _supervise(self) -> None:
        restarts: dict[str, float] = {}  # container -> when it restarts
        backoffs: dict[str, float] = {}
        while not self._terminate.is_set():
            for container in self.spec["containers"]:
                name = container["name"]
                process = self.processes.get(name)
                if process is None or not process.exited.is_set() or name in restarts:
                    continue
                if self._is_terminated(name):
                    continue
                self._record_exit(container, process)
                if self._restarts(process.exit_code):
                    backoff = backoffs[name] = min(backoffs.get(name, 5.0) * 2, MAX_BACKOFF)
                    restarts[name] = time.time() + self.cluster.scaled(backoff)
                    status = self.statuses[name]
                    self._set(
                        name,
                        ps.waiting(
                            name,
                            container["image"],
                            "CrashLoopBackOff",
                            f"back-off {int(backoff)}s restarting failed container={name} "
                            f"pod={self.name}_{self.namespace}({self.uid})",
                            status["restartCount"],
                            status["state"],
                        ),
                    )
            for name, when in list(restarts.items()):
                if time.time() >= when:
                    del restarts[name]
                    container = next(c for c in self.spec["containers"] if c["name"] == name)
                    status = self.statuses[name]
                    self._prepare_and_start(
                        container, status["restartCount"] + 1, status["lastState"]
                    )
            if not restarts and all(
                self._is_terminated(c["name"]) for c in self.spec["containers"]
            ):
                return
            self._terminate.wait(0.05)

    def _restarts(self, exit_code: int | None) -> bool:
        policy = self.spec.get("restartPolicy", "Always")
        return policy == "Always" or (policy == "OnFailure" and exit_code != 0)

    def _is_terminated(self, name: str) -> bool:
        return "terminated" in (self.statuses.get(name) or {}).get("state", {})

    def _record_exit(self, container: dict[str, Any], process: ContainerProcess) -> None:
        name = container["name"]
        code = process.exit_code if process.exit_code is not None else 137
        reason = "OOMKilled" if process.oom_killed else ("Completed" if code == 0 else "Error")
        message = None
        if code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = process.log.read(tail=80)[-2048:].decode(errors="replace") or None
        state = ps.terminated_state(
            process.container_id,
            code,
            reason,
            process.started_at,
            process.finished_at or time.time(),
            process.signal,
            message,
        )
        previous = self.statuses.get(name, {})
        self._set(
            name,
            ps.terminated(
                name,
                container["image"],
                process.container_id,
                state,
                previous.get("restartCount", 0),
                previous.get("lastState"),
            ),
        )

    def _finish(self) -> None:
        if self._terminate.is_set():
            self._stop_containers()
        for container in self.spec["containers"]:
            name = container["name"]
            process = self.processes.get(name)
            if process is not None and not self._is_terminated(name):
                self._record_exit(container, process)
            elif process is None and not self._is_terminated(name):
                now = time.time()
                state = ps.terminated_state(
                    uuid.uuid4().hex,
                    137,
                    "ContainerStatusUnknown",
                    now,
                    now,
                    message="The container could not be located when the pod was terminated",
                )
                self._set(name, ps.terminated(name, container["image"], "", state))
        self._publish(final=True)
        if self._terminate.is_set() and self._delete_after and not self._silent:
            self.cluster.finish_deletion(self.namespace, self.name, self.uid)

    def _stop_containers(self) -> None:
        pod = self.cluster.store.find("pods", self.namespace, self.name)
        live = {n: p for n, p in self.processes.items() if not p.exited.is_set()}
        for name, process in live.items():
            if pod is not None:
                self.cluster.event(
                    pod, "Normal", "Killing", f"Stopping container {name}", self.node
                )
            process.stop(signal.SIGTERM)
        deadline = time.monotonic() + self.cluster.scaled(self._grace)
        while live and time.monotonic() < deadline:
            live = {n: p for n, p in live.items() if not p.exited.wait(0.05)}
            deadline = min(deadline, time.monotonic() + self.cluster.scaled(self._grace))
        for process in live.values():
            process.kill_now()

    # -- status ----------------------------------------------------------------------------
    def _pod(self) -> dict[str, Any]:
        pod: dict[str, Any] | None = self.cluster.store.find("pods", self.namespace, self.name)
        if pod is None or pod["metadata"]["uid"] != self.uid:
            raise PodGone()
        return pod

    def _set(self, name: str, status: dict[str, Any]) -> None:
        self.statuses[name] = status
        self._publish()

    def _publish(self, initial: bool = False, final: bool = False) -> None:
        if self._silent:
            return
        names = [c["name"] for c in self.spec["containers"]]
        for container in self.spec["containers"]:
            self.statuses.setdefault(
                container["name"],
                ps.waiting(container["name"], container["image"], "ContainerCreating"),
            )
        statuses = [self.statuses[n] for n in names]
        now = time.time()

        def mutate(pod: dict[str, Any]) -> None:
            status = pod.setdefault("status", {})
            status.update(
                hostIP=self.cluster.node_ip,
                podIP=self.pod_ip,
                hostIPs=[{"ip": self.cluster.node_ip}],
                podIPs=[{"ip": self.pod_ip}],
                startTime=rfc3339(self._started_at),
                containerStatuses=statuses,
            )
            phase = self._phase(statuses, final, status.get("phase"))
            status["phase"] = phase
            if final and self._final_reason:
                status["reason"], status["message"] = self._final_reason
            ready = all(s["ready"] for s in statuses)
            unready = [s["name"] for s in statuses if not s["ready"]]
            ps.set_condition(status, "PodReadyToStartContainers", "False" if final else "True", now)
            ps.set_condition(status, "Initialized", "True", now)
            if phase in ("Succeeded", "Failed"):
                ps.set_condition(status, "Ready", "False", now, "PodCompleted")
                ps.set_condition(status, "ContainersReady", "False", now, "PodCompleted")
            elif ready:
                ps.set_condition(status, "Ready", "True", now)
                ps.set_condition(status, "ContainersReady", "True", now)
            else:
                message = f"containers with unready status: [{' '.join(unready)}]"
                ps.set_condition(status, "Ready", "False", now, "ContainersNotReady", message)
                ps.set_condition(
                    status, "ContainersReady", "False", now, "ContainersNotReady", message
                )
            status["conditions"].sort(key=lambda c: _CONDITION_ORDER.get(c["type"], 9))

        try:
            self.cluster.store.update("pods", self.namespace, self.name, mutate)
        except ApiError as exc:
            if exc.code == 404:
                raise PodGone() from None
            raise

    def _phase(self, statuses: list[dict[str, Any]], final: bool, current: str | None) -> str:
        if current in ("Failed", "Succeeded"):
            return current
        if final and self._final_phase:
            return self._final_phase
        if final or all("terminated" in s["state"] for s in statuses):
            codes = [s["state"].get("terminated", {}).get("exitCode", 1) for s in statuses]
            policy = self.spec.get("restartPolicy", "Always")
            if final or policy == "Never" or (policy == "OnFailure" and not any(codes)):
                return "Succeeded" if not any(codes) else "Failed"
        if self.processes:
            return "Running"
        return "Pending"


_CONDITION_ORDER = {
    "DisruptionTarget": 0,
    "PodReadyToStartContainers": 1,
    "Initialized": 2,
    "Ready": 3,
    "ContainersReady": 4,
    "PodScheduled": 5,
}
