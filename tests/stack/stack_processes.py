"""docker/compose.yaml's services run as local processes, with their exact commands and
environment, as the compose implementation resolves them.

What a container engine would provide, done on this machine instead:
- **Images -> environments.** Each image's Python environment is one of ours: the Airflow
  image is .venv-airflow, the Prefect image .venv-prefect, the step and moto images (Python
  with spot-pipelines[aws], moto's server) .venv-airflow, which has both. Its bin folder
  comes first on PATH, so `airflow`, `prefect`, `python`, `moto_server` are the image's.
- **Hostnames and ports.** Each port a service lists under ``expose`` gets a free local
  port; ``SERVICE:PORT`` becomes ``127.0.0.1:FREE`` and a bare ``PORT`` argument or value
  becomes ``FREE``, in every command and environment; ``0.0.0.0`` becomes 127.0.0.1.
- **Volumes.** A bind mount's container path becomes its host path, a named volume's a
  temp folder shared by the services that mount it.
- **postgres** (the official image) is a private cluster started the way its entrypoint
  does it: POSTGRES_USER/POSTGRES_PASSWORD, then /docker-entrypoint-initdb.d/*.sql.
- **depends_on.** A service starts once its dependencies are ready, independent ones side
  by side: a dependency waited on with ``service_completed_successfully`` once it exited
  0, one with ``service_healthy`` once its healthcheck command passes, any other once its
  ports accept connections (each bounded).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from compose_helpers import REPO, Service, services
from postgres_helpers import private_cluster, psql
from process_helpers import free_port, stop_tree

IMAGE_ENVS = {"spot-pipelines-airflow": ".venv-airflow", "spot-pipelines-prefect": ".venv-prefect",
              "spot-pipelines-step": ".venv-airflow", "motoserver/moto": ".venv-airflow"}
READY_TIMEOUT = 180.0
INIT_TIMEOUT = 300.0
STOP_TIMEOUT = 15.0  # compose's default stop grace is 10 s


def image_env(image: str) -> Path:
    """The Python environment standing in for ``image`` (its bin folder)."""
    name = image.rsplit(":", 1)[0]
    venv = REPO / IMAGE_ENVS[name]
    assert (venv / "bin" / "python").exists(), f"{venv} missing: run `make envs`"
    return venv / "bin"


def start_order(model: dict) -> list[str]:
    """Services in dependency order (each after everything it depends on)."""
    specs = model["services"]
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"depends_on cycle: {' -> '.join(path + (name,))}"
        if name in order:
            return
        for dependency in sorted(specs[name].get("depends_on") or {}):
            visit(dependency, path + (name,))
        order.append(name)

    for name in sorted(specs):
        visit(name, ())
    return order


def conditions(model: dict) -> dict[str, set[str]]:
    """For each service, the conditions its dependents wait for."""
    found: dict[str, set[str]] = {name: set() for name in model["services"]}
    for spec in model["services"].values():
        depends = spec.get("depends_on") or {}
        for name, how in (depends.items() if isinstance(depends, dict)
                          else ((d, {}) for d in depends)):
            found[name].add((how or {}).get("condition", "service_started"))
    return found


@dataclass
class Stack:
    """The running stack: its processes, ports and folders; ``close()`` ends them all."""

    model: dict
    root: Path
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    volumes: dict[str, Path] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)
    resolved: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    exits: ExitStack = field(default_factory=ExitStack)
    timeline: dict[str, tuple[float, float]] = field(default_factory=dict)  # started, ready

    def __post_init__(self) -> None:
        self.services = services(self.model)
        for name, service in self.services.items():
            for port in service.expose:
                self.ports[(name, port)] = free_port()
        for name in self.model.get("volumes") or {}:
            self.volumes[name] = self.root / "volumes" / name
            self.volumes[name].mkdir(parents=True)

    def url(self, service: str, port: int, path: str = "") -> str:
        return f"http://127.0.0.1:{self.ports[(service, port)]}{path}"

    def log(self, service: str) -> str:
        path = self.root / f"{service}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- mapping compose's view onto this machine ---------------------------------------

    def _mounts(self, name: str) -> dict[str, Path]:
        mounts = dict(self.services[name].binds)
        for volume in self.model["services"][name].get("volumes") or ():
            source, target = _volume_parts(volume)
            if source in self.volumes:
                mounts[target] = self.volumes[source]
        return mounts

    def _map(self, text: str, name: str) -> str:
        for (service, port), local in self.ports.items():
            text = text.replace(f"{service}:{port}", f"127.0.0.1:{local}")
            if service == name:  # its own port, as its healthcheck reaches it
                text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{local}")
                text = text.replace(f"localhost:{port}", f"127.0.0.1:{local}")
        text = text.replace("0.0.0.0", "127.0.0.1")
        for target, source in sorted(self._mounts(name).items(), key=lambda m: -len(m[0])):
            if text == target or text.startswith(target + "/"):
                text = str(source) + text[len(target):]
        ports = {str(port): str(local) for (_, port), local in self.ports.items()}
        return ports.get(text, text)

    def resolve(self, name: str) -> tuple[list[str], dict[str, str]]:
        """The service's argv and environment, mapped onto this machine."""
        service = self.services[name]
        bin_dir = image_env(service.image)
        home = self.root / "home" / name
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               "HOME": str(home), "LANG": "C.UTF-8", "TMPDIR": str(self.root / "tmp"),
               # What the images set themselves: Airflow's and Prefect's homes.
               "AIRFLOW_HOME": str(home / "airflow"), "PREFECT_HOME": str(home / "prefect")}
        (self.root / "tmp").mkdir(exist_ok=True)
        # This machine's facts, not the service's: BLAS settings some CPUs here need.
        env.update({k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")})
        env.update({key: self._map(value, name) for key, value in service.environment.items()})
        argv = [self._map(arg, name) for arg in service.argv]
        if (bin_dir / argv[0]).exists():
            argv[0] = str(bin_dir / argv[0])
        return argv, env

    # -- running ------------------------------------------------------------------------

    def start(self) -> None:
        """Start every service once its dependencies are ready, independent ones side by
        side (as compose does); bounded by READY_TIMEOUT / INIT_TIMEOUT per service."""
        waits = conditions(self.model)
        depends = {name: set(spec.get("depends_on") or ()) for name, spec
                   in self.model["services"].items()}
        ready: set[str] = set()
        starting: dict[str, float] = {}
        begin = time.monotonic()
        while len(ready) < len(depends):
            for name in start_order(self.model):
                if name not in ready and name not in starting and depends[name] <= ready:
                    starting[name] = time.monotonic()
                    self._launch(name)
            for name, since in list(starting.items()):
                if self._ready(name, waits[name], since):
                    del starting[name]
                    ready.add(name)
                    self.timeline[name] = (since - begin, time.monotonic() - begin)
            time.sleep(0.2)

    def _launch(self, name: str) -> None:
        if name == "postgres":
            self._start_postgres()
            return
        argv, env = self.resolve(name)
        self.resolved[name] = (argv, env)
        log = open(self.root / f"{name}.log", "wb")
        self.exits.callback(log.close)
        self.procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=env["HOME"],
                                            start_new_session=True)

    def _ready(self, name: str, waits: set[str], since: float) -> bool:
        """Whether what its dependents wait for has happened (AssertionError past the
        bound, or when a service exits early or badly)."""
        if name == "postgres":
            return True
        proc = self.procs[name]
        if "service_completed_successfully" in waits:
            code = proc.poll()
            assert code in (None, 0), f"{name} exited {code}: {self.log(name)[-3000:]}"
            assert time.monotonic() - since < INIT_TIMEOUT, f"{name} still running: " \
                + self.log(name)[-3000:]
            return code == 0
        code = proc.poll()
        assert code is None, f"{name} exited {code}: {self.log(name)[-3000:]}"
        assert time.monotonic() - since < READY_TIMEOUT, \
            f"{name} not ready in {READY_TIMEOUT} s: {self.log(name)[-3000:]}"
        if "service_healthy" in waits:
            return self._healthy(name)
        return all(_accepts(self.ports[(name, port)]) for port in self.services[name].expose)

    def _start_postgres(self) -> None:
        env = self.services["postgres"].environment
        port = self.ports[("postgres", 5432)]
        cluster = self.exits.enter_context(private_cluster(
            superuser=env["POSTGRES_USER"], password=env["POSTGRES_PASSWORD"], port=port))
        init = self._mounts("postgres")
        for target, source in sorted(init.items()):
            if target.startswith("/docker-entrypoint-initdb.d/") and target.endswith(".sql"):
                psql(cluster.url, "-f", str(source))

    def _healthy(self, name: str) -> bool:
        test = self.model["services"][name]["healthcheck"]["test"]
        argv, env = self.resolved[name]
        if test[0] == "CMD-SHELL":
            command = ["sh", "-c", self._map(test[1], name)]
        else:
            command = [self._map(part, name) for part in test[1:]]
        done = subprocess.run(command, env=env, capture_output=True, timeout=30)
        return done.returncode == 0

    def close(self) -> None:
        """Stop the services in reverse start order, as compose does (dependents first, so
        none sees its dependencies vanish): SIGTERM each one's process tree and session
        (leases are the spot cloud's children), SIGKILL what outlives STOP_TIMEOUT; then
        PostgreSQL."""
        for name in reversed(list(self.procs)):
            stop_tree(self.procs[name].pid, STOP_TIMEOUT)
        self.exits.close()


def _volume_parts(volume) -> tuple[str, str]:
    if isinstance(volume, dict):
        return str(volume.get("source", "")), volume["target"]
    parts = volume.split(":")
    return parts[0], parts[1]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def describe(stack: Stack) -> str:
    """Each service's mapped command line, for a failure message."""
    return "\n".join(f"{name}: {shlex.join(argv)}" for name, (argv, _) in stack.resolved.items())
