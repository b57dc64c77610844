"""A real container engine for the tests: a Docker daemon if one answers, else podman's
Docker-compatible API (``podman system service``) for the real ``docker`` CLI.

podman runs with the ``containers.conf`` that ``make images`` writes (``CONTAINERS_CONF``,
docker/build_images.py; the machine's own files are left alone): ulimits within the
machine's hard limits, cgroupfs and events in a file without systemd, and an OCI runtime
that runs a container here (the default, else runc: crun refuses hybrid cgroups).

podman runs healthchecks from systemd timers, and without systemd nothing runs them
(``podman run`` says "unable to get systemd connection to add healthchecks"): a
``HealthcheckRunner`` does what each timer would, ``podman healthcheck run`` at each
container's interval, so ``depends_on: condition: service_healthy`` means what it says.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.docker_build import build_images

START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 20.0


@dataclass(frozen=True)
class EngineEnv:
    """What a client of the engine needs in its environment."""

    kind: str  # "docker" or "podman"
    environ: dict[str, str]  # DOCKER_HOST (and CONTAINERS_CONF for podman's own CLI)

    def env(self, **more: str) -> dict[str, str]:
        return {**os.environ, **self.environ, **more}

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["podman", *args], capture_output=True, text=True, timeout=timeout, env=self.env()
        )

    def docker(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout, env=self.env()
        )


def docker_daemon() -> bool:
    """A Docker daemon (not podman's API) answers the docker CLI as configured: the same
    question ``make images`` asks before it picks its builder."""
    return shutil.which("docker") is not None and build_images._docker_daemon()


@contextmanager
def podman_service(workdir: Path) -> Iterator[EngineEnv]:
    """``podman system service`` on a socket in ``workdir``, stopped on exit."""
    conf = workdir / "containers.conf"
    note = build_images.containers_conf("podman", conf)
    if note is not None:
        print(f"\n{note}")
    socket = workdir / "podman.sock"
    env = {"CONTAINERS_CONF": str(conf), "DOCKER_HOST": f"unix://{socket}"}
    log = open(workdir / "podman-service.log", "wb")
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket}"],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        engine = EngineEnv("podman", env)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while engine.docker("version", "--format", "{{.Server.Version}}", timeout=30).returncode:
            assert proc.poll() is None, (
                f"podman system service exited {proc.returncode}: {_tail(workdir)}"
            )
            assert time.monotonic() < deadline, (
                f"podman's Docker API did not answer: {_tail(workdir)}"
            )
            time.sleep(0.5)
        yield engine
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _tail(workdir: Path) -> str:
    path = workdir / "podman-service.log"
    return path.read_text(errors="replace")[-2000:] if path.exists() else ""


@dataclass
class HealthcheckRunner:
    """Runs each healthchecked container's check at its interval (podman's systemd timer)
    for containers whose name starts with ``prefix``."""

    engine: EngineEnv
    prefix: str
    tick_seconds: float = 2.0
    _due: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> HealthcheckRunner:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="healthchecks")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=90)

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            now = time.monotonic()
            for name, interval in self._checked_containers().items():
                if self._due.get(name, 0.0) <= now:
                    self._due[name] = now + interval
                    self.engine.podman("healthcheck", "run", name, timeout=120)

    def _checked_containers(self) -> dict[str, float]:
        """Running containers of the project that have a healthcheck: name -> interval (s)."""
        done = self.engine.podman("ps", "--filter", f"name=^{self.prefix}", "--format", "json")
        if done.returncode != 0:
            return {}
        found = {}
        for entry in json.loads(done.stdout or "[]"):
            name = entry["Names"][0]
            if entry.get("State") != "running" or not entry.get("Status", "").endswith(")"):
                continue  # "Up 3 seconds ago (starting)": only healthchecked ones say a state
            inspected = self.engine.podman(
                "inspect", name, "--format", "{{json .Config.Healthcheck}}"
            )
            check = json.loads(inspected.stdout or "null") if inspected.returncode == 0 else None
            if check and check.get("Test"):
                found[name] = max(1.0, (check.get("Interval") or 30e9) / 1e9)
        return found
