"""docker/compose.yaml as a compose implementation resolves it.

``docker compose config`` (the Compose v2 plugin) or, where the docker CLI has none,
Debian's ``docker-compose`` (installed by .ci/run) parses the file, validates it against
the compose specification and interpolates the ``${VAR:-default}`` values; both print
the resolved model, which the tests read instead of the raw file.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"


def compose_command() -> list[str]:
    """The compose implementation on this machine (skip, a failure under CI, if none)."""
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy is not None:
        return [legacy]
    pytest.skip(
        "no compose implementation: install Debian's docker-compose "
        "(apt-get install docker-compose) or the docker compose plugin"
    )


def run_config(
    compose_file: Path = COMPOSE_FILE, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``compose -f FILE config``: exit 0 and the resolved model, or the validation error."""
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    environ.update(env or {})
    return subprocess.run(
        [*compose_command(), "-f", str(compose_file), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        cwd=compose_file.parent,
    )


def resolved_model(compose_file: Path = COMPOSE_FILE, env: dict[str, str] | None = None) -> dict:
    done = run_config(compose_file, env)
    assert done.returncode == 0, f"compose rejected {compose_file.name}: {done.stderr}"
    return yaml.safe_load(done.stdout)


@dataclass(frozen=True)
class Service:
    """One resolved service: what a process needs to run it."""

    name: str
    argv: tuple[str, ...]
    environment: dict[str, str]
    expose: tuple[int, ...]
    binds: dict[str, Path]  # container path -> host path (bind mounts only)
    image: str


def services(model: dict) -> dict[str, Service]:
    """The model's services, each with its entrypoint + command as one argv (the images'
    own entrypoints only pass their command on: `exec "$@"`)."""
    found = {}
    for name, spec in model["services"].items():
        argv = tuple(_as_list(spec.get("entrypoint")) + _as_list(spec.get("command")))
        env = {k: "" if v is None else str(v) for k, v in (spec.get("environment") or {}).items()}
        found[name] = Service(
            name,
            argv,
            env,
            tuple(int(p) for p in spec.get("expose") or ()),
            _binds(spec.get("volumes") or ()),
            spec.get("image", ""),
        )
    return found


def _as_list(value) -> list[str]:
    if value is None:
        return []
    return [str(part) for part in value] if isinstance(value, list) else str(value).split()


def _binds(volumes) -> dict[str, Path]:
    """Host bind mounts, from the short ("HOST:CONTAINER:ro", compose 1) or the long
    ({type: bind, source, target}, compose 2) form."""
    binds = {}
    for volume in volumes:
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                binds[volume["target"]] = Path(volume["source"])
            continue
        source, target = volume.split(":")[:2]
        if source.startswith(("/", ".")):
            binds[target] = Path(source)
    return binds
