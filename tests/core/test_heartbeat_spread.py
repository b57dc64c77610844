"""Jobs watched together renew their heartbeats as a steady trickle, not in one burst.

A triggerer picks up 1,000 deferred jobs within seconds; renewing every job's heartbeat
on the same poll every minute held the process for seconds at a time. Here one controller
takes over 200 running jobs (real file stores, the shared observer's path: each poll's
observation is handed to ``check``) on a fake clock for ten minutes of 5 s polls, and
the renewals the stores hold are counted.
"""

from __future__ import annotations

from spot_core.checkpoint import open_store
from spot_core.checkpoint.heartbeat import Heartbeat
from spot_core.controller import Controller, JobSpec, Next
from spot_core.model import Attempt, JobRecord, Lease
from spot_core.policy.retry import RetryPolicy
from spot_core.providers.base import LeaseState, LeaseStatus, Observation
from spot_core.providers.local import LocalProvider

from spot_helpers import trace

JOBS, POLL, MINUTES = 200, 5.0, 10


def test_renewals_of_jobs_taken_over_together_are_spread_and_never_late(tmp_path):
    provider = LocalProvider.from_traces([trace("us-east-1a_v100_1", "1" * 100)],
                                         workdir=tmp_path / "cloud")
    pool = provider.pools()[0]
    controller = Controller(provider, provider.market, RetryPolicy(), heartbeat_timeout=300.0)
    every = 60.0  # a quarter of the timeout, at most a minute
    watches, stores = [], []
    for n in range(JOBS):
        uri = (tmp_path / f"job-{n}").as_uri()
        spec = JobSpec(job_id=f"job-{n}", command=("true",), checkpoint_uri=uri, pools=(pool,))
        lease = Lease(f"i-{n}", pool, spec.job_id, 1, 0.0, 0.9)
        record = JobRecord(job_id=spec.job_id, created_at=0.0).start_attempt(
            Attempt(number=1, pool=pool, started_at=0.0, lease_id=lease.lease_id))
        watches.append((spec, Next("watch", record, until=10**9, lease=lease)))
        stores.append(Heartbeat(open_store(uri)))

    renewals: list[list[float]] = [[] for _ in range(JOBS)]
    per_poll = []
    for k in range(1, int(MINUTES * 60 / POLL) + 1):
        now = k * POLL
        renewed = 0
        for n, (spec, watch) in enumerate(watches):
            running = Observation(watch.lease.lease_id, status=LeaseStatus(LeaseState.RUNNING),
                                  at=now)
            assert controller.check(spec, watch, now=now, observed=running).action == "watch"
            beat = stores[n].read()
            if not renewals[n] or beat.renewed_at != renewals[n][-1]:
                renewals[n].append(beat.renewed_at)
                renewed += 1
        per_poll.append(renewed)

    gaps = [b - a for times in renewals for a, b in zip(times, times[1:])]
    assert max(gaps) <= every + POLL, "no job waits longer than the interval (plus a poll)"
    assert per_poll[0] == JOBS, "a driver that takes jobs over renews each at once"
    assert max(per_poll[1:]) <= JOBS * 0.2, per_poll  # then a trickle, not 200 a minute
    assert sum(per_poll) <= JOBS * (MINUTES + 2), "no more writes than one a minute a job"
