"""Where a scale benchmark's leases live, and how their calls are counted at the server.

``bench/scale_triggerer.py`` runs one real ``airflow triggerer`` over either backend:

- ``Ec2Moto``: spot instances on a moto server (EC2 and S3) that records every request;
  the jobs' stores are S3 on the same moto, so a heartbeat renewal is a real PUT;
- ``LocalCloud``: the trace-driven local cloud served as its own process
  (``spot_core.localcloud.server``), a lease a real watched process pair on this machine;
  the jobs' stores are folders here. Calls are counted by the server (``GET /stats``).

Each launches the jobs' leases through its provider, says how many jobs' heartbeats the
watching process has renewed and how many describe rounds it made (the bench waits on
both), measures a window, and at the end reports and ends whatever the watching process
left running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench.moto_recorder import (
    INSTANCE_TYPE,
    REGION,
    ZONE,
    classify,
    make_network,
    measure_watching,
    recorded,
    recording_moto,
    start_recording,
    terminate_leftovers,
)
from bench.processes import measure_window, stop_process
from spot_emulators.moto_server import die_with_parent

BUCKET = "bench-scale"
DESCRIBE_ROUTE = "POST /instances/describe"
# Each local lease's watcher polls its metadata endpoint this often. The benchmark
# measures the process that watches the leases, not the leases, and nothing is reclaimed
# in its window; at 10 s, 1,000 leases' watchers and the server answering them leave this
# 2-core machine to the triggerer (at 1 s they took about 5.5 cores).
LOCAL_WATCH_POLL = 10.0
# Each backend's heartbeat_timeout: each lease's watcher ends its step once nobody renews
# the heartbeat that long, so a killed benchmark leaves no step running for long. On the
# local cloud, longer than the settings' 5 minutes: launching 1,000 local leases takes about
# 6 minutes here, and the first must still run when their triggers start. On EC2 (moto),
# where nothing runs on the instances, the settings' default, so the jobs' heartbeats are
# renewed at the default's cadence (every quarter of the timeout: 75 s).
CONTROLLER = {"observe_failure_timeout": 600.0, "attempt_timeout": 86400.0}


def controller_options(backend) -> dict:
    """The controller settings every benchmarked job runs with on ``backend``: with its
    ``heartbeat_uri`` set (``--driver-beat``), one heartbeat per watching process."""
    return {
        **CONTROLLER,
        "heartbeat_timeout": backend.heartbeat_timeout,
        "heartbeat_uri": backend.heartbeat_uri,
    }


def launch_spec(job_id: str, store, heartbeat_timeout: float):
    """A lease's launch as the controller makes it: a first heartbeat in the job's store,
    then a LaunchSpec whose node watcher gives up on a silent driver."""
    from spot_core.checkpoint.heartbeat import Heartbeat
    from spot_core.providers.base import LaunchSpec

    Heartbeat(store).renew(1, time.time())
    return LaunchSpec(
        job_id, 1, ("sleep", "86400"), store.uri, heartbeat_timeout_seconds=heartbeat_timeout
    )


def launch_leases(backend, jobs: int) -> tuple[object, list[str], list, float]:
    """Each job's lease launched by the backend's provider, its store opened as the
    controller opens it: (provider, the jobs' store URIs, leases, seconds it took)."""
    from spot_core.controller import provider_stores
    from spot_core.providers import open_provider

    provider = open_provider(backend.provider, **backend.options)
    stores = provider_stores(provider)
    started = time.monotonic()
    uris = [backend.uri_pattern.format(i=i) for i in range(jobs)]
    leases = [
        provider.launch(
            launch_spec(f"scale-{i}", stores(uri), backend.heartbeat_timeout), backend.pool
        )
        for i, uri in enumerate(uris)
    ]
    return provider, uris, leases, round(time.monotonic() - started, 1)


@contextmanager
def local_cloud_server(workdir: Path) -> Iterator[str]:
    """``python -m spot_core.localcloud.server`` at real time (``--time-scale 1``) in
    ``workdir``; its URL. It dies with this process; stopping it terminates every lease."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spot_core.localcloud.server",
            "--workdir",
            str(workdir),
            "--time-scale",
            "1",
        ],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    try:
        yield server.stdout.readline().strip()
    finally:
        stop_process(server, 60.0)
        server.stdout.close()


class Ec2Moto:
    """Spot leases on moto's EC2, stores in moto's S3."""

    provider, label = "ec2", "ec2_moto"
    heartbeat_timeout = 300.0  # the settings' default
    heartbeat_uri: str | None = None  # --driver-beat: drivers_uri
    drivers_uri = f"s3://{BUCKET}/drivers"

    def __init__(self, stack: ExitStack, work: Path) -> None:
        from spot_core.model import Market, Pool

        self.endpoint, self.recording = stack.enter_context(recording_moto(work))
        net = make_network(self.endpoint, BUCKET)
        self.options = {
            "region": REGION,
            "endpoint_url": self.endpoint,
            "subnets": [net["subnet"]],
            "instance_types": [INSTANCE_TYPE],
            "image_id": net["image_id"],
        }
        self.env = {"SPOT_S3_ENDPOINT_URL": self.endpoint}  # the jobs' stores, on the same moto
        self.pool = Pool("aws", REGION, ZONE, INSTANCE_TYPE, Market.SPOT)
        self.uri_pattern = f"s3://{BUCKET}/scale-{{i}}"

    def start_counting(self, uris: list[str], lease_ids: list[str]) -> None:
        start_recording(self.endpoint)  # after the launches' own first heartbeats

    def progress(self) -> tuple[int, int]:
        """(jobs whose heartbeat was renewed, describe rounds) since counting began."""
        counted = classify(recorded(self.recording))
        return counted["jobs_renewed"], counted["polls"]

    def measure(self, pid: int, seconds: float, jobs: int) -> dict:
        return measure_watching(pid, self.recording, seconds, jobs)

    def end(self, report: dict) -> None:
        terminate_leftovers(self.endpoint, report)


class LocalCloud:
    """On-demand leases on the local cloud server (nothing is reclaimed in the window),
    stores in folders here."""

    provider, label = "local", "local_cloud"
    heartbeat_timeout = 1800.0
    heartbeat_uri: str | None = None  # --driver-beat: drivers_uri

    def __init__(self, stack: ExitStack, work: Path) -> None:
        from spot_core.localcloud.server import client_environ
        from spot_core.model import Market
        from spot_core.providers import open_provider

        workdir = work / "cloud"
        url = stack.enter_context(local_cloud_server(workdir))
        self.env = client_environ(url, workdir)  # the triggerer's token, from the workdir
        os.environ.update(self.env)
        self.options = {
            "url": url,
            "workdir": str(workdir),
            "watch_poll_interval": LOCAL_WATCH_POLL,
        }
        provider = open_provider("local", **self.options)
        self.cloud, self.pool = provider.cloud, provider.pools()[0].on(Market.ON_DEMAND)
        self.uri_pattern = (work / "stores").as_uri() + "/scale-{i}"
        self.drivers_uri = (work / "drivers").as_uri()
        self._uris: list[str] = []
        self._lease_ids: list[str] = []
        self._first: dict[str, int] = {}
        self._requests: dict[str, int] = {}

    def start_counting(self, uris: list[str], lease_ids: list[str]) -> None:
        self._uris, self._lease_ids = uris, lease_ids
        self._first = self._sequences()
        self._requests = self.counts()

    def progress(self) -> tuple[int, int]:
        now = self._sequences()
        renewed = sum(now[uri] > self._first.get(uri, 0) for uri in self._uris)
        return renewed, self.counts().get(DESCRIBE_ROUTE, 0) - self._requests.get(DESCRIBE_ROUTE, 0)

    def measure(self, pid: int, seconds: float, jobs: int) -> dict:
        def snapshot() -> tuple[dict, dict]:
            return self.counts(), self._sequences()

        (calls0, beats0), (calls1, beats1), figures = measure_window(pid, seconds, jobs, snapshot)
        calls = {k: v - calls0.get(k, 0) for k, v in calls1.items() if v > calls0.get(k, 0)}
        polls = max(calls.get(DESCRIBE_ROUTE, 0), 1)
        return {
            "window_s": figures["window_s"],
            "polls": calls.get(DESCRIBE_ROUTE, 0),
            "server_calls": calls,
            "describe_calls_per_poll": round(calls.get(DESCRIBE_ROUTE, 0) / polls, 2),
            "calls_per_poll": round(sum(calls.values()) / polls, 2),
            "heartbeat_puts_in_window": sum(beats1[u] - beats0.get(u, 0) for u in self._uris),
            "jobs_renewed_in_window": sum(beats1[u] > beats0.get(u, 0) for u in self._uris),
            **figures,
        }

    def end(self, report: dict) -> None:
        """After the watching process stopped: how many leases it left running (all: a
        restart must leave them), then each terminated through the API, and how many
        still have a live process."""
        from spot_core.localcloud.lease_processes import lease_pids

        views = self.cloud.describe(self._lease_ids)
        left = [i for i, view in views.items() if view.running]
        report["instances_left_by_process"] = len(left)
        for lease_id in left:
            self.cloud.terminate_instance(lease_id)
        report["instances_live_at_end"] = sum(bool(lease_pids(i)) for i in self._lease_ids)

    def counts(self) -> dict[str, int]:
        """Requests the server answered, per route."""
        return self.cloud.stats()["requests"]

    def _sequences(self) -> dict[str, int]:
        """Each job's heartbeat sequence (0: none), read from its store."""
        from spot_core.checkpoint import open_store
        from spot_core.checkpoint.heartbeat import Heartbeat

        beats = {uri: Heartbeat(open_store(uri)).read() for uri in self._uris}
        return {uri: 0 if beat is None else beat.sequence for uri, beat in beats.items()}


BACKENDS = {"ec2": Ec2Moto, "local": LocalCloud}
