"""Synchronous drivers in one process (``spot-pipelines run``, the Prefect task runner's
spot tasks: each a ``Controller.run``) watch their leases through the process's one
shared observer: three jobs running side by side are described together, in one call per
poll, counted at the local cloud server, and each still ends as its step did."""

from __future__ import annotations

import sys
import threading

import pytest

from spot_core.controller import Controller, JobSpec
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import JobStatus, Market
from spot_core.observer import observer_of
from spot_core.providers import open_provider
from tests.support.spot_helpers import marked_processes, trace, wait_until

pytestmark = pytest.mark.timeout(120)
FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)
STEP = (sys.executable, "-c", "import time; time.sleep(4)")
JOBS = 3


def test_jobs_driven_in_one_process_share_one_describe_per_poll(tmp_path):
    with LocalCloudServer.from_traces(
        [trace("us-east-1a_v100_1", "1" * 400)],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=FAST,
    ) as server:
        provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        pool = provider.pools()[0].on(Market.ON_DEMAND)
        records: dict[int, object] = {}

        def drive(index: int) -> None:
            spec = JobSpec(f"shared-{index}", STEP, (tmp_path / f"ckpt-{index}").as_uri(), (pool,))
            controller = Controller(provider, provider.market, poll_interval_seconds=0.2)
            records[index] = controller.run(spec, observer=observer_of(provider))

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(JOBS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        stats = server.stats.to_dict()
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15)
    assert [records[i].status for i in range(JOBS)] == [JobStatus.SUCCEEDED] * JOBS
    calls = stats["requests"]["POST /instances/describe"]
    per_lease = list(stats["described"].values())
    assert len(per_lease) == JOBS and min(per_lease) >= 10  # each watched all along
    # Alone, each job would describe its own lease: as many calls as described ids.
    assert calls < 0.6 * sum(per_lease), (calls, per_lease)
    assert observer_of(provider) is observer_of(provider)
