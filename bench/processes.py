"""What the process benchmarks share: a process tree's CPU, py-spy on it, the PostgreSQL
server the engines' metadata databases live on, and the commit measured.

``bench/scale_prefect.py`` (a real Prefect spot worker) and ``bench/scale_triggerer.py``
(a real ``airflow triggerer``) measure a separate engine process the same way; both run
in either engine environment, so nothing here imports an engine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spot_core.settings import default
from tests.support.process_helpers import stop_process as stop_process  # the tests' own

REPO = Path(__file__).resolve().parents[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process, its live children and its reaped children."""
    import psutil

    proc = psutil.Process(pid)
    times = proc.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in proc.children(recursive=True):
        try:
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
        except psutil.NoSuchProcess:
            pass
    return total


def idle_cpu(pid: int, seconds: float, settle: float) -> float:
    """The process tree's CPU per second with nothing to watch (its own loop, heartbeats
    and queries), ``settle`` seconds after it started."""
    time.sleep(settle)
    cpu0 = cpu_seconds(pid)
    time.sleep(seconds)
    return round((cpu_seconds(pid) - cpu0) / seconds, 4)


def above_idle(report: dict, jobs: int) -> dict:
    """The share of a core per 100 jobs the watching adds to the idle process's own."""
    busy = report["cpu_s"] / report["window_s"] - report["idle_cpu_s_per_s"]
    return {"core_percent_per_100_jobs_above_idle": round(100.0 * busy / jobs * 100, 3)}


def measure_window(pid: int, seconds: float, jobs: int, snapshot) -> tuple[object, object, dict]:
    """``seconds`` of a process watching ``jobs`` leases: ``snapshot()`` (the server's
    counts) before and after, and the process tree's CPU over the window as CPU-seconds
    per job-hour and share of a core per 100 jobs."""
    before, cpu0, wall0 = snapshot(), cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    cpu, wall = cpu_seconds(pid) - cpu0, time.monotonic() - wall0
    after = snapshot()
    job_hours = jobs * wall / 3600.0
    return (
        before,
        after,
        {
            "window_s": round(wall, 1),
            "cpu_s": round(cpu, 2),
            "cpu_s_per_job_hour": round(cpu / job_hours, 4),
            "core_percent_per_100_jobs": round(100.0 * cpu / wall / jobs * 100, 3),
            "rss_mib": round(rss_bytes(pid, children=True) / 2**20, 1),
        },
    )


def rss_bytes(pid: int, children: bool = False) -> int:
    """Resident memory of the process (and, with ``children``, of its live children)."""
    import psutil

    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)] if children else [proc]
    total = 0
    for one in procs:
        try:
            total += one.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def py_spy(pid: int, out: Path, seconds: float = 30.0, subprocesses: bool = False) -> str:
    """``py-spy record`` of ``pid`` into ``out`` as collapsed stacks, if py-spy is installed
    (``pip install py-spy``: not a project dependency). Only the thread holding the GIL is
    sampled (``--gil``): where the process spends Python CPU. py-spy's own idle test
    counts some waiting threads (anyio's worker threads) as busy."""
    binary = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if binary is None:
        return "py-spy not found: pip install py-spy"
    extra = ["--subprocesses"] if subprocesses else []
    done = subprocess.run(
        [
            binary,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "50",
            "--gil",
            "--format",
            "raw",
            *extra,
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    return str(out) if done.returncode == 0 else f"py-spy failed: {done.stderr[-500:]}"


def children() -> list:
    """Every live process this one started (and theirs), to check at the end."""
    import psutil

    return psutil.Process().children(recursive=True)


def count_alive(started: list, report: dict) -> None:
    """Last of a benchmark's cleanup: how many of the processes it started still run."""
    import psutil

    _, alive = psutil.wait_procs(started, timeout=5)
    report["processes_started"] = len(started)
    report["processes_alive_at_end"] = len(alive)


# Each job renews its heartbeat every quarter of heartbeat_timeout (75 s at the 5m
# default). A window that is not a whole number of those periods holds some jobs'
# renewals and not others', so its CPU swings with the phase: 60 s windows of the same
# 200 jobs held 132 to 200 renewals. Two whole periods: 150 s.
WINDOW_SECONDS = 2 * default("heartbeat_timeout") / 4


def add_window_arguments(
    parser, process: str, nothing: str, database: str, idle_seconds: float
) -> None:
    """The options both process benchmarks take: the measured window, the poll interval,
    py-spy after it, the idle measurement before it, and SQLite instead of PostgreSQL."""
    parser.add_argument(
        "--seconds",
        type=float,
        default=WINDOW_SECONDS,
        help="measured window (default: two rounds of heartbeat renewals at "
        "the default heartbeat_timeout, so every job renews the same number "
        "of times in it)",
    )
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help=f"after the window, 30 s of py-spy on the {process} into this file",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=idle_seconds,
        help=f"the {process}'s CPU with {nothing}, measured first (0: skip)",
    )
    parser.add_argument(
        "--sqlite",
        action="store_true",
        help=f"{database} on SQLite even if PostgreSQL is configured",
    )
    parser.add_argument(
        "--driver-beat",
        action="store_true",
        help="the jobs run with heartbeat_uri set: the watching process "
        "renews one heartbeat for all of them instead of one per job",
    )


@contextmanager
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server whose role may create databases: ``$SPOT_TEST_POSTGRES_URL``,
    else a private cluster for the run (initdb + pg_ctl, as the tests start one),
    stopped and removed afterwards."""
    url = os.environ.get("SPOT_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    from tests.support.postgres_helpers import private_cluster

    with private_cluster() as cluster:
        yield cluster.url


@contextmanager
def fresh_database(admin_url: str, prefix: str, driver: str) -> Iterator[str]:
    """A new PostgreSQL database on the server of ``admin_url`` as a SQLAlchemy URL with
    ``driver`` (``postgresql+asyncpg``, ``postgresql+psycopg2``), dropped afterwards."""
    from tests.support.postgres_helpers import fresh_database as fresh
    from tests.support.postgres_helpers import with_driver

    with fresh(admin_url, prefix) as url:
        yield with_driver(url, driver)


def commit() -> str:
    """The short hash of the checkout measured."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=REPO,
        ).stdout.strip()
    except OSError:
        return "unknown"
