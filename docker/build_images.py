"""`make images`: the step, Airflow and Prefect images, with the engine this machine has.

    python3 docker/build_images.py [--uv PATH] [--engine docker|podman|buildah]

Builds ``localhost/spot-pipelines-{step,airflow,prefect}:dev`` from ``docker/*/Dockerfile``
with docker (a Docker daemon that answers), else podman, else buildah. The Dockerfiles take
their bases as build arguments (``PYTHON_IMAGE``, ``AIRFLOW_IMAGE``, ``PREFECT_IMAGE``)
defaulting to the official images at exact versions; compose's third-party images
(``POSTGRES_IMAGE``, ``MOTO_IMAGE``) are prepared alongside. A base given in the
environment is used as given. Otherwise the official image is used when it is here or can
be pulled; where it cannot (no registry reachable), a *stand-in* is built once from
Debian packages (``mmdebstrap --variant=minbase``) and PyPI, with the engine's version
pinned by ``uv.lock`` (``docker/standins/``), named
``localhost/spot-pipelines-standin/NAME:TAG`` and labelled ``io.spot-pipelines.stand-in-for``;
one line says so.

Every build is skipped when its inputs are unchanged: each image carries the SHA-256 of
what went into it (its Dockerfile, the files it copies, its build arguments and its base's
image id) in the label ``io.spot-pipelines.inputs-sha256``, so a second run costs seconds
and the engine's storage is the cache between runs. A machine behind a TLS-inspecting
proxy passes its CA bundle to the builds as the secret ``ca-bundle`` (taken from
``$PIP_CERT``, ``$SSL_CERT_FILE`` or ``$REQUESTS_CA_BUNDLE``); no layer keeps it.

podman and buildah build with a ``containers.conf`` of their own (``CONTAINERS_CONF``, for
the run; the machine's ``/etc/containers`` is left alone): ulimits within the machine's
hard limits, cgroupfs without systemd, and an OCI runtime that runs a container here. The
engine's default is tried first, then runc: crun, podman's default, refuses machines
whose cgroups v1 and v2 are mounted together ("cgroups in hybrid mode not supported").
A ``CONTAINERS_CONF`` in the environment is used as given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
STANDINS = DOCKER / "standins"
TAG = "dev"
INPUTS_LABEL = "io.spot-pipelines.inputs-sha256"
STANDIN_LABEL = "io.spot-pipelines.stand-in-for"
STANDIN_REPO = "localhost/spot-pipelines-standin"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRRORS = (
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE} main",
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {DEBIAN_SUITE}-security main",
)
# Slim roots: no documentation, manual pages or translations.
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
CA_ENV = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
IMAGE_FORMAT = "docker"  # podman/buildah: OCI image configs have no HEALTHCHECK
# The OCI runtimes tried, in order: the engine's default (None), then runc.
RUNTIMES: tuple[str | None, ...] = (None, "runc")
PROBE_TIMEOUT_SECONDS = 60
# What a probe container mounts from the host to run its `true` (read-only).
PROBE_MOUNTS = ("/usr", "/bin", "/lib", "/lib64")
NOFILE_CAP = 1048576
# runc refused nproc 65536 under a hard limit of 96367 on CI's machines, and took 32768.
NPROC_CAP = 32768
PULL_TIMEOUT_SECONDS = 600
BUILD_TIMEOUT_SECONDS = 1800
ENGINE_TIMEOUT_SECONDS = 60


class BuildError(Exception):
    """One line for the user: what failed and what to do."""


# -- what is built -------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    """One of the project's images."""

    name: str  # step, airflow, prefect
    bases: tuple[str, ...]  # the build arguments naming its bases

    @property
    def dockerfile(self) -> Path:
        return DOCKER / self.name / "Dockerfile"

    @property
    def ref(self) -> str:
        return f"localhost/spot-pipelines-{self.name}:{TAG}"


IMAGES = (
    Image("step", ("PYTHON_IMAGE",)),
    Image("airflow", ("PYTHON_IMAGE", "AIRFLOW_IMAGE")),
    Image("prefect", ("PYTHON_IMAGE", "PREFECT_IMAGE")),
)


@dataclass(frozen=True)
class StandIn:
    """How to make a stand-in for an official image that cannot be pulled."""

    dockerfile: str  # in docker/standins
    files: tuple[str, ...] = ()  # more files of docker/standins in its context
    rootfs: tuple[str, ...] = ()  # Debian packages of a rootfs made by mmdebstrap
    base: str | None = None  # the build argument of the stand-in it starts from
    version_arg: tuple[str, str] | None = None  # (build argument, uv.lock package)
    uv_export: tuple[str, ...] = ()  # uv export options of its constraints.txt
    says: str = ""  # what it is, for its description label


STANDIN_OF = {
    "PYTHON_IMAGE": StandIn(
        "python.Dockerfile",
        rootfs=("python3", "python3-venv", "ca-certificates"),
        says="Debian bookworm's python3 in a virtual environment",
    ),
    "AIRFLOW_IMAGE": StandIn(
        "airflow.Dockerfile",
        ("airflow-entrypoint.sh",),
        base="PYTHON_IMAGE",
        version_arg=("AIRFLOW_VERSION", "apache-airflow"),
        uv_export=(
            "--extra",
            "airflow",
            "--extra",
            "aws",
            "--extra",
            "kubernetes",
            "--group",
            "test",
        ),
        says="apache-airflow, its amazon and cncf-kubernetes "
        "providers and psycopg2 from PyPI, pinned by uv.lock",
    ),
    "PREFECT_IMAGE": StandIn(
        "prefect.Dockerfile",
        ("prefect-entrypoint.sh",),
        base="PYTHON_IMAGE",
        version_arg=("PREFECT_VERSION", "prefect"),
        uv_export=(
            "--extra",
            "prefect",
            "--extra",
            "aws",
            "--extra",
            "kubernetes",
            "--group",
            "test",
        ),
        says="prefect from PyPI, pinned by uv.lock",
    ),
    "MOTO_IMAGE": StandIn(
        "moto.Dockerfile",
        base="PYTHON_IMAGE",
        version_arg=("MOTO_VERSION", "moto"),
        uv_export=("--extra", "aws", "--group", "test"),
        says="moto[server] from PyPI, pinned by uv.lock",
    ),
    "POSTGRES_IMAGE": StandIn(
        "postgres.Dockerfile",
        ("postgres-entrypoint.sh",),
        rootfs=("postgresql", "postgresql-client"),
        says="Debian bookworm's PostgreSQL (bookworm ships major 15)",
    ),
}
COMPOSE_BASES = ("POSTGRES_IMAGE", "MOTO_IMAGE")


def official_defaults() -> dict[str, str]:
    """Each base's default: the ``ARG NAME=...`` of the Dockerfiles, ``${NAME:-...}`` of
    compose.yaml (one place says each version)."""
    found: dict[str, str] = {}
    for image in IMAGES:
        for name, value in re.findall(
            r"^ARG (\w+_IMAGE)=(\S+)$", image.dockerfile.read_text(), re.M
        ):
            if found.setdefault(name, value) != value:
                raise BuildError(
                    f"{name} defaults to {found[name]} and to {value} in "
                    f"{image.dockerfile.relative_to(REPO)}: make them one"
                )
    compose = (DOCKER / "compose.yaml").read_text()
    for name in COMPOSE_BASES:
        match = re.search(r"\$\{" + re.escape(name) + r":-([^}]+)\}", compose)
        if match is None:
            raise BuildError(f"docker/compose.yaml names no ${{{name}:-...}} image")
        found[name] = match.group(1)
    return found


def locked_version(package: str) -> str:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    return next(p["version"] for p in lock["package"] if p["name"] == package)


def standin_ref(official: str) -> str:
    """``docker.io/apache/airflow:3.3.2-python3.11`` ->
    ``localhost/spot-pipelines-standin/airflow:3.3.2-python3.11``. (The official names
    are written in full: podman resolves a short name like ``python:TAG`` against local
    images by suffix, so it would take a stand-in for the official image.)"""
    path, _, tag = official.rpartition(":")
    return f"{STANDIN_REPO}/{path.rsplit('/', 1)[-1]}:{tag}"


# -- the engine ------------------------------------------------------------------------------


@dataclass
class Engine:
    """docker, podman or buildah, through its command line."""

    program: str
    environ: dict[str, str] = field(default_factory=dict)  # CONTAINERS_CONF (podman, buildah)

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.environ}

    def configure(self, workdir: Path) -> str | None:
        """Point podman or buildah at a containers.conf of ours in ``workdir`` (not for
        docker, nor when the environment names one); a line when the runtime is not the
        engine's default."""
        if self.program == "docker" or os.environ.get("CONTAINERS_CONF"):
            return None
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "containers.conf"
        note = containers_conf(self.program, conf)
        self.environ["CONTAINERS_CONF"] = str(conf)
        return note

    def run(
        self,
        *args: str,
        timeout: float = ENGINE_TIMEOUT_SECONDS,
        check: bool = True,
        quiet: bool = True,
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [self.program, *args],
            text=True,
            timeout=timeout,
            capture_output=quiet,
            env=self.env(),
        )
        if check and done.returncode != 0:
            tail = (done.stderr or done.stdout or "").strip().splitlines() if quiet else []
            raise BuildError(f"{self.program} {args[0]} failed" + (f": {tail[-1]}" if tail else ""))
        return done

    def inspect(self, ref: str) -> dict | None:
        """{"id", "labels"} of a local image, or None."""
        if self.program == "buildah":
            done = self.run("inspect", "--type", "image", ref, check=False)
        else:
            done = self.run("image", "inspect", ref, check=False)
        if done.returncode != 0:
            return None
        data = json.loads(done.stdout)
        data = data[0] if isinstance(data, list) else data
        if self.program == "buildah":
            config = (data.get("OCIv1") or {}).get("config") or {}
            return {"id": data.get("FromImageID", ""), "labels": config.get("Labels") or {}}
        labels = data.get("Labels") or (data.get("Config") or {}).get("Labels") or {}
        return {"id": data.get("Id", ""), "labels": labels}

    def pull(self, ref: str) -> str | None:
        """None when pulled, else the engine's reason (one line)."""
        done = self.run("pull", ref, check=False, timeout=PULL_TIMEOUT_SECONDS)
        if done.returncode == 0:
            return None
        lines = (done.stderr or done.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit {done.returncode}"

    def build(
        self,
        dockerfile: Path,
        context: Path,
        ref: str,
        args: dict[str, str],
        labels: dict[str, str],
    ) -> None:
        """Build ``ref``; the image it replaces is removed unless something still uses it."""
        replaced = self.inspect(ref)
        argv = ["bud" if self.program == "buildah" else "build", "-f", str(dockerfile), "-t", ref]
        if self.program != "docker":
            # One layer on the base (the inputs label is the cache); the docker format,
            # since OCI image configs have no HEALTHCHECK (buildah drops it).
            argv += ["--layers=false", "--format", IMAGE_FORMAT]
        for key, value in sorted(args.items()):
            argv += ["--build-arg", f"{key}={value}"]
        for key, value in sorted(labels.items()):
            argv += ["--label", f"{key}={value}"]
        ca = ca_bundle()
        if ca is not None:
            argv += ["--secret", f"id=ca-bundle,src={ca}"]
        argv.append(str(context))
        env = {**self.env(), "DOCKER_BUILDKIT": "1"}
        done = subprocess.run(
            [self.program, *argv],
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-6000:])
            raise BuildError(f"building {ref} from {_shown(dockerfile)} failed (the output above)")
        if replaced is not None and replaced["id"] and replaced["id"] != self.inspect(ref)["id"]:
            self.run("rmi", replaced["id"], check=False)  # refused while in use or tagged


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def detect_engine(wanted: str | None) -> Engine:
    if wanted:
        if shutil.which(wanted) is None:
            raise BuildError(f"--engine {wanted}: no '{wanted}' on PATH")
        return Engine(wanted)
    if shutil.which("docker") and _docker_daemon():
        return Engine("docker")
    for program in ("podman", "buildah"):
        if shutil.which(program):
            return Engine(program)
    raise BuildError(
        "make images needs a container engine: a running Docker, or podman or "
        "buildah (Debian/Ubuntu: apt-get install podman buildah)"
    )


def _docker_daemon() -> bool:
    """A Docker daemon answers (not podman's Docker API: then podman itself builds)."""
    try:
        done = subprocess.run(
            ["docker", "version", "--format", "{{json .Server}}"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and "podman" not in done.stdout.lower()


# -- the OCI runtime ---------------------------------------------------------------------------


def containers_conf(program: str, path: Path) -> str | None:
    """Write a containers.conf at ``path`` with the first runtime of ``RUNTIMES`` under
    which ``program`` runs a container; a line saying why when it is not the default. One
    line naming the fix (BuildError) when none runs."""
    tried = []
    for runtime in RUNTIMES:
        write_containers_conf(path, runtime)
        reason = container_fails(program, path)
        if reason is None:
            return f"{program} runs containers with {runtime} ({tried[0]})" if tried else None
        tried.append(f"{runtime or 'its default runtime'}: {reason}")
    raise BuildError(
        f"{program} cannot run a container here ({'; '.join(tried)}): install runc "
        "(Debian/Ubuntu: apt-get install runc), or name a containers.conf whose runtime "
        "works in CONTAINERS_CONF"
    )


def write_containers_conf(path: Path, runtime: str | None) -> Path:
    """ulimits within the hard limits (as root podman asks for nofile=1048576, and the
    runtime fails "error setting rlimits" where the machine allows less); cgroupfs and
    events in a file where systemd is not PID 1; ``runtime`` unless it is the default."""
    nofile = _limit(resource.getrlimit(resource.RLIMIT_NOFILE)[1], NOFILE_CAP)
    nproc = _limit(resource.getrlimit(resource.RLIMIT_NPROC)[1], NPROC_CAP)
    limits = [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]
    engine = ['events_logger = "file"']
    if not Path("/run/systemd/system").is_dir():
        engine.append('cgroup_manager = "cgroupfs"')
    if runtime is not None:
        engine.append(f"runtime = {json.dumps(runtime)}")
    path.write_text(
        f"[containers]\ndefault_ulimits = {json.dumps(limits)}\n\n[engine]\n"
        + "\n".join(engine)
        + "\n"
    )
    return path


def _limit(value: int, cap: int) -> int:
    return cap if value == resource.RLIM_INFINITY else min(value, cap)


def container_fails(program: str, conf: Path) -> str | None:
    """None when ``program`` runs a container under ``conf`` (the host's ``true`` in an
    empty root with the host's /usr mounted read-only: no image needed); else the
    engine's reason, one line."""
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    true = os.path.realpath(shutil.which("true") or "/bin/true")
    mounts = [a for p in PROBE_MOUNTS if os.path.exists(p) for a in ("-v", f"{p}:{p}:ro")]
    if program == "podman":
        with tempfile.TemporaryDirectory(prefix="spot-runtime-probe-") as root:
            argv = ["podman", "run", "--rm", "--network", "none", *mounts, "--rootfs", root, true]
            return _failure(argv, env)
    name = f"spot-runtime-probe-{uuid.uuid4().hex[:12]}"
    try:
        return _failure(["buildah", "from", "--name", name, "scratch"], env) or _failure(
            ["buildah", "run", "--network", "none", *mounts, name, true], env
        )
    finally:
        _failure(["buildah", "rm", name], env)


def _failure(argv: list[str], env: dict[str, str]) -> str | None:
    """None when ``argv`` exits 0, else why: its first error line (the runtime's own)."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_SECONDS, env=env
        )
    except subprocess.TimeoutExpired:
        return f"{' '.join(argv[:2])} did not end in {PROBE_TIMEOUT_SECONDS} s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and "level=warn" not in line]
    line = (errors or lines or [f"{' '.join(argv[:2])} exited {done.returncode}"])[0]
    return line.removeprefix("Error: ")


def ca_bundle() -> str | None:
    for name in CA_ENV:
        path = os.environ.get(name)
        if path and Path(path).is_file():
            return path
    return None


# -- inputs ------------------------------------------------------------------------------------


def digest(*parts: object) -> str:
    sha = hashlib.sha256()
    for part in parts:
        sha.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True).encode())
        sha.update(b"\0")
    return sha.hexdigest()


def tree_digest(paths: list[Path]) -> str:
    """The files under ``paths`` (names and bytes), less Python caches."""
    sha = hashlib.sha256()
    for root in paths:
        files = (
            [root]
            if root.is_file()
            else sorted(
                p
                for p in root.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            )
        )
        for path in files:
            sha.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


def copied_sources(dockerfile: Path) -> list[Path]:
    """What the Dockerfile's ``COPY`` lines take from the build context (not ``--from``)."""
    sources = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        sources += [REPO / src for src in args[:-1]]
    return sources


# -- stand-ins ---------------------------------------------------------------------------------


@dataclass
class Bases:
    """The image each base build argument resolves to, and what was made on the way."""

    engine: Engine
    uv: str
    refs: dict[str, str] = field(default_factory=dict)
    standins: list[str] = field(default_factory=list)
    unreachable: str | None = None  # why the registry could not be reached, once known

    def resolve(self, name: str, official: str) -> str:
        if name in self.refs:
            return self.refs[name]
        given = os.environ.get(name)
        if given:
            ref = given
        elif self.engine.inspect(official) is not None:
            ref = official
        elif self.unreachable is None and (reason := self.engine.pull(official)) is None:
            ref = official
        else:
            self.unreachable = self.unreachable or ": ".join(reason.split(": ")[-2:])
            ref = self._standin(name, official)
            self.standins.append(official)
        self.refs[name] = ref
        return ref

    def _standin(self, name: str, official: str) -> str:
        spec = STANDIN_OF[name]
        ref = standin_ref(official)
        args: dict[str, str] = {}
        if spec.base is not None:
            args[spec.base] = self.resolve(spec.base, official_defaults()[spec.base])
        if spec.version_arg is not None:
            args[spec.version_arg[0]] = locked_version(spec.version_arg[1])
        constraints = self._constraints(spec.uv_export) if spec.uv_export else ""
        dockerfile = STANDINS / spec.dockerfile
        base_id = self.engine.inspect(args[spec.base])["id"] if spec.base else ""
        inputs = digest(
            dockerfile.read_bytes(),
            [(f, (STANDINS / f).read_bytes().hex()) for f in spec.files],
            constraints,
            args,
            base_id,
            spec.rootfs,
            DEBIAN_MIRRORS,
        )
        found = self.engine.inspect(ref)
        if found is not None and found["labels"].get(INPUTS_LABEL) == inputs:
            return ref
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="spot-standin-") as tmp:
            context = Path(tmp)
            for name_ in spec.files:
                shutil.copy2(STANDINS / name_, context / name_)
            if constraints:
                (context / "constraints.txt").write_text(constraints)
            if spec.rootfs:
                _mmdebstrap(spec.rootfs, context / "rootfs.tar")
            labels = {
                INPUTS_LABEL: inputs,
                STANDIN_LABEL: official,
                "org.opencontainers.image.description": (
                    f"Stand-in for {official}, made by make images because it could "
                    f"not be pulled: {spec.says}"
                ),
            }
            self.engine.build(dockerfile, context, ref, args, labels)
        print(f"  stand-in {ref} built in {time.monotonic() - began:.0f} s")
        return ref

    def _constraints(self, options: tuple[str, ...]) -> str:
        """uv.lock's pins for ``options``, without this workspace's own packages: the test
        group names the emulators (emulators/), an editable line pip refuses as a constraint."""
        done = subprocess.run(
            [
                self.uv,
                "export",
                "--frozen",
                "--no-hashes",
                "--no-emit-workspace",
                "--no-header",
                *options,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        if done.returncode != 0:
            raise BuildError(f"uv export failed: {done.stderr.strip().splitlines()[-1:]}")
        return done.stdout


def _mmdebstrap(packages: tuple[str, ...], out: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise BuildError(
            "stand-in bases are made with mmdebstrap: install it (Debian/Ubuntu: "
            "apt-get install mmdebstrap), or give the bases as PYTHON_IMAGE=... "
            "AIRFLOW_IMAGE=... PREFECT_IMAGE=... POSTGRES_IMAGE=... MOTO_IMAGE=..."
        )
    argv = [
        "mmdebstrap",
        "--quiet",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        *[f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES],
        DEBIAN_SUITE,
        str(out),
        *DEBIAN_MIRRORS,
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()
        raise BuildError(f"mmdebstrap failed: {tail[-1] if tail else done.returncode}")


# -- the project's images ----------------------------------------------------------------------


def build_image(engine: Engine, bases: Bases, image: Image, defaults: dict[str, str]) -> str:
    """Build ``image`` unless its inputs label says it is current; a line for the report."""
    args = {name: bases.resolve(name, defaults[name]) for name in image.bases}
    base_ids = {name: (engine.inspect(ref) or {}).get("id", "") for name, ref in args.items()}
    inputs = digest(
        image.dockerfile.read_bytes(),
        tree_digest(copied_sources(image.dockerfile)),
        args,
        base_ids,
        IMAGE_FORMAT,
    )
    found = engine.inspect(image.ref)
    if found is not None and found["labels"].get(INPUTS_LABEL) == inputs:
        return f"{image.ref}: up to date"
    began = time.monotonic()
    labels = {
        INPUTS_LABEL: inputs,
        "io.spot-pipelines.bases": " ".join(f"{k}={v}" for k, v in sorted(args.items())),
    }
    engine.build(image.dockerfile, REPO, image.ref, args, labels)
    return f"{image.ref}: built in {time.monotonic() - began:.0f} s"


def build(
    engine_name: str | None = None, uv: str | None = None, only: list[str] | None = None
) -> tuple[Bases, list[str]]:
    """Build what is not current; the bases used (compose's too) and one line per image."""
    engine = detect_engine(engine_name)
    defaults = official_defaults()
    bases = Bases(engine, uv or str(REPO / ".venv-tools" / "bin" / "uv"))
    wanted = [i for i in IMAGES if not only or i.name in only]
    with tempfile.TemporaryDirectory(prefix="spot-engine-") as workdir:
        note = engine.configure(Path(workdir))
        lines = [build_image(engine, bases, image, defaults) for image in wanted]
        if not only:
            for name in COMPOSE_BASES:
                bases.resolve(name, defaults[name])
    if note is not None:
        lines.insert(0, note)
    if bases.standins:
        lines.insert(
            0,
            f"stand-in bases ({bases.unreachable}): {', '.join(bases.standins)} "
            f"cannot be pulled, so {STANDIN_REPO}/... stand in, made from Debian "
            f"packages and PyPI pinned by uv.lock and labelled {STANDIN_LABEL}",
        )
    return bases, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make images", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--uv", default=None, help="the uv that exports constraints from uv.lock for stand-ins"
    )
    parser.add_argument("--engine", choices=("docker", "podman", "buildah"), default=None)
    parser.add_argument(
        "--only",
        choices=[i.name for i in IMAGES],
        action="append",
        help="build only this image (repeatable)",
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    try:
        bases, lines = build(args.engine, args.uv, args.only)
    except BuildError as exc:
        print(f"make images: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    print(f"make images ({bases.engine.program}): {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
