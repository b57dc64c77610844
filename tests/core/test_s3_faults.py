"""The S3 store through a fault proxy between boto3 and moto: answers cut short, stalled
or lost on the way back, as a network breaks them after the server did its part.

What the user cares about: a cut read is never taken for the object (a cut fence never
unfences a stale writer; a cut checkpoint is skipped by ``latest()`` and is a retryable
store error from ``load()``), a store that stops answering fails a call within its
deadline, a save whose lock PUT lost its answer does not wait out its own lock, and an
``s3://`` prefix names one store however its slashes are written.
"""

from __future__ import annotations

import logging
import time

import pytest

from spot_core.checkpoint import open_store
from spot_core.errors import CheckpointError, ConfigError, CorruptCheckpoint
from tests.support.aws_helpers import client, unique
from tests.support.fault_proxy import FaultProxy

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def bucket(aws_env) -> str:
    name = unique("faults")
    client("s3", aws_env).create_bucket(Bucket=name)
    return name


def _store_error(excinfo) -> None:
    """The store's own error: retryable, not a claim that the checkpoint is corrupt, and
    not botocore's raw exception."""
    exc = excinfo.value
    assert exc.retryable, exc
    assert not isinstance(exc, CorruptCheckpoint), exc
    assert type(exc).__module__.startswith("spot_core"), type(exc)


def test_a_cut_fence_fences_the_stale_writer(aws_env, bucket):
    uri = f"s3://{bucket}/jobs/j1"
    fencer = open_store(uri)
    fencer.save(1, {"model.bin": b"1" * 500}, attempt=1)
    fencer.fence(2)  # attempt 2 started; attempt 1 is a zombie from now on
    with FaultProxy(aws_env, match="FENCE.json", methods=("GET",)) as proxy:
        proxy.mode = "cut"
        zombie = open_store(uri, endpoint_url=proxy.url)
        with pytest.raises(CheckpointError):
            zombie.save(2, {"model.bin": b"zombie" * 100}, attempt=1)
        assert proxy.failed, "the proxy cut the fence's answer"
    assert [(r.step, r.attempt) for r in fencer.list()] == [(1, 1)], "nothing committed"
    fencer.save(2, {"model.bin": b"2" * 500}, attempt=2)
    latest = fencer.latest()
    assert (latest.step, latest.attempt) == (2, 2)
    assert fencer.load(latest) == {"model.bin": b"2" * 500}


@pytest.fixture
def two(aws_env, bucket):
    """A store with checkpoints at steps 1 and 2, and the id of step 2's."""
    store = open_store(f"s3://{bucket}/jobs/j1")
    store.save(1, {"model.bin": b"1" * 4000})
    ref = store.save(2, {"model.bin": b"2" * 4000})
    return f"s3://{bucket}/jobs/j1", ref.checkpoint_id


@pytest.mark.parametrize("part", ["model.bin", "MANIFEST.json"])
def test_a_cut_newest_checkpoint_falls_back_with_a_warning(aws_env, two, part, caplog):
    uri, newest = two
    with FaultProxy(aws_env, match=f"{newest}/{part}", methods=("GET",)) as proxy:
        proxy.mode = "cut"
        store = open_store(uri, endpoint_url=proxy.url)
        with caplog.at_level(logging.WARNING, logger="spot_core.checkpoint"):
            ref = store.latest()
        assert proxy.failed
    assert ref.step == 1
    assert store.load(ref) == {"model.bin": b"1" * 4000}
    warnings = [r for r in caplog.records if newest in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("part", ["model.bin", "MANIFEST.json"])
@pytest.mark.parametrize("how", ["load", "load_concurrently"])
def test_loading_a_cut_checkpoint_is_a_retryable_store_error(aws_env, two, part, how):
    uri, newest = two
    ref = open_store(uri).latest()
    assert ref.checkpoint_id == newest
    with FaultProxy(aws_env, match=f"{newest}/{part}", methods=("GET",)) as proxy:
        proxy.mode = "cut"
        store = open_store(uri, endpoint_url=proxy.url)
        with pytest.raises(CheckpointError) as excinfo:
            getattr(store, how)(ref)
    _store_error(excinfo)
    assert open_store(uri).load(ref) == {"model.bin": b"2" * 4000}, "the object is whole"


DEADLINE_SECONDS = 2.0


@pytest.mark.parametrize("call", ["load", "fence"])
def test_a_stalled_store_fails_a_call_within_its_deadline(aws_env, two, call):
    uri, _ = two
    ref = open_store(uri).latest()
    with FaultProxy(aws_env, delay=60) as proxy:
        store = open_store(uri, endpoint_url=proxy.url, call_deadline_seconds=DEADLINE_SECONDS)
        proxy.mode = "stall"
        started = time.monotonic()
        with pytest.raises(CheckpointError) as excinfo:
            store.load(ref) if call == "load" else store.fence(5)
        took = time.monotonic() - started
        proxy.mode = None
    _store_error(excinfo)
    assert took < 3 * DEADLINE_SECONDS, f"{call} took {took:.1f}s"
    assert open_store(uri).fence_level() == 1, "nothing was fenced"


def test_a_lost_answer_to_the_lock_put_does_not_wait_out_the_lock(aws_env, bucket):
    uri = f"s3://{bucket}/jobs/j1"
    lock_ttl = 20.0
    with FaultProxy(aws_env, match=".spot-lock", methods=("PUT",), times=1) as proxy:
        proxy.mode = "drop"
        store = open_store(uri, endpoint_url=proxy.url, lock_ttl=lock_ttl)
        started = time.monotonic()
        store.save(1, {"model.bin": b"1" * 500})
        took = time.monotonic() - started
        assert proxy.failed == 1, "the first lock PUT's answer was lost"
    assert took < lock_ttl / 2, f"the save waited {took:.1f}s for its own lock"
    assert open_store(uri).latest().step == 1


@pytest.mark.parametrize("spelling", ["jobs//train", "jobs/train/", "/jobs///train//"])
def test_an_s3_prefix_names_one_store_however_its_slashes_are_written(aws_env, bucket, spelling):
    open_store(f"s3://{bucket}/jobs/train").save(3, {"model.bin": b"3"})
    store = open_store(f"s3://{bucket}/{spelling}")
    assert store.uri == f"s3://{bucket}/jobs/train"
    assert store.latest().step == 3


@pytest.mark.parametrize("prefix", ["jobs/./train", "jobs/../train", ".."])
def test_an_s3_prefix_with_dot_segments_is_refused_in_one_line(prefix):
    with pytest.raises(ConfigError) as excinfo:
        open_store(f"s3://bucket/{prefix}")
    message = str(excinfo.value)
    assert "\n" not in message and "'..'" in message and "s3://bucket/jobs/train" in message
