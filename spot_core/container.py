"""Run a step in a container image: ``python -m spot_core.container --image IMG -- CMD``.

Providers that launch processes (the local spot cloud, an EC2 instance's user-data) run
a job given as an image + command through this shim, as the child of ``spot-pipelines
watch``. It runs ``docker run`` as its child and passes on the signals the watcher sends
(SIGTERM first): the Docker CLI proxies them to the container (``--sig-proxy`` is
Docker's default without a TTY), so the step's Checkpointer makes its emergency save
inside the container exactly as it would outside. The shim ends with the container's
exit code (143 after a preemption) and then removes the container. It does not use
``--rm``: with ``--rm`` the CLI asks the engine to wait for the removal, and podman's
Docker API before 4.6 (Debian 12 ships 4.3) answers that wait with exit code 0 whatever
the step returned (containers/podman#18889), which would turn a preempted or failed step
into a success.

What the step needs is handed over without copying a value onto the command line (where
``ps`` and cloud-init logs would show it): every ``SPOT_*`` attempt variable, the AWS
SDK's credential, region and endpoint variables that are set (a step outside a container
would see them too; on an instance they are usually unset and the step reaches the
instance profile through IMDS) and every name given with ``--env`` go as ``-e NAME``
(Docker reads the value from this process's environment). The notice file the watcher
writes and a ``file://`` checkpoint folder are bind-mounted at the same paths, so the
URIs in those variables stay valid. The step runs as the user that runs this shim
(``--user UID:GID``), as a step without an image would: the watcher writes its notice
file readable by its owner alone, and a ``file://`` store is a host folder the step
writes, so an image's own user (the step image's UID 50000) could use neither; the
image's USER still applies when you run it yourself. The host network gives the step
the instance metadata service (IMDSv2, hop limit 2) and, in tests, the local metadata
emulator. ``--init`` puts an init in front of the step: it forwards the engine's SIGTERM
and reaps what the step leaves.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

from spot_core import attempt_env
from spot_core.errors import ConfigError

DOCKER = "docker"
# The AWS SDK's own variables, passed on by name when set (never their values).
AWS_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)
DOCKER_INFO_TIMEOUT_SECONDS = 10.0
REMOVE_TIMEOUT_SECONDS = 60.0
# What a watcher or an init may send the step; each goes on to the CLI, then the container.
FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def wrap(
    image: str, command: Sequence[str], env_names: Sequence[str], *, python: str = sys.executable
) -> tuple[str, ...]:
    """The command a provider launches for ``image`` + ``command`` (runs this shim)."""
    check_image(image)
    names = [arg for name in sorted(set(env_names)) for arg in ("--env", name)]
    return (python, "-m", "spot_core.container", "--image", image, *names, "--", *command)


def check_image(image: object) -> str:
    """Refuse what is not an image reference before it reaches ``docker run``: a leading
    '-' would be read as a flag (``-v/:/host``, ``--privileged``), whitespace or control
    characters as more words."""
    if (
        not isinstance(image, str)
        or not image
        or image.startswith("-")
        or any(c.isspace() or not c.isprintable() for c in image)
    ):
        shown = image if isinstance(image, str) and image.isprintable() else repr(image)
        raise ConfigError(
            f"container image {shown[:100]!r} is not an image reference (empty, "
            "a leading '-', whitespace or control characters); pass one like "
            "'ghcr.io/acme/train:1.4'"
        )
    return image


def docker_argv(
    image: str,
    command: Sequence[str],
    environ: Mapping[str, str],
    env_names: Sequence[str] = (),
    name: str | None = None,
) -> list[str]:
    """``docker run`` for one attempt, as container ``name``; values stay in ``environ``,
    never on the line."""
    check_image(image)
    names = sorted({n for n in environ if n.startswith("SPOT_") or n in AWS_ENV} | set(env_names))
    argv = [DOCKER, "run", "--name", name or container_name(), "--init", "--network", "host"]
    for name in names:
        argv += ["-e", name]
    for folder in _mounts(environ):
        argv += ["-v", f"{folder}:{folder}"]
    argv += ["--user", f"{os.getuid()}:{os.getgid()}"]
    return [*argv, image, *command]


def container_name() -> str:
    return f"spot-step-{uuid.uuid4().hex[:16]}"


def run_container(argv: Sequence[str], name: str) -> int:
    """Run the docker CLI as a child, pass on the signals this process gets, remove the
    container once the CLI returns; the container's exit code (128 + N if the CLI died of
    signal N)."""
    child = subprocess.Popen(list(argv))
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, lambda received, _frame: child.send_signal(received))
    code = child.wait()
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    try:  # also stops it, should the CLI have died before the container
        subprocess.run(
            [DOCKER, "rm", "--force", name], capture_output=True, timeout=REMOVE_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired:
        print(
            f"spot-pipelines: 'docker rm {name}' did not answer in "
            f"{REMOVE_TIMEOUT_SECONDS:g} s; the container may be left",
            file=sys.stderr,
        )
    return code if code >= 0 else 128 - code


def _mounts(environ: Mapping[str, str]) -> list[str]:
    """Host folders the step must see at the same path: the notice file's, a file:// store."""
    folders = set()
    notice = environ.get(attempt_env.NOTICE_FILE)
    if notice:
        folders.add(str(Path(notice).resolve().parent))
    store = _store_folder(environ)
    if store is not None:
        folders.add(store)
    return sorted(folders)


def _store_folder(environ: Mapping[str, str]) -> str | None:
    """The host folder of a ``file://`` (or plain path) checkpoint store, if any."""
    uri = environ.get(attempt_env.CHECKPOINT_URI, "")
    if uri.startswith("file://"):
        return str(Path(unquote(urlparse(uri).path)).resolve())
    if uri and "://" not in uri:
        return str(Path(uri).resolve())
    return None


def require_engine(timeout: float = DOCKER_INFO_TIMEOUT_SECONDS) -> None:
    """Raise a one-line ConfigError unless a Docker engine answers on this machine."""
    if shutil.which(DOCKER) is None:
        raise ConfigError(
            "image= needs Docker on the machine that runs the step, and no "
            "'docker' is on PATH; install Docker or drop image= and run a command"
        )
    try:
        done = subprocess.run(
            [DOCKER, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"image= needs a Docker engine, and 'docker info' did not answer in "
            f"{timeout:g} s; start the engine or drop image="
        ) from None
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(
            "image= needs a Docker engine, and 'docker info' failed ("
            f"{reason[-1] if reason else 'no output'}); start the engine or "
            "drop image="
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spot_core.container")
    parser.add_argument("--image", required=True)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME",
        help="pass this variable of the environment into the container",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    name = container_name()
    try:
        argv_ = docker_argv(args.image, command, os.environ, args.env, name=name)
    except ConfigError as exc:
        parser.error(str(exc))  # one line, exit 2
    if shutil.which(DOCKER) is None:
        print("spot-pipelines: no 'docker' on PATH; the image's step cannot start", file=sys.stderr)
        return 127
    return run_container(argv_, name)


if __name__ == "__main__":
    sys.exit(main())
