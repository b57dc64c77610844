"""The S3 checkpoint store against moto in server mode: the file store's contract on S3.

Round trip, multipart for large payloads, server-side encryption, torn and damaged
checkpoints skipped, fencing of a zombie writer, and SIGKILL crash consistency.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.checkpoint.s3_backend import LOCK_NAME
from spot_core.errors import CorruptCheckpoint, FencedOut
from tests.support import SUPPORT
from tests.support.aws_helpers import client, unique
from tests.support.spot_helpers import ZOMBIE_WRITER

pytestmark = pytest.mark.timeout(120)
BUCKET = "ckpt"  # plus a per-test suffix: see the s3 fixture


@pytest.fixture
def s3(aws_env, monkeypatch):
    global BUCKET
    name = unique("ckpt")
    monkeypatch.setattr(sys.modules[__name__], "BUCKET", name)
    s3 = client("s3", aws_env)
    s3.create_bucket(Bucket=name)
    return s3


@pytest.fixture
def store(s3) -> CheckpointStore:
    return open_store(f"s3://{BUCKET}/jobs/j1")


def _keys(s3, prefix: str = "") -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


def _key_of(store: CheckpointStore, step: int, name: str) -> str:
    [ref] = [r for r in store.list() if r.step == step]
    return f"jobs/j1/checkpoints/{ref.checkpoint_id}/{name}"


def test_round_trip_latest_prune_and_sse(store, s3):
    assert store.latest() is None
    for step in (1, 2, 3):
        store.save(step, {"model.bin": bytes([step]) * 1000, "opt/state.bin": b"o"}, {"n": step})
    ref = store.latest()
    assert (ref.step, ref.metadata, ref.store_uri) == (3, {"n": 3}, f"s3://{BUCKET}/jobs/j1")
    assert store.load(ref) == {"model.bin": b"\x03" * 1000, "opt/state.bin": b"o"}
    head = s3.head_object(Bucket=BUCKET, Key=_key_of(store, 3, "model.bin"))
    assert head["ServerSideEncryption"] == "AES256"
    assert store.prune(keep=2) and [r.step for r in store.list()] == [2, 3]
    assert not any(LOCK_NAME in k for k in _keys(s3)), "the lock is released"


def test_large_payload_goes_up_in_parts_and_streams_back(store, s3, tmp_path):
    big = random.Random(5).randbytes(37 << 20)  # five 8 MiB parts, the last one short
    source = tmp_path / "big.bin"
    source.write_bytes(big)
    ref = store.save(7, {"weights.bin": source, "small": b"x"})
    head = s3.head_object(Bucket=BUCKET, Key=_key_of(store, 7, "weights.bin"))
    assert head["ContentLength"] == len(big) and head["ETag"].strip('"').endswith("-5")
    out = store.load_to_dir(ref, tmp_path / "out")
    assert (
        hashlib.sha256(Path(out["weights.bin"]).read_bytes()).digest()
        == hashlib.sha256(big).digest()
    )
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_failed_streamed_save_aborts_the_upload_and_leaves_nothing(store, s3):
    def chunks():
        yield b"a" * (20 << 20)
        raise RuntimeError("source broke")

    class Broken:
        def read(self, n=-1, _it=chunks()):
            return next(_it)

    with pytest.raises(RuntimeError, match="source broke"):
        store.save(1, {"w.bin": Broken()})
    assert store.latest() is None and store.list() == []
    assert not [k for k in _keys(s3) if "/checkpoints/" in k]
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


@pytest.fixture
def two(store) -> CheckpointStore:
    store.save(1, {"model.bin": b"one" * 1000, "opt/state.bin": b"o1"}, {"n": 1})
    store.save(2, {"model.bin": b"two" * 1000, "opt/state.bin": b"o2"}, {"n": 2})
    return store


def test_flipped_payload_byte_fails_load_and_latest_falls_back(two, s3):
    newest = two.latest()
    key = _key_of(two, 2, "model.bin")
    data = bytearray(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    data[100] ^= 1
    s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))
    with pytest.raises(CorruptCheckpoint, match="'model.bin'"):
        two.load(newest)
    with pytest.raises(CorruptCheckpoint, match="'model.bin'"):  # as its chunks stream in
        open_store(two.uri).load_concurrently(newest)
    assert two.latest().step == 1
    older = two.latest()
    assert two.load_concurrently(older) == two.load(older)  # files at once, the same bytes


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_damaged_manifest_is_skipped(two, s3, damage):
    key = _key_of(two, 2, "MANIFEST.json")
    text = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    if damage == "delete":
        s3.delete_object(Bucket=BUCKET, Key=key)
    else:
        s3.put_object(
            Bucket=BUCKET,
            Key=key,
            Body=text[: len(text) // 2] if damage == "truncate" else b"\x00 not json",
        )
    assert two.latest().step == 1
    assert [r.step for r in two.list()] == [1]


def test_missing_payload_object_is_skipped(two, s3):
    s3.delete_object(Bucket=BUCKET, Key=_key_of(two, 2, "opt/state.bin"))
    assert two.latest().step == 1


def test_fence_refuses_older_attempts(store):
    store.save(1, {"a": b"1"}, attempt=1)
    store.fence(2)
    with pytest.raises(FencedOut):
        store.save(2, {"a": b"zombie"}, attempt=1)
    store.save(3, {"a": b"new"}, attempt=2)
    with pytest.raises(FencedOut):
        store.fence(1)
    assert store.fence_level() == 2


def test_stale_lock_of_a_dead_writer_expires(s3):
    store = open_store(f"s3://{BUCKET}/jobs/j1", lock_ttl=0.5)
    s3.put_object(
        Bucket=BUCKET, Key=f"jobs/j1/{LOCK_NAME}", Body=b'{"owner": "dead", "expires_at": 0}'
    )
    store.save(1, {"a": b"1"})
    assert store.latest().step == 1


def test_zombie_writer_process_is_fenced_by_the_new_attempt(store):
    proc = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE_WRITER, store.uri], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while not any(r.attempt == 1 for r in store.list()):
            assert time.monotonic() < deadline and proc.poll() is None, "zombie never saved"
            time.sleep(0.02)
        store.fence(2)
        committed_at_fence = {r.checkpoint_id for r in store.list() if r.attempt == 1}
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out.startswith("fenced")
    assert {r.checkpoint_id for r in store.list() if r.attempt == 1} <= committed_at_fence
    store.save(10**6, {"a": b"resumed"}, attempt=2)
    assert store.load(store.latest()) == {"a": b"resumed"}


def _writer_module():
    spec = importlib.util.spec_from_file_location(
        "checkpoint_writer", SUPPORT / "checkpoint_writer.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sigkill_at_random_moments_never_leaves_a_bad_latest(store, monkeypatch):
    _kill_trials(store, monkeypatch, trials=12)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkill_hundred_trials(store, monkeypatch):
    _kill_trials(store, monkeypatch, trials=100)


def _kill_trials(store, monkeypatch, trials: int) -> None:
    # A killed writer leaves its lock behind until it expires; keep that short here.
    monkeypatch.setenv("SPOT_S3_LOCK_TTL", "0.5")
    writer = _writer_module()
    payload_for = writer.payload_for
    rng = random.Random(99)
    newest_seen, progressed, committing = 0, 0, 0
    for _ in range(trials):
        proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "checkpoint_writer.py"), store.uri],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().startswith("ready")
        # Half the trials let a save return first (kills then land in a later save),
        # whatever the machine's load; a returned save must survive the kill.
        saves = rng.choice((0, 0, 1, 2))
        returned = writer.wait_for_saves(proc, saves)
        committing += saves > 0
        time.sleep(rng.uniform(0, 0.8))
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        ref = store.latest()
        assert (ref.step if ref else 0) >= returned, f"returned save {returned} was lost"
        if ref is None:
            continue
        assert store.load(ref) == payload_for(ref.step), f"step {ref.step} payload differs"
        assert ref.step >= newest_seen, "a committed checkpoint disappeared after a crash"
        progressed += ref.step > newest_seen
        newest_seen = ref.step
    steps = [r.step for r in store.list()]
    assert steps == sorted(steps) and len(steps) == len(set(steps))
    assert progressed >= committing > trials // 4, (progressed, committing)
