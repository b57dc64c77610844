"""Many watched jobs in one process: API calls per poll and CPU per job-hour.

``python -m bench.scale`` (``make bench-scale``, in the Airflow environment) runs, in one
asyncio event loop, as the Airflow triggerer's trigger runner does, one real
``SpotJobTrigger`` per deferred job, each rebuilt from its serialized kwargs (what the
triggerer reads from its trigger table), all watching through the process's shared
observer:

1. **EC2 (moto server)**: ``--ec2-leases`` (1,000) spot leases launched by the EC2
   provider itself (``Ec2Provider.launch``: RunInstances with the user-data, tags and
   spot options of a real attempt). API calls are counted at the server, from moto's
   own request recording (``MOTO_ENABLE_RECORDING``), per action.
2. **The local cloud** (its server as a separate process): ``--local-leases`` leases,
   each a real watched process pair on this machine (so far fewer than 1,000 fit on a
   2-core box); calls counted by the server (``GET /stats``).

Each job's record is the controller's (a JobRecord with its running attempt on the
lease, the ``watch`` Next the operator defers with). Each lease is launched as the
controller launches one (a first heartbeat, then the default ``heartbeat_timeout`` in its
LaunchSpec), and the servers die with this process, so a killed benchmark leaves no step
or server running. The EC2 jobs' stores are S3 on the same moto, as in production: their
heartbeat renewals are counted apart from the provider's calls per poll. After one warm-up poll, the
process's CPU time (every thread: the event loop, the observer, ``check``'s worker
threads; not moto's or the local cloud's) is measured over ``--seconds`` of watching at
``--poll-interval``. Printed: describes and calls per poll, CPU-seconds per job-hour and
the share of a core per 100 watched jobs (aims, issue 16: at most 5 EC2 calls per poll
for 1,000 leases; under 1 % of a core per 100 jobs), and the loop's stalls as Airflow's
triggerer would log them, with the full garbage collections they overlapped
(``bench/loop_stalls.py``).

The ``airflow triggerer`` command itself, with 1,000 deferred task-instance rows in its
metadata database, is ``bench/scale_triggerer.py``; the Prefect worker with 200 flow runs
is ``bench/scale_prefect.py`` (the Prefect environment). ``make bench-scale`` runs all
three.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.loop_stalls import LoopStalls
from bench.moto_recorder import classify, recorded
from bench.processes import commit
from bench.scale_backends import CONTROLLER, Ec2Moto, LocalCloud, controller_options, launch_leases


# -- the jobs: controller records on launched leases, as deferred trigger rows ----------------
def watch_next(lease, checkpoint_uri: str):
    """The ``watch`` Next the controller hands the operator after launching ``lease``."""
    from spot_core.controller import Next
    from spot_core.model import Attempt, JobRecord

    record = JobRecord(
        job_id=lease.job_id, created_at=lease.started_at, checkpoint_uri=checkpoint_uri
    )
    record = record.start_attempt(
        Attempt(
            number=lease.attempt,
            pool=lease.pool,
            started_at=lease.started_at,
            lease_id=lease.lease_id,
            lease=lease.to_dict(),
            checkpoint_step_start=None,
        )
    )
    return Next(
        "watch", record, until=lease.started_at + CONTROLLER["attempt_timeout"], lease=lease
    )


def trigger_rows(
    provider_name: str, options: dict, leases, uris, poll_interval: float, controller: dict
) -> list:
    """Each job's SpotJobTrigger (``uris``: the jobs' stores), serialized and rebuilt as the
    triggerer does."""
    from airflow_spot.triggers.spot import SpotJobTrigger

    rows = []
    for lease, uri in zip(leases, uris, strict=True):
        trigger = SpotJobTrigger(
            provider=provider_name,
            provider_options=options,
            next=watch_next(lease, uri).to_dict(),
            checkpoint_uri=uri,
            controller_options={**controller, "poll_interval": poll_interval},
        )
        path, kwargs = trigger.serialize()
        module, _, name = path.rpartition(".")
        rows.append(getattr(importlib.import_module(module), name)(**kwargs))
    return rows


# -- running them in one event loop ---------------------------------------------------------------
async def _watch(
    triggers, observer, seconds: float, poll_interval: float, count_calls, warm
) -> dict:
    """Run every trigger; once every lease is watched, two polls were made and ``warm()``
    holds (each job's first heartbeat renewal is done), measure ``seconds`` of watching."""

    async def drive(trigger):
        async for event in trigger.run():
            return event.payload

    tasks = [asyncio.create_task(drive(t)) for t in triggers]
    give_up = time.monotonic() + 300
    while len(observer.watched()) < len(triggers) or observer.polls < 2 or not warm():
        if time.monotonic() > give_up or any(t.done() for t in tasks):
            fired = [t.result() for t in tasks if t.done()][:3]
            raise RuntimeError(f"the triggers did not all start watching: {fired}")
        await asyncio.sleep(0.2)
    calls0, polls0, calls_obs0 = count_calls(), observer.polls, observer.calls
    async with LoopStalls() as stalls:  # as Airflow's "async thread was blocked" notes
        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    polls, describes = observer.polls - polls0, observer.calls - calls_obs0
    calls = {k: v - calls0.get(k, 0) for k, v in count_calls().items() if v - calls0.get(k, 0)}
    ended = sum(t.done() for t in tasks)
    for task in tasks:  # as a triggerer that stops: cancel, the leases stay (no on_kill)
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    jobs = len(triggers)
    job_hours = jobs * wall / 3600.0
    api = sum(v for k, v in calls.items() if not k.startswith("S3 "))  # not the jobs' stores
    return {
        "jobs": jobs,
        "ended_during_window": ended,
        "poll_interval_s": poll_interval,
        "window_s": round(wall, 1),
        "polls": polls,
        "observer_describes": describes,
        "server_calls": calls,
        "server_calls_per_poll": round(api / max(polls, 1), 2),
        "cpu_s": round(cpu, 2),
        "cpu_s_per_job_hour": round(cpu / job_hours, 4),
        "core_percent_per_100_jobs": round(100.0 * cpu / wall / jobs * 100, 3),
        **stalls.summary(),
    }


def run_loop(triggers, observer, seconds, poll_interval, count_calls, warm=lambda: True) -> dict:
    return asyncio.run(_watch(triggers, observer, seconds, poll_interval, count_calls, warm))


def _observer_of(trigger):
    from spot_core.observer import shared_observer

    hook = trigger.hook()
    return shared_observer(hook.cache_key, hook.get_provider())


# -- EC2 on moto -----------------------------------------------------------------------------------
def moto_calls(recording: Path):
    """Requests moto recorded, per EC2 action or S3 method."""

    def count() -> dict[str, int]:
        return classify(recorded(recording))["calls"]

    return count


def bench_ec2(leases: int, seconds: float, poll_interval: float, work: Path) -> dict:
    with ExitStack() as stack:
        backend = Ec2Moto(stack, work)
        provider, uris, launched, launch_s = launch_leases(backend, leases)
        triggers = trigger_rows(
            "ec2",
            dict(provider.options),
            launched,
            uris,
            poll_interval,
            controller_options(backend),
        )
        backend.start_counting(uris, [lease.lease_id for lease in launched])
        count = moto_calls(backend.recording)
        result = run_loop(
            triggers,
            _observer_of(triggers[0]),
            seconds,
            poll_interval,
            count,
            warm=lambda: count().get("S3 PUT", 0) >= leases,
        )
        result["launch_s"] = launch_s
        return result


# -- the local cloud -------------------------------------------------------------------------------
def bench_local(leases: int, seconds: float, poll_interval: float, work: Path) -> dict:
    with ExitStack() as stack:  # stopping the server terminates every lease
        backend = LocalCloud(stack, work)
        provider, uris, launched, launch_s = launch_leases(backend, leases)
        triggers = trigger_rows(
            "local",
            dict(provider.options),
            launched,
            uris,
            poll_interval,
            controller_options(backend),
        )
        result = run_loop(
            triggers, _observer_of(triggers[0]), seconds, poll_interval, backend.counts
        )
        for name in ("GET /config",):  # the triggers' provider opens, not polls
            result["server_calls"].pop(name, None)
        result["launch_s"] = launch_s
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--ec2-leases", type=int, default=1000)
    parser.add_argument("--local-leases", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument("--only", choices=("ec2", "local"), default=None)
    args = parser.parse_args(argv)
    report = {"commit": commit()}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        if args.only in (None, "ec2"):
            report["ec2_moto"] = bench_ec2(
                args.ec2_leases, args.seconds, args.poll_interval, Path(tmp) / "ec2"
            )
            print(json.dumps({"ec2_moto": report["ec2_moto"]}, indent=2), flush=True)
        if args.only in (None, "local"):
            report["local_cloud"] = bench_local(
                args.local_leases, args.seconds, args.poll_interval, Path(tmp) / "local"
            )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
