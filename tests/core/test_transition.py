"""The one transition every driver makes (``spot_core.lifecycle.transition``): after an
interrupted attempt whose replacement was launched on its notice, the job goes on on that
replacement (adopted, not relaunched, not ended); without one, it relaunches.

Driven exactly as the drivers drive it (wait, watch with ``check``, follow), on the local
cloud with a reclaim and a real step (``handover_step.py``, whose emergency save takes a
second and a half, so the old lease outlives the notice).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from spot_core.controller import Controller, JobSpec, Step, Transition
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.localcloud.server import LocalCloudServer
from spot_core.model import JobStatus, Outcome
from spot_core.policy.retry import RetryPolicy
from spot_core.providers import open_provider
from tests.support import SUPPORT
from tests.support.spot_helpers import marked_processes, trace, wait_until

pytestmark = pytest.mark.timeout(120)
STEP = SUPPORT / "handover_step.py"
STEPS, STEP_SECONDS, SAVE_SECONDS = 300, 0.02, 1.5
# Zone a is reclaimed at tick 3 (3 s at 60x) with a 2 s notice; zone b comes up at tick 2.
ZONES = {"us-east-1a_v100_1": "111" + "0" * 400, "us-east-1b_v100_1": "00" + "1" * 400}
POLICY = RetryPolicy(max_preemptions=3, capacity_wait_seconds=0.5, on_demand_fallback=False)


def drive(tmp_path: Path, handover: str) -> tuple[list[Step], dict]:
    """The job driven through ``Transition`` as every driver does; every step it took and
    the step's own result file (the sum of the steps it ran)."""
    result = tmp_path / "result.json"
    with LocalCloudServer.from_traces(
        [trace(name, pattern) for name, pattern in ZONES.items()],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=2.0),
    ) as server:
        provider = open_provider("local", url=server.url, workdir=server.cloud.workdir)
        command = (sys.executable, str(STEP), str(STEPS), str(STEP_SECONDS), str(SAVE_SECONDS))
        spec = JobSpec(
            "job-transition",
            (*command, str(result)),
            (tmp_path / "ckpt").as_uri(),
            provider.pools(),
        )
        controller = Controller(
            provider, provider.market, POLICY, heartbeat_timeout_seconds=30.0, handover=handover
        )
        transition = Transition(controller, spec)
        steps = [transition.start(controller.persist(controller.new_record(spec)))]
        give_up = time.monotonic() + 90
        while steps[-1].action != "finished" and time.monotonic() < give_up:
            step = steps[-1]
            if step.action == "wait":
                time.sleep(step.wait_seconds)
                steps.append(transition.woke(step.next))
                continue
            nxt = step.next
            while nxt.action == "watch":
                time.sleep(0.05)
                nxt = controller.check(spec, nxt)
            steps.append(transition.follow(nxt))
        assert steps[-1].action == "finished", f"the job did not settle: {steps[-1]}"
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15), (
            "a lease process outlived its attempt"
        )
    return steps, json.loads(result.read_text())


def test_an_ended_attempt_with_a_replacement_goes_on_on_it_rather_than_ending(tmp_path):
    steps, result = drive(tmp_path, "on_notice")
    record = steps[-1].record
    assert record.status is JobStatus.SUCCEEDED, [a.message for a in record.attempts]
    old, new = record.attempts
    assert old.outcome is Outcome.PREEMPTED and new.outcome is Outcome.SUCCEEDED
    # the step after the reclaimed attempt watches its replacement, adopted: the lease
    # launched on the notice, not one launched after the end
    adopted = [step for step in steps if step.adopted]
    assert len(adopted) == 1 and adopted[0].action == "watch"
    assert old.replacement is not None and old.replacement["state"] == "adopted"
    assert adopted[0].lease.lease_id == old.replacement["lease"]["lease_id"] == new.lease_id
    assert new.started_at < old.ended_at
    assert result["total"] == sum(range(STEPS))  # no step lost or run twice


def test_without_a_replacement_the_ended_attempt_is_relaunched_and_nothing_is_adopted(tmp_path):
    steps, result = drive(tmp_path, "off")
    record = steps[-1].record
    assert record.status is JobStatus.SUCCEEDED, [a.message for a in record.attempts]
    old, new = record.attempts
    assert old.outcome is Outcome.PREEMPTED and old.replacement is None
    assert new.started_at >= old.ended_at
    assert not any(step.adopted for step in steps)
    assert result["total"] == sum(range(STEPS))
