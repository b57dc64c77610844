"""Run a step in a container image: ``python -m spot_core.container --image IMG -- CMD``.

Providers that launch processes (the local spot cloud, an EC2 instance's user-data) run
a job given as an image + command through this shim, as the child of ``spot-pipelines
watch``. It is exec'd into ``docker run`` so the watcher's SIGTERM reaches the Docker
CLI, which proxies it to the container (``--sig-proxy`` is Docker's default without a
TTY): the step's Checkpointer makes its emergency save inside the container exactly as
it would outside.

What the step needs is handed over without copying a value onto the command line (where
``ps`` and cloud-init logs would show it): every ``SPOT_*`` attempt variable and every
name given with ``--env`` go as ``-e NAME`` (Docker reads the value from this process's
environment). The notice file the watcher writes and a ``file://`` checkpoint folder are
bind-mounted at the same paths, so the URIs in those variables stay valid. The host
network gives the step the instance metadata service (IMDSv2, hop limit 2) and, in
tests, the local metadata emulator.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import unquote, urlparse

from spot_core import attempt_env
from spot_core.errors import ConfigError

DOCKER = "docker"
DOCKER_INFO_TIMEOUT_SECONDS = 10.0


def wrap(image: str, command: Sequence[str], env_names: Sequence[str], *,
         python: str = sys.executable) -> tuple[str, ...]:
    """The command a provider launches for ``image`` + ``command`` (runs this shim)."""
    check_image(image)
    names = [arg for name in sorted(set(env_names)) for arg in ("--env", name)]
    return (python, "-m", "spot_core.container", "--image", image, *names, "--", *command)


def check_image(image: object) -> str:
    """Refuse what is not an image reference before it reaches ``docker run``: a leading
    '-' would be read as a flag (``-v/:/host``, ``--privileged``), whitespace or control
    characters as more words."""
    if not isinstance(image, str) or not image or image.startswith("-") \
            or any(c.isspace() or not c.isprintable() for c in image):
        shown = image if isinstance(image, str) and image.isprintable() else repr(image)
        raise ConfigError(f"container image {shown[:100]!r} is not an image reference (empty, "
                          "a leading '-', whitespace or control characters); pass one like "
                          "'ghcr.io/acme/train:1.4'")
    return image


def docker_argv(image: str, command: Sequence[str], environ: Mapping[str, str],
                env_names: Sequence[str] = ()) -> list[str]:
    """``docker run`` for one attempt; values stay in ``environ``, never on the line."""
    check_image(image)
    names = sorted({n for n in environ if n.startswith("SPOT_")} | set(env_names))
    argv = [DOCKER, "run", "--rm", "--init", "--network", "host"]
    for name in names:
        argv += ["-e", name]
    for folder in _mounts(environ):
        argv += ["-v", f"{folder}:{folder}"]
    return [*argv, image, *command]


def _mounts(environ: Mapping[str, str]) -> list[str]:
    """Host folders the step must see at the same path: the notice file's, a file:// store."""
    folders = set()
    notice = environ.get(attempt_env.NOTICE_FILE)
    if notice:
        folders.add(str(Path(notice).resolve().parent))
    uri = environ.get(attempt_env.CHECKPOINT_URI, "")
    if uri.startswith("file://"):
        folders.add(str(Path(unquote(urlparse(uri).path)).resolve()))
    elif uri and "://" not in uri:
        folders.add(str(Path(uri).resolve()))
    return sorted(folders)


def require_engine(timeout: float = DOCKER_INFO_TIMEOUT_SECONDS) -> None:
    """Raise a one-line ConfigError unless a Docker engine answers on this machine."""
    if shutil.which(DOCKER) is None:
        raise ConfigError("image= needs Docker on the machine that runs the step, and no "
                          "'docker' is on PATH; install Docker or drop image= and run a command")
    try:
        done = subprocess.run([DOCKER, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"image= needs a Docker engine, and 'docker info' did not answer in "
                          f"{timeout:g} s; start the engine or drop image=") from None
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError("image= needs a Docker engine, and 'docker info' failed ("
                          f"{reason[-1] if reason else 'no output'}); start the engine or "
                          "drop image=")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spot_core.container")
    parser.add_argument("--image", required=True)
    parser.add_argument("--env", action="append", default=[], metavar="NAME",
                        help="pass this variable of the environment into the container")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        argv_ = docker_argv(args.image, command, os.environ, args.env)
    except ConfigError as exc:
        parser.error(str(exc))  # one line, exit 2
    if shutil.which(DOCKER) is None:
        print("spot-pipelines: no 'docker' on PATH; the image's step cannot start",
              file=sys.stderr)
        return 127
    os.execvp(DOCKER, argv_)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
