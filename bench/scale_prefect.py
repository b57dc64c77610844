"""One Prefect spot worker watching many flow runs: EC2 calls per poll and CPU per job-hour.

``python -m bench.scale_prefect`` (``make bench-scale``, in the Prefect environment, after
the Airflow part ``bench/scale.py``) starts, as separate real processes:

- a moto server (EC2 and S3), recording every request it gets (``MOTO_RECORDER_FILEPATH``);
- ``prefect server start`` on a fresh PostgreSQL database of ``$SPOT_TEST_POSTGRES_URL``
  or of a private cluster started for the run (as in production; SQLite in a temp
  folder with ``--sqlite``: at 200 runs on a loaded machine it answered 503 "database is
  locked" and the worker failed to submit some runs);
- a work pool of type ``spot`` whose deployment runs on provider ``ec2`` pointed at moto
  (checkpoints in a moto S3 bucket), and ``--runs`` (200) flow runs of it;
- ONE ``prefect worker start --type spot`` (limit: every run at once).

The worker launches a spot instance per flow run (RunInstances with the attempt's
user-data, tags and spot options). Nothing runs on a moto instance, so every lease stays
running and every flow run stays watched. Once the worker has reported a lease for every
run (bounded wait), and after a warm-up of two polls, the bench counts for ``--seconds``
the requests moto receives, by EC2 action (a poll is one DescribeInstances round: its
first page, without NextToken) and S3 method, and the worker process's CPU time
(psutil: the process and its children). Printed as JSON: calls per poll, ids described
per poll, CPU-seconds per job-hour and % of a core per 100 watched jobs (aims, issue 16:
at most 5 EC2 calls per poll for 1,000 leases; under 1 % of a core per 100 jobs).

On every exit path the worker is stopped (SIGTERM: its shutdown stops the attempts it
watches, which terminates their instances; SIGKILL after a bounded wait), any instance
still running is terminated by the bench, then the Prefect server and moto are stopped.
The JSON says how many instances the worker left for the bench to terminate. A SIGTERM
to the bench unwinds the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from contextlib import ExitStack, redirect_stdout
from pathlib import Path

from bench.moto_recorder import (
    INSTANCE_TYPE,
    REGION,
    live_instances,
    make_network,
    measure_watching,
    recording_moto,
    start_recording,
    terminate_leftovers,
)
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
)
from tests.support.prefect_stack import deploy_example_flow, prefect_server, running_worker

POOL = "spot-scale"
WORKER_STOP_TIMEOUT = 180.0  # the worker's shutdown stops every attempt it watches
LAUNCH_TIMEOUT = 900.0  # 200 launches took 8+ min on a loaded 2-core box with SQLite
IDLE_SECONDS = 20.0  # the worker's own cost with nothing to run, before the flow runs exist
IDLE_SETTLE = 15.0


# -- Prefect: the deployment, its flow runs, the worker ------------------------------------------
def job_variables(
    endpoint: str, net: dict, poll_interval: float, driver_beat: bool = False
) -> dict:
    return {
        "provider": "ec2",
        "poll_interval": poll_interval,
        "checkpoint_root": f"s3://{net['bucket']}/flows",
        "heartbeat_uri": f"s3://{net['bucket']}/drivers" if driver_beat else None,
        "provider_options": {
            "endpoint_url": endpoint,
            "region": REGION,
            "subnets": [net["subnet"]],
            "instance_types": [INSTANCE_TYPE],
            "image_id": net["image_id"],
        },
    }


def create_flow_runs(deployment_id, runs: int) -> list:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return [
            client.create_flow_run_from_deployment(
                deployment_id, name=f"scale-{i}", parameters={"workdir": f"/tmp/scale-{i}"}
            ).id
            for i in range(runs)
        ]


def launch_progress(run_ids: list) -> tuple[int, list[str]]:
    """(flow runs the worker reported a lease for, the final state of each flow run that
    ended without one: a submission the server refused, say)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    leased, ended = 0, []
    with get_client(sync_client=True) as client:
        for start in range(0, len(run_ids), 200):
            for run in client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=run_ids[start : start + 200])
                ),
                limit=200,
            ):
                if (run.infrastructure_pid or "").startswith("i-"):
                    leased += 1
                elif run.state is not None and run.state.is_final():
                    ended.append(f"{run.name}: {run.state.name}: {run.state.message or ''}")
    return leased, ended


def start_flows(run_ids: list) -> None:
    """Each flow run ``Running``, as the flow engine on its node makes it when the flow
    starts (nothing runs on moto's instances): so the window holds what a worker watching
    running flows does, its look for orphaned ``Running`` runs included."""
    from prefect import get_client
    from prefect.states import Running

    with get_client(sync_client=True) as client:
        for run_id in run_ids:
            client.set_flow_run_state(run_id, Running(), force=True)


def wait_launched(run_ids: list, worker, log: Path, timeout: float) -> dict:
    """Until every flow run has a lease or has ended without one (bounded)."""
    started = time.monotonic()
    while True:
        leased, ended_states = launch_progress(run_ids)
        ended = len(ended_states)
        if leased + ended == len(run_ids):
            return {
                "launch_s": round(time.monotonic() - started, 1),
                "leased_runs": leased,
                "runs_ended_unlaunched": ended,
                "unlaunched_states": ended_states,
            }
        if worker.poll() is not None or time.monotonic() - started > timeout:
            raise RuntimeError(
                f"the worker reported {leased} of {len(run_ids)} leases "
                f"({ended} runs ended without one) in "
                f"{time.monotonic() - started:.0f} s (worker exit code "
                f"{worker.poll()}): " + log.read_text(errors="replace")[-3000:]
            )
        time.sleep(5)


def bench(
    runs: int,
    seconds: float,
    poll_interval: float,
    work: Path,
    database_url: str | None = None,
    profile: Path | None = None,
    idle_seconds: float = IDLE_SECONDS,
    driver_beat: bool = False,
) -> dict:
    """The whole run; every process and instance it started is gone when it returns."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    report: dict = {
        "runs": runs,
        "poll_interval_s": poll_interval,
        "database": "postgresql" if database_url else "sqlite",
        "driver_beat": driver_beat,
    }
    started: list = []  # every process the bench started, for the check at the end
    with ExitStack() as stack:
        stack.callback(count_alive, started, report)
        endpoint, recording = stack.enter_context(recording_moto(work))
        net = make_network(endpoint, "bench-scale")
        api = stack.enter_context(prefect_server(work / "prefect-server", database_url))
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api}))
        with redirect_stdout(sys.stderr):  # its table; stdout is the JSON report
            deployment_id = deploy_example_flow(
                POOL, "scale", job_variables(endpoint, net, poll_interval, driver_beat)
            )
        stack.callback(terminate_leftovers, endpoint, report)  # after the worker stopped
        log = work / "worker.log"
        worker = stack.enter_context(
            running_worker(
                POOL,
                log,
                limit=runs,
                stop_timeout=WORKER_STOP_TIMEOUT,
                env={
                    "SPOT_S3_ENDPOINT_URL": endpoint,
                    "PREFECT_LOGGING_LEVEL": "WARNING",
                    # Prefect's defaults (the tests' worker asks every second)
                    "PREFECT_WORKER_QUERY_SECONDS": "10",
                    "PREFECT_WORKER_PREFETCH_SECONDS": "10",
                },
            )
        )
        started += children()
        if idle_seconds:
            report["idle_cpu_s_per_s"] = idle_cpu(worker.pid, idle_seconds, IDLE_SETTLE)
        run_ids = create_flow_runs(deployment_id, runs)
        report.update(wait_launched(run_ids, worker, log, timeout=LAUNCH_TIMEOUT))
        if not report["leased_runs"]:
            raise RuntimeError("the worker launched no lease: " + log.read_text()[-3000:])
        start_flows(run_ids)
        start_recording(endpoint)
        time.sleep(2 * poll_interval + 1)  # warm-up: every lease in a poll
        jobs = report["leased_runs"]
        report.update(measure_watching(worker.pid, recording, seconds, jobs))
        if idle_seconds:
            report.update(above_idle(report, jobs))
        report["live_instances_in_window"] = len(live_instances(endpoint))
        if profile is not None:
            report["profile"] = py_spy(worker.pid, profile)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale_prefect", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=int, default=200, help="flow runs (one lease each)")
    add_window_arguments(parser, "worker", "no flow run", "the Prefect server", IDLE_SECONDS)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.seconds <= 0 or args.poll_interval <= 0:
        parser.error("--runs, --seconds and --poll-interval must be positive")
    # A SIGTERM (a timeout, CI) unwinds like Ctrl-C: the cleanup below still runs.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    report = {"commit": commit()}
    with tempfile.TemporaryDirectory(prefix="bench-scale-prefect-") as tmp, ExitStack() as stack:
        admin_url = None if args.sqlite else stack.enter_context(postgres_url())
        os.environ["PREFECT_HOME"] = str(Path(tmp) / "prefect-home")  # not ~/.prefect
        database = None
        if admin_url:
            database = stack.enter_context(
                fresh_database(admin_url, "spot_bench_scale", "postgresql+asyncpg")
            )
        report["prefect_worker_ec2_moto"] = bench(
            args.runs,
            args.seconds,
            args.poll_interval,
            Path(tmp),
            database,
            args.profile,
            args.idle_seconds,
            args.driver_beat,
        )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
