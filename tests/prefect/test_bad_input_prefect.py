"""Bad input on every Prefect surface, and the JobRecord kept in Prefect without a cap.

Each bad input is refused in one line that names the field and the fix, before anything
is created (docs/reliability.md, "Prefect"). The record tests run against the real
Prefect server: a long record round-trips, a failed write stops the driver (and
terminates a lease it could not record), a damaged record is one clear error, and no
Prefect Variable is left behind.
"""

from __future__ import annotations

import time
import uuid

import pytest
from prefect import flow, task
from prefect.settings import PREFECT_API_URL, temporary_settings

from prefect_spot import CheckpointStorage, SpotConfiguration, SpotTaskRunner, _jobs, spot_task
from prefect_spot.artifacts import (
    RECORD_TYPE,
    CorruptRecord,
    RecordNotSaved,
    load_record,
    record_key,
    save_record,
)
from prefect_spot.workers import SpotJobConfiguration, SpotJobVariables
from spot_core.errors import ConfigError
from spot_core.model import Attempt, JobRecord, Market, Outcome, Pool
from tests.support.spot_helpers import marked_processes, wait_until  # tests/core

EC2 = {"subnets": ["subnet-1"], "image_id": "ami-1", "instance_types": ["g5.xlarge"]}
DEAD_API = "http://127.0.0.1:9/api"  # nothing listens on the discard port


def _message(exc: BaseException) -> str:
    """What the user reads: a ValidationError's first message, else the error's text."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return str(first.get("ctx", {}).get("error") or first["msg"])
    return str(exc)


def with_checkpointer(checkpointer=None) -> int:
    return 1


# (surface, build, words the one line must hold: the field and the fix)
CASES = [
    # SpotConfiguration block fields
    ("block", lambda: SpotConfiguration(max_preemptions=-1), ["max_preemptions", ">= 0"]),
    ("block", lambda: SpotConfiguration(max_preemptions=2.5), ["max_preemptions", "whole"]),
    ("block", lambda: SpotConfiguration(max_spot_price=float("nan")), ["max_spot_price", "number"]),
    ("block", lambda: SpotConfiguration(max_spot_price=-1), ["max_spot_price", "> 0"]),
    ("block", lambda: SpotConfiguration(max_spot_price="cheap"), ["max_spot_price", "number"]),
    ("block", lambda: SpotConfiguration(capacity_wait=float("inf")), ["capacity_wait", "'5m'"]),
    ("block", lambda: SpotConfiguration(poll_interval=0), ["poll_interval", "> 0"]),
    ("block", lambda: SpotConfiguration(heartbeat_timeout="-5s"), ["heartbeat_timeout", "'90s'"]),
    ("block", lambda: SpotConfiguration(zones="us-east-1a"), ["zones", "list of names"]),
    ("block", lambda: SpotConfiguration(instance_types=["", " "]), ["instance_types", "list"]),
    ("block", lambda: SpotConfiguration(max_premptions=2), ["max_premptions", "choose from"]),
    # provider options
    ("provider", lambda: SpotConfiguration(provider="gcp"), ["provider", "local, ec2"]),
    (
        "provider",
        lambda: SpotConfiguration(provider_options={"colour": 1}),
        ["colour", "choose from"],
    ),
    (
        "provider",
        lambda: SpotConfiguration(provider_options={"time_scale": float("nan")}),
        ["time_scale", "finite number > 0"],
    ),
    (
        "provider",
        lambda: SpotConfiguration(provider_options={"time_scale": float("inf")}),
        ["time_scale", "finite number > 0"],
    ),
    (
        "provider",
        lambda: SpotConfiguration(provider_options={"start_tick": -1}),
        ["start_tick", ">= 0"],
    ),
    (
        "provider",
        lambda: SpotConfiguration(provider="ec2", provider_options={**EC2, "colour": 1}),
        ["unknown ec2 provider option", "colour"],
    ),
    (
        "provider",
        lambda: SpotConfiguration(
            provider="ec2", provider_options={**EC2, "aws_secret_access_key": "x"}
        ),
        ["aws_secret_access_key"],
    ),
    (
        "provider",
        lambda: SpotConfiguration(
            provider="ec2", provider_options={"image_id": "a", "instance_types": ["g"]}
        ),
        ["subnets"],
    ),
    # the spot worker's variables and job configuration
    ("worker", lambda: SpotJobVariables(max_preemptions=-1), ["max_preemptions", ">= 0"]),
    (
        "worker",
        lambda: SpotJobVariables(checkpoint_root="ckpt"),
        ["checkpoint_root", "file:///absolute/path"],
    ),
    ("worker", lambda: SpotJobVariables(checkpoint_root="ftp://x/y"), ["checkpoint_root", "ftp"]),
    (
        "worker",
        lambda: SpotJobVariables(
            provider="ec2", provider_options=EC2, checkpoint_root="file:///tmp/x"
        ),
        ["checkpoint_root", "s3://bucket/prefix"],
    ),
    ("worker", lambda: SpotJobConfiguration(max_spot_price=float("nan")), ["max_spot_price"]),
    ("worker", lambda: SpotJobConfiguration(attempt_timeout="soon"), ["attempt_timeout", "'2h'"]),
    # CheckpointStorage URIs and options
    ("storage", lambda: CheckpointStorage(uri="ckpt"), ["no scheme", "file:///absolute/path"]),
    (
        "storage",
        lambda: CheckpointStorage(uri="file://otherhost/x"),
        ["otherhost", "three slashes"],
    ),
    ("storage", lambda: CheckpointStorage(uri="s3://"), ["no bucket", "s3://bucket/prefix"]),
    ("storage", lambda: CheckpointStorage(uri="http://x/y"), ["'http'", "s3://bucket/prefix"]),
    ("storage", lambda: CheckpointStorage(uri="file:///tmp/a\x00b"), ["NUL", "remove it"]),
    (
        "storage",
        lambda: CheckpointStorage(uri="s3://b/p", options={"aws_secret_access_key": "x"}),
        ["aws_secret_access_key", "credentials", "instance role"],
    ),
    (
        "storage",
        lambda: CheckpointStorage(uri="s3://b/p", options={"colour": 1}),
        ["colour", "choose from"],
    ),
    (
        "storage",
        lambda: CheckpointStorage(uri="file:///tmp/x", options={"region": "eu"}),
        ["s3:// stores only", "remove them"],
    ),
    # spot_task options
    ("spot_task", lambda: spot_task(retries=-1), ["retries", ">= 0"]),
    ("spot_task", lambda: spot_task(max_preemptions=-1), ["max_preemptions", ">= 0"]),
    ("spot_task", lambda: spot_task(checkpoint_every=0), ["checkpoint_every", "> 0"]),
    ("spot_task", lambda: spot_task(checkpoint_every="5 parsecs"), ["checkpoint_every", "'5m'"]),
    ("spot_task", lambda: spot_task(checkpoint_every_steps=0), ["checkpoint_every_steps", ">= 1"]),
    ("spot_task", lambda: spot_task(notice_poll_interval=float("nan")), ["notice_poll_interval"]),
    ("spot_task", lambda: spot_task(lambda x: x), ["checkpointer", "parameter"]),
    (
        "spot_task",
        lambda: spot_task(retry_condition_fn=lambda *a: True)(with_checkpointer),
        ["retry_condition_fn", "drop"],
    ),
    (
        "spot_task",
        lambda: spot_task(checkpoint_storage="ftp://x")(with_checkpointer),
        ["checkpoint_storage", "'ftp'", "s3://bucket/prefix"],
    ),
    # SpotTaskRunner arguments
    ("runner", lambda: SpotTaskRunner(checkpoint_every=-1), ["checkpoint_every", "> 0"]),
    ("runner", lambda: SpotTaskRunner(checkpoint_every_steps="ten"), ["checkpoint_every_steps"]),
    ("runner", lambda: SpotTaskRunner(max_workers=0), ["max_workers", ">= 1"]),
    ("runner", lambda: SpotTaskRunner(max_workers=True), ["max_workers", ">= 1"]),
    (
        "runner",
        lambda: SpotTaskRunner(checkpoint_storage="ftp://x"),
        ["checkpoint_storage", "'ftp'"],
    ),
    ("runner", lambda: SpotTaskRunner(checkpoint_storage=""), ["checkpoint_storage", "store URI"]),
    ("runner", lambda: SpotTaskRunner(config=5), ["config", "SpotConfiguration"]),
    ("runner", lambda: SpotTaskRunner(spot_tag=""), ["spot_tag", "tag name"]),
    ("runner", lambda: SpotTaskRunner(colour=1), ["colour"]),
]
IDS = [f"{surface}-{i}" for i, (surface, _, _) in enumerate(CASES)]


@pytest.mark.parametrize("surface, build, words", CASES, ids=IDS)
def test_bad_input_is_one_line_naming_the_field_and_the_fix(
    surface, build, words, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises((ConfigError, ValueError, TypeError)) as caught:
        build()
    message = _message(caught.value)
    assert "\n" not in message and "Traceback" not in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert list(tmp_path.iterdir()) == [], "nothing is created for bad input"


# -- the record in Prefect -------------------------------------------------------------------------
POOL = Pool("local", "us-east-1", "us-east-1a", "p3.2xlarge")


def long_record(attempts: int) -> JobRecord:
    """A record of ``attempts`` closed attempts, as a long job under many preemptions."""
    record = JobRecord(job_id="long-job", created_at=1_000.0)
    for n in range(1, attempts + 1):
        running = Attempt(
            number=n,
            pool=POOL,
            started_at=1_000.0 + n * 10,
            lease_id=f"i-{n:08x}",
            checkpoint_step_start=(n - 1) * 100,
        )
        record = record.start_attempt(running).finish_attempt(
            Attempt(
                number=n,
                pool=POOL
                if n < attempts
                else Pool(**{**POOL.__dict__, "market": Market.ON_DEMAND}),
                started_at=running.started_at,
                lease_id=running.lease_id,
                ended_at=running.started_at + 9,
                cost=0.01 * n,
                on_demand_cost=0.03 * n,
                outcome=Outcome.PREEMPTED if n < attempts else Outcome.SUCCEEDED,
                checkpoint_step_start=(n - 1) * 100,
                checkpoint_step_end=n * 100,
                lost_work_seconds=1.5,
                message=f"reclaimed in us-east-1a (attempt {n}) " * 3,
            )
        )
    return record


def test_a_record_of_100_attempts_round_trips_through_prefect(prefect_api):
    record = long_record(100)
    assert len(record.to_json()) > 5_000 * 10, "far beyond a Variable's 5,000 characters"
    key = record_key(uuid.uuid4())
    save_record(key, record)
    assert load_record(key) == record
    save_record(key, long_record(101))  # a newer version of the same key is the record
    assert len(load_record(key).attempts) == 101


def test_a_failed_record_write_is_one_clear_error(prefect_api):
    with temporary_settings({PREFECT_API_URL: DEAD_API}):
        with pytest.raises(RecordNotSaved) as caught:
            save_record(record_key(uuid.uuid4()), long_record(1))
    message = str(caught.value)
    assert "\n" not in message and "long-job" in message and "PREFECT_API_URL" in message


def _local_controller(tmp_path, persist):
    config = SpotConfiguration(
        provider_options={"start_tick": 600, "time_scale": 60.0},
        zones=["us-west-2b"],
        poll_interval=0.1,
    )
    provider = _jobs.open_configured_provider(config, workdir=str(tmp_path / "cloud"))
    spec = _jobs.job_spec(
        config,
        provider,
        job_id=f"rec-{uuid.uuid4().hex[:8]}",
        command=("sleep", "60"),
        checkpoint_uri=(tmp_path / "ckpt").as_uri(),
        env={"SPOT_TEST_MARK": str(tmp_path)},
    )
    return provider, spec, _jobs.controller_for(config, provider, persist=persist)


def test_the_record_names_the_lease_before_the_driver_watches_it(prefect_api, tmp_path):
    key = record_key(uuid.uuid4())
    provider, spec, controller = _local_controller(tmp_path, lambda r: save_record(key, r))
    with provider:
        nxt = controller.advance(spec, controller.persist(controller.new_record(spec)))
        assert nxt.action == "watch"
        kept = load_record(key)  # what another worker would resume from, already there
        assert kept.current_attempt is not None
        assert kept.current_attempt.lease_id == nxt.lease.lease_id
        record = controller.stop(spec, nxt.record, "stopped: test over")
        assert load_record(key) == record and record.current_attempt is None


def test_a_lease_whose_record_cannot_be_saved_is_terminated_and_the_driver_stops(
    prefect_api, tmp_path
):
    key = record_key(uuid.uuid4())

    def persist(record: JobRecord) -> None:
        if not record.attempts:
            save_record(key, record)
            return
        with temporary_settings({PREFECT_API_URL: DEAD_API}):  # Prefect goes away
            save_record(key, record)

    provider, spec, controller = _local_controller(tmp_path, persist)
    with provider:
        with pytest.raises(RecordNotSaved, match="the job stops"):
            controller.run(spec)
        assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=20), (
            "the launched lease was terminated"
        )
    assert load_record(key).attempts == ()  # the last record Prefect took


def test_the_worker_stops_on_a_failed_record_write(prefect_api):
    from prefect.client.schemas.objects import FlowRun

    from prefect_spot.workers import SpotWorker

    worker = SpotWorker(work_pool_name="never-started")
    flow_run = FlowRun(id=uuid.uuid4(), name="run", flow_id=uuid.uuid4())
    with temporary_settings({PREFECT_API_URL: DEAD_API}):
        with pytest.raises(RecordNotSaved):
            worker._remember(flow_run, long_record(1))
    assert worker._records == {}, "the worker does not go on from an unsaved record"


@pytest.mark.parametrize(
    "data",
    ["not json {", "[1, 2]", {"attempts": "x"}, {"schema_version": 99}, "[" * 5000 + "]" * 5000],
)
def test_a_damaged_record_is_one_clear_error(prefect_api, data):
    from prefect import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    key = record_key(uuid.uuid4())
    with get_client(sync_client=True) as client:
        client.create_artifact(ArtifactCreate(key=key, type=RECORD_TYPE, data=data))
    with pytest.raises(CorruptRecord) as caught:
        load_record(key)
    message = str(caught.value)
    assert "\n" not in message and f"prefect artifact delete {key}" in message


@task
def double(x: int) -> int:
    return 2 * x


def test_a_task_run_leaves_its_record_artifact_and_no_variable(prefect_api, tmp_path):
    from prefect import get_client

    config = SpotConfiguration(
        provider_options={"start_tick": 600}, zones=["us-west-2b"], poll_interval=0.1
    )

    @flow(task_runner=SpotTaskRunner(config, workdir=tmp_path / "runner"))
    def pipeline():
        future = double.submit(21)
        return future.result(), future.task_run_id

    with get_client(sync_client=True) as client:
        before = {v.name for v in client.read_variables()}
    started = time.time()
    value, task_run_id = pipeline()
    assert value == 42
    with get_client(sync_client=True) as client:
        assert {v.name for v in client.read_variables()} == before, "no Variable is left"
    record = load_record(record_key(task_run_id))
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED
    assert record.attempts[-1].started_at >= started - 1
    assert not list((tmp_path / "runner" / "jobs").rglob("*.pkl")), "the call is deleted"
