"""Each attempt gets the Young/Daly checkpoint interval of its own pool, in its environment,
its Checkpointer follows it unless told otherwise, and the JobRecord shows it."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from spot_core.attempt_env import CHECKPOINT_INTERVAL, AttemptEnv
from spot_core.checkpoint import Checkpointer, open_store
from spot_core.controller import Controller, JobSpec
from spot_core.errors import ConfigError
from spot_core.localcloud.cloud import LocalCloudConfig
from spot_core.model import JobRecord, JobStatus, Market
from spot_core.policy.checkpoint_interval import (
    CheckpointBounds,
    checkpoint_interval,
    mean_save_seconds,
    pool_checkpoint_interval,
)
from spot_core.policy.retry import RetryPolicy
from spot_core.providers.local import LocalProvider
from tests.support.spot_helpers import trace, train_command

FAST = LocalCloudConfig(min_notice_wall_seconds=1.0, grace_wall_seconds=1.0)
BOUNDS = CheckpointBounds(cost=60.0, min_seconds=60.0, max_seconds=3600.0)


def _step_that_reports_its_interval(tmp_path) -> tuple[str, ...]:
    """Writes the interval it was given (one line per attempt), then trains."""
    script = tmp_path / "report_interval.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, sys
        from spot_core.workloads.softmax_regression import main
        with open({str(tmp_path / "intervals.jsonl")!r}, "a") as out:
            interval = os.environ.get("SPOT_CHECKPOINT_INTERVAL")
            out.write(json.dumps({{"attempt": os.environ["SPOT_ATTEMPT"],
                                   "interval": interval}}) + "\\n")
        sys.exit(main(sys.argv[1:]))
    """)
    )
    return (sys.executable, str(script), *train_command(steps=600, every_steps=10)[3:])


def test_spot_attempts_get_their_pools_interval_and_on_demand_the_longest(tmp_path):
    # Spot for 2 ticks out of every 4, seen for 40 ticks before the job: a busy pool (30
    # interruptions an hour); the job ends on on-demand.
    provider = LocalProvider.from_traces(
        [trace("us-east-1a_v100_1", "1100" * 80)],
        time_scale=60.0,
        start_tick=40,
        workdir=tmp_path / "cloud",
        config=FAST,
    )
    spec = JobSpec(
        job_id="job-interval",
        command=_step_that_reports_its_interval(tmp_path),
        checkpoint_uri=(tmp_path / "ckpt").as_uri(),
        pools=provider.pools(),
    )
    controller = Controller(
        provider,
        provider.market,
        RetryPolicy(max_preemptions=1, capacity_wait_seconds=0.5, min_on_demand_seconds=1e9),
        poll_interval_seconds=0.05,
    )
    with provider:
        record = controller.run(spec)
    assert record.status is JobStatus.SUCCEEDED
    launched = [a for a in record.attempts if a.lease_id is not None]
    spot = [a for a in launched if a.pool.market is Market.SPOT]
    on_demand = [a for a in launched if a.pool.market is Market.ON_DEMAND]
    assert spot and on_demand
    assert all(a.checkpoint_interval_seconds < 3600.0 for a in spot), "a busy pool saves often"
    assert on_demand[-1].checkpoint_interval_seconds == 3600.0, "on-demand: the maximum"
    # what each step saw, in its own (wall) clock: the record's capacity seconds / 60
    seen = {
        int(line["attempt"]): float(line["interval"])
        for line in map(json.loads, (tmp_path / "intervals.jsonl").read_text().splitlines())
    }
    for attempt in launched:
        assert seen[attempt.number] == pytest.approx(
            attempt.checkpoint_interval_seconds / 60.0, rel=1e-5
        )
    # the second attempt priced its saves from the first's measured ones, not the guess
    ref = open_store(spec.checkpoint_uri).latest()
    assert mean_save_seconds(ref) is not None
    again = JobRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert [a.checkpoint_interval_seconds for a in again.attempts] == [
        a.checkpoint_interval_seconds for a in record.attempts
    ]


def test_the_interval_follows_the_rate_and_the_measured_cost():
    quiet = pool_checkpoint_interval(0.0, 30.0, BOUNDS)
    busy = pool_checkpoint_interval(2.0, 30.0, BOUNDS)
    busier = pool_checkpoint_interval(200.0, 30.0, BOUNDS)
    assert quiet == 3600.0 and busy == checkpoint_interval(30.0, 2.0) and busier == 60.0
    assert (
        pool_checkpoint_interval(2.0, 5.0, BOUNDS)
        < busy
        < pool_checkpoint_interval(2.0, 120.0, BOUNDS)
    ), "dearer saves, rarer saves"


@pytest.mark.parametrize(
    "metadata, expected",
    [
        ({"checkpoint_seconds_total": 3.0, "checkpoint_saves": 4}, 0.75),
        ({}, None),
        ({"checkpoint_seconds_total": "3", "checkpoint_saves": 4}, None),
        ({"checkpoint_seconds_total": 3.0, "checkpoint_saves": 0}, None),
        ({"checkpoint_seconds_total": float("nan"), "checkpoint_saves": 2}, None),
        ({"checkpoint_seconds_total": True, "checkpoint_saves": 2}, None),
    ],
)
def test_measured_save_cost_from_checkpoint_metadata(metadata, expected):
    class Ref:
        pass

    ref = Ref()
    ref.metadata = metadata
    assert mean_save_seconds(ref) == expected


def test_the_checkpointer_follows_the_environment_unless_told_otherwise(tmp_path):
    env = {
        "SPOT_CHECKPOINT_URI": (tmp_path / "s").as_uri(),
        "SPOT_ATTEMPT": "2",
        CHECKPOINT_INTERVAL: "12.5",
    }
    assert Checkpointer.from_env(env).every_seconds == 12.5
    assert Checkpointer.from_env(env, every_seconds=600).every_seconds == 600
    assert Checkpointer.from_env({**env, CHECKPOINT_INTERVAL: ""}).every_seconds is None
    assert AttemptEnv.from_environ(env).to_environ()[CHECKPOINT_INTERVAL] == "12.5"
    with pytest.raises(ConfigError, match="SPOT_CHECKPOINT_INTERVAL='soon' is not a number"):
        Checkpointer.from_env({**env, CHECKPOINT_INTERVAL: "soon"})


def test_a_job_that_sets_its_own_interval_keeps_it(tmp_path):
    provider = LocalProvider.from_traces(
        [trace("us-east-1a_v100_1", "1" * 200)],
        time_scale=60.0,
        workdir=tmp_path / "cloud",
        config=FAST,
    )
    spec = JobSpec(
        job_id="job-own",
        command=_step_that_reports_its_interval(tmp_path),
        checkpoint_uri=(tmp_path / "ckpt").as_uri(),
        pools=provider.pools(),
        env={CHECKPOINT_INTERVAL: "7"},
    )
    with provider:
        record = Controller(
            provider, provider.market, RetryPolicy(), poll_interval_seconds=0.05
        ).run(spec)
    assert record.status is JobStatus.SUCCEEDED
    assert '"interval": "7"' in (tmp_path / "intervals.jsonl").read_text()


def test_bounds_that_cannot_hold_an_interval_are_refused():
    provider = LocalProvider.from_traces([trace("us-east-1a_v100_1", "1" * 20)])
    with provider, pytest.raises(ConfigError, match="checkpoint_interval_min .* exceeds"):
        Controller(provider, provider.market, checkpoint_interval_min_seconds=7200.0)
