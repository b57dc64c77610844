"""What a live job's deadline policy costs to plan, by deadline and work: seconds and peak
memory of ``plan_job`` plus its first decision, each case in a fresh process.

    python -m bench.deadline_plan                  # the table in bench/README.md
    python -m bench.deadline_plan --case 14 1      # one case: deadline days, work hours

The market is the local cloud's default (the shipped AWS V100 excerpt, 195 s ticks) at
3,600 trace seconds per wall second; the policy is ``default`` (the DP whose tables grew
with the deadline's ticks times its slack before issue 35). Results go in bench/README.md.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time

CASES = ((1, 1), (14, 1), (365, 1), (365, 48), (365, 513))  # (deadline days, work hours)


def one(days: float, work_hours: float) -> str:
    from spot_core.market.fixtures import default_traces
    from spot_core.model import JobRecord
    from spot_core.policy.deadline.planner import plan_job
    from spot_core.providers.local import LocalProvider

    with (
        tempfile.TemporaryDirectory() as workdir,
        LocalProvider.from_traces(default_traces(), time_scale=3600.0, workdir=workdir) as provider,
    ):
        now = time.time()
        started = time.perf_counter()
        plan = plan_job(
            provider.market,
            policy="default",
            pools=provider.pools(),
            created_at=now,
            deadline_at=now + days * 86400 / 3600,
            work_capacity_seconds=work_hours * 3600,
            restart_overhead_capacity_seconds=300,
            total_steps=10,
        )
        plan.action(JobRecord(job_id="bench", created_at=now), now)
        seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (
        f"deadline {days:g} d, work {work_hours:g} h: window {plan.window.ticks:,} ticks, "
        f"planned in {seconds:.2f} s, peak RSS {peak:.0f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs=2, type=float, metavar=("DAYS", "WORK_HOURS"))
    args = parser.parse_args()
    if args.case:
        print(one(*args.case), flush=True)
        return
    for days, hours in CASES:
        subprocess.run(
            [sys.executable, "-m", "bench.deadline_plan", "--case", str(days), str(hours)],
            check=False,
        )


if __name__ == "__main__":
    main()
