"""One real ``airflow triggerer`` with 1,000 deferred spot jobs: calls per poll and CPU.

``python -m bench.scale_triggerer`` (``make bench-scale``, in the Airflow environment)
starts, as separate real processes:

- where the leases live (``--backend``, ``bench/scale_backends.py``): a moto server (EC2
  and S3) recording every request (``ec2``, the default), or the local cloud server
  (``local``: a lease is a real watched process pair on this machine, so a few hundred
  fit, not 1,000; calls counted by the server);
- Airflow 3.3's metadata database on a fresh PostgreSQL database of
  ``$SPOT_TEST_POSTGRES_URL`` or of a private cluster started for the run (SQLite
  with ``--sqlite``), migrated by ``airflow db migrate``;
- a DAG whose one deferrable ``SpotJobOperator`` task is mapped over ``--jobs`` (1,000)
  stores (S3 on the same moto, or folders here), on the backend's provider, serialized by
  ``airflow dags reserialize`` and triggered by ``airflow dags trigger`` (a mapped task, as
  a sweep is: with 1,000 separate tasks Airflow's triggerer deserializes the whole DAG once
  per trigger it loads, which stalled its trigger runner for up to a minute here);
- ONE ``airflow triggerer`` (its capacity: every job).

The triggerer starts first and its idle CPU (nothing to run) is measured for
``--idle-seconds``. Then each task instance is deferred as a deferring task leaves it: its
lease launched by the provider (``Ec2Provider.launch``: RunInstances with user-data, tags
and spot options; ``LocalProvider.launch``: an on-demand lease, so nothing is reclaimed in
the window; the job's first heartbeat in its store), a trigger row holding the
``SpotJobTrigger`` the operator defers with (the controller's ``watch`` Next of the
running attempt, its kwargs encrypted with the deployment's Fernet key), and the task
instance ``deferred`` on it with ``next_method="execute_complete"``. Running the 1,000
tasks themselves first (a worker process each, on 2 cores) would take most of an hour and
measure nothing more: what the triggerer does is the same from the row on.

Every lease stays running and every trigger keeps watching. Once every job's heartbeat
has been renewed by the triggerer (bounded wait) and two more describe rounds have
passed, the bench counts for ``--seconds`` the requests the backend's server receives (a
poll is one describe round) and the CPU of the triggerer's process tree (the supervisor
and its trigger runner subprocess), also as the share above its idle cost, and the
"async thread was blocked" notes the triggerer logged in the window. Printed as JSON.

At the end the triggerer is stopped with SIGTERM, as a restart stops it: its triggers'
``cleanup`` finds their task instances still deferred and leaves the leases running
(what a triggerer restart must do); the bench then terminates them, drops the database
and stops the servers, on every exit path (a SIGTERM to the bench included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench.processes import (
    above_idle,
    add_window_arguments,
    children,
    commit,
    count_alive,
    fresh_database,
    idle_cpu,
    postgres_url,
    py_spy,
    stop_process,
)
from bench.scale import trigger_rows
from bench.scale_backends import BACKENDS, controller_options, launch_leases
from spot_emulators.moto_server import free_port

DAG_ID, TASK_ID, RUN_ID = "spot_scale", "job", "bench_scale"
BIN = Path(sys.executable).parent
READY_TIMEOUT = 900.0  # every trigger started and renewed its job's heartbeat
STOP_TIMEOUT = 180.0  # the triggerer's shutdown runs every trigger's cleanup
CLI_TIMEOUT = 600.0
IDLE_SETTLE = 20.0  # the triggerer's start-up, before its idle cost is measured
IDLE_SECONDS = 20.0
BLOCKED_NOTE = re.compile(r"async thread was blocked for ([0-9.]+) seconds")

DAG_FILE = '''"""{jobs} deferrable spot jobs on {provider} (bench/scale_triggerer)."""
from airflow.sdk import DAG

from airflow_spot.operators.spot import SpotJobOperator

with DAG({dag_id!r}, schedule=None, catchup=False, tags=["bench"]):
    SpotJobOperator.partial(
        task_id={task_id!r}, command=["sleep", "86400"], provider={provider!r},
        provider_options={options!r}, deferrable=True, poll_interval={poll_interval!r},
        heartbeat_timeout={heartbeat_timeout!r}, heartbeat_uri={heartbeat_uri!r},
        observe_failure_timeout={observe_failure_timeout!r},
        attempt_timeout={attempt_timeout!r},
    ).expand(checkpoint_uri=[{uri_pattern!r}.format(i=i) for i in range({jobs})])
'''


# -- Airflow: its home, database, DAG and CLI -------------------------------------------------
def airflow_env(
    home: Path, database_url: str, backend_env: dict[str, str], jobs: int
) -> dict[str, str]:
    """This process's environment (moto's throwaway credentials included) for an Airflow in
    ``home`` on ``database_url``, its DAG folder in ``home/dags``; ``backend_env``: how the
    triggerer reaches the jobs' backend (S3 endpoint, local cloud token)."""
    from cryptography.fernet import Fernet

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
            "AIRFLOW__TRIGGERER__CAPACITY": str(max(jobs, 1000)),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            **backend_env,
        }
    )
    return env


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(BIN / "airflow"), *args], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow {' '.join(args)} failed: {done.stderr[-3000:]}")
    return done.stdout


def write_dag(home: Path, jobs: int, backend, poll_interval: float) -> None:
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    (dags / "spot_scale.py").write_text(
        DAG_FILE.format(
            jobs=jobs,
            dag_id=DAG_ID,
            task_id=TASK_ID,
            provider=backend.provider,
            uri_pattern=backend.uri_pattern,
            options=backend.options,
            poll_interval=poll_interval,
            **controller_options(backend),
        )
    )


def defer_task_instances(triggers: list) -> int:
    """Each task instance of the run ``deferred`` on its trigger's row, as the execution
    API leaves a task that called ``self.defer``; how many were deferred."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.sdk import timezone
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    now = timezone.utcnow()
    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == DAG_ID, DagRun.run_id == RUN_ID))
        run.state, run.start_date = DagRunState.RUNNING, now
        tis = {
            ti.map_index: ti
            for ti in session.scalars(
                select(TaskInstance).where(
                    TaskInstance.dag_id == DAG_ID,
                    TaskInstance.run_id == RUN_ID,
                    TaskInstance.task_id == TASK_ID,
                )
            )
        }
        for index, trigger in enumerate(triggers):
            row = Trigger.from_object(trigger)
            session.add(row)
            session.flush()
            ti = tis[index]
            ti.state, ti.trigger_id = TaskInstanceState.DEFERRED, row.id
            ti.next_method, ti.next_kwargs = "execute_complete", {}
            ti.try_number, ti.start_date = 1, now
        return len(triggers)


def assigned_triggers() -> int:
    """Trigger rows a triggerer has taken."""
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return session.scalar(
            select(func.count(Trigger.id)).where(Trigger.triggerer_id.is_not(None))
        )


@contextmanager
def running_triggerer(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """``airflow triggerer``; stopped with SIGTERM (a restart's stop), then SIGKILL."""
    out = open(log, "wb")
    proc = subprocess.Popen(
        [str(BIN / "airflow"), "triggerer"],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        stop_process(proc, STOP_TIMEOUT, session=True)
        out.close()


def wait_watching(
    proc: subprocess.Popen, backend, jobs: int, log: Path, poll_interval: float
) -> dict:
    """Until every trigger runs (each renewed its job's heartbeat) and two describe rounds
    followed; bounded."""
    started = time.monotonic()
    while True:
        renewed, polls = backend.progress()
        if renewed >= jobs:
            break
        if proc.poll() is not None or time.monotonic() - started > READY_TIMEOUT:
            raise RuntimeError(
                f"{renewed} of {jobs} triggers renewed their heartbeat in "
                f"{time.monotonic() - started:.0f} s (triggerer exit code "
                f"{proc.poll()}): " + log.read_text(errors="replace")[-3000:]
            )
        time.sleep(2)
    ready_s = time.monotonic() - started
    give_up = time.monotonic() + 10 * poll_interval + 300
    while backend.progress()[1] < polls + 2 and time.monotonic() < give_up:
        time.sleep(1)
    assigned = assigned_triggers()
    if assigned < jobs:  # the figures per job would count jobs nobody watches
        raise RuntimeError(
            f"only {assigned} of {jobs} triggers still run: the rest of the "
            "leases ended before the window (a launch slower than the "
            "leases' heartbeat_timeout?)"
        )
    return {"triggers_running_after_s": round(ready_s, 1), "triggers_assigned": assigned}


# -- the whole run ------------------------------------------------------------------------------
def blocked_notes(log: Path, offset: int) -> dict:
    """Airflow's "async thread was blocked for N seconds" notes in the window (what a user
    sees in the triggerer's log; ``bench/loop_stalls.py`` finds their cause in-process)."""
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    seconds = [float(s) for s in BLOCKED_NOTE.findall(text)]
    return {"blocked_notes": len(seconds), "longest_blocked_s": max(seconds, default=0.0)}


def bench(
    backend_name: str,
    jobs: int,
    seconds: float,
    poll_interval: float,
    work: Path,
    admin_url: str | None,
    profile: Path | None = None,
    idle_seconds: float = IDLE_SECONDS,
    driver_beat: bool = False,
) -> dict:
    """Every process, database and lease it started is gone when it returns."""
    report: dict = {
        "jobs": jobs,
        "poll_interval_s": poll_interval,
        "database": "postgresql" if admin_url else "sqlite",
        "driver_beat": driver_beat,
    }
    started: list = []
    with ExitStack() as stack:
        stack.callback(count_alive, started, report)
        backend = BACKENDS[backend_name](stack, work)
        if driver_beat:
            backend.heartbeat_uri = backend.drivers_uri
        database = (
            stack.enter_context(
                fresh_database(admin_url, "spot_bench_triggerer", "postgresql+psycopg2")
            )
            if admin_url
            else f"sqlite:///{work / 'airflow.db'}"
        )
        home = work / "airflow-home"
        env = airflow_env(home, database, backend.env, jobs)
        os.environ.update(env)  # this process's own Airflow (the rows below) is that one
        write_dag(home, jobs, backend, poll_interval)
        t0 = time.monotonic()
        cli(env, "db", "migrate")
        cli(env, "dags", "reserialize")
        cli(env, "dags", "trigger", DAG_ID, "-r", RUN_ID)
        report["airflow_setup_s"] = round(time.monotonic() - t0, 1)
        stack.callback(backend.end, report)  # after the triggerer stopped
        log = work / "triggerer.log"
        proc = stack.enter_context(running_triggerer(env, log))
        started += children()
        if idle_seconds:  # its own cost: the job loop, trigger table queries, heartbeats
            report["idle_cpu_s_per_s"] = idle_cpu(proc.pid, idle_seconds, IDLE_SETTLE)
        provider, uris, leases, report["launch_s"] = launch_leases(backend, jobs)
        triggers = trigger_rows(
            backend.provider,
            dict(provider.options),
            leases,
            uris,
            poll_interval,
            controller_options(backend),
        )
        backend.start_counting(uris, [lease.lease_id for lease in leases])
        report["deferred_task_instances"] = defer_task_instances(triggers)
        report.update(wait_watching(proc, backend, jobs, log, poll_interval))
        log_offset = log.stat().st_size
        report.update(backend.measure(proc.pid, seconds, jobs))
        report.update(blocked_notes(log, log_offset))
        if idle_seconds:
            report.update(above_idle(report, jobs))
        report["triggerer_alive_after_window"] = proc.poll() is None
        if profile is not None:
            report["profile"] = py_spy(proc.pid, profile, subprocesses=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale_triggerer", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="ec2",
        help="where the leases live: EC2 on moto, or the local cloud server",
    )
    parser.add_argument("--jobs", type=int, default=1000, help="deferred spot jobs (leases)")
    add_window_arguments(parser, "triggerer", "no trigger", "the metadata database", IDLE_SECONDS)
    parser.add_argument(
        "--keep-log", type=Path, default=None, help="copy the triggerer's log here at the end"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.seconds <= 0 or args.poll_interval <= 0:
        parser.error("--jobs, --seconds and --poll-interval must be positive")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # unwind: the cleanup runs
    # stdout is the JSON report alone: Airflow, once imported here, logs to stdout.
    report_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    report = {"commit": commit()}
    with (
        tempfile.TemporaryDirectory(prefix="bench-scale-triggerer-") as tmp,
        ExitStack() as stack,
    ):
        admin_url = None if args.sqlite else stack.enter_context(postgres_url())
        try:
            report[f"airflow_triggerer_{BACKENDS[args.backend].label}"] = bench(
                args.backend,
                args.jobs,
                args.seconds,
                args.poll_interval,
                Path(tmp),
                admin_url,
                args.profile,
                args.idle_seconds,
                args.driver_beat,
            )
        finally:
            if args.keep_log is not None and (Path(tmp) / "triggerer.log").exists():
                shutil.copyfile(Path(tmp) / "triggerer.log", args.keep_log)
    print(json.dumps(report, indent=2), file=report_out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
