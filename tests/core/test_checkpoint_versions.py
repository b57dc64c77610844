"""A checkpoint version written by many writers (the ranks of a distributed job), on a file
and an S3 store (moto): it commits only when every part is durable, through one manifest
naming every part and its digest, written once; until then readers see the previous
version; a fenced attempt never commits; a crash at any moment loses nothing committed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.checkpoint.digests import hex_of
from spot_core.checkpoint.manifest import checkpoint_key
from spot_core.checkpoint.names import MANIFEST_NAME
from spot_core.errors import CheckpointError, ConfigError, FencedOut
from tests.support.aws_helpers import client, unique

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path) -> CheckpointStore:
    if request.param == "file":
        return open_store(f"file://{tmp_path}/store")
    endpoint = request.getfixturevalue("aws_env")
    name = unique("versions")
    client("s3", endpoint).create_bucket(Bucket=name)
    return open_store(f"s3://{name}/jobs/j1")


def shard(rank: int, step: int) -> bytes:
    return bytes([rank, step % 256]) * (1000 + rank)


def write_ranks(store: CheckpointStore, version: str, ranks: int, step: int) -> dict:
    """Each rank's part written at once from its own thread, as ranks on their own nodes."""

    def write(rank: int):
        return f"rank-{rank}.bin", store.write_part(version, f"rank-{rank}.bin", shard(rank, step))

    with ThreadPoolExecutor(ranks) as pool:
        return dict(pool.map(write, range(ranks)))


def test_parts_of_many_writers_commit_as_one_version(store):
    previous = store.save(5, {"model.bin": b"old"})
    version = store.begin_version(10, attempt=1)
    parts = write_ranks(store, version, 4, 10)
    assert store.latest() == previous  # written, not committed: invisible

    ref = store.commit_version(version, parts, {"world_size": 4})
    assert store.latest() == ref and ref.step == 10 and ref.metadata == {"world_size": 4}
    payload = store.load(ref)
    assert payload == {f"rank-{r}.bin": shard(r, 10) for r in range(4)}
    manifest = json.loads(store.backend.get_bytes(checkpoint_key(version, MANIFEST_NAME)))
    for rank in range(4):
        entry = manifest["files"][f"rank-{rank}.bin"]
        assert entry == {"size": len(shard(rank, 10)), "blake3": hex_of("blake3", shard(rank, 10))}
    assert store.read_part(ref, "rank-2.bin") == shard(2, 10)


def test_a_missing_part_never_commits(store):
    previous = store.save(5, {"model.bin": b"old"})
    version = store.begin_version(10)
    parts = write_ranks(store, version, 3, 10)
    lost = store.write_part(version, "rank-3.bin", shard(3, 10))
    store.backend.delete(checkpoint_key(version, "rank-3.bin"))  # that rank's node is gone
    with pytest.raises(CheckpointError, match="rank-3.bin"):
        store.commit_version(version, {**parts, "rank-3.bin": lost})
    assert store.latest() == previous
    assert [r.checkpoint_id for r in store.list()] == [previous.checkpoint_id]


def test_a_part_torn_after_commit_is_never_returned(store):
    previous = store.save(5, {"model.bin": b"old"})
    version = store.begin_version(10)
    ref = store.commit_version(version, write_ranks(store, version, 3, 10))
    torn = bytearray(shard(1, 10))
    torn[7] ^= 0xFF  # same size, other bytes: only its digest tells
    store.backend.put_bytes(checkpoint_key(version, "rank-1.bin"), bytes(torn))
    assert store.latest() == previous
    assert ref in store.list()  # listed (cheap), but never returned as the newest valid one


def test_a_zombie_fenced_between_its_parts_and_its_commit_commits_nothing(store):
    previous = store.save(5, {"model.bin": b"old"}, attempt=1)
    version = store.begin_version(10, attempt=1)
    parts = write_ranks(store, version, 3, 10)
    store.fence(2)  # the replacement started while the old ranks were writing
    with pytest.raises(FencedOut):
        store.commit_version(version, parts)
    assert store.latest() == previous
    with pytest.raises(FencedOut):  # and a new save of the zombie is refused up front
        store.begin_version(20, attempt=1)


def test_a_version_commits_once(store):
    version = store.begin_version(10)
    parts = write_ranks(store, version, 2, 10)
    ref = store.commit_version(version, parts, {"first": True})
    with pytest.raises(CheckpointError, match="already committed"):
        store.commit_version(version, parts, {"first": False})
    assert store.latest() == ref and store.latest().metadata == {"first": True}


def test_abandon_removes_parts_but_never_a_committed_version(store):
    committed = store.begin_version(10)
    ref = store.commit_version(committed, write_ranks(store, committed, 2, 10))
    failed = store.begin_version(20)
    write_ranks(store, failed, 2, 20)
    store.abandon_version(failed)
    store.abandon_version(committed)
    assert store.latest() == ref
    assert store.load(ref) == {f"rank-{r}.bin": shard(r, 10) for r in range(2)}
    assert not store.backend.exists(checkpoint_key(failed, "rank-0.bin"))


def test_bad_input_is_one_clear_error(store):
    with pytest.raises(ConfigError, match="begin_version"):
        store.write_part("not-a-version", "a.bin", b"x")
    version = store.begin_version(1)
    with pytest.raises(ConfigError, match="payload name"):
        store.write_part(version, "../escape", b"x")
    with pytest.raises(ConfigError, match="write_part"):
        store.commit_version(version, {})
    with pytest.raises(ConfigError, match="FileEntry"):
        store.commit_version(version, {"a.bin": "deadbeef"})


RANK_THEN_HANG = textwrap.dedent(
    """
    import sys, time
    from spot_core.checkpoint import open_store
    store = open_store(sys.argv[1])
    version = store.begin_version(20, attempt=1)
    for rank in range(3):
        store.write_part(version, f"rank-{rank}.bin", bytes([rank]) * 200_000)
        print(rank, flush=True)
    time.sleep(60)  # killed here, or earlier: before its commit
    """
)


def test_a_writer_killed_at_any_moment_leaves_the_previous_version(store):
    previous = store.save(10, {"model.bin": b"old"}, attempt=1)
    for parts_before_kill in (0, 2, 3):
        writer = subprocess.Popen(
            [sys.executable, "-c", RANK_THEN_HANG, store.uri],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )
        for _ in range(parts_before_kill):
            assert writer.stdout.readline().strip() != ""
        if parts_before_kill == 0:
            time.sleep(0.2)  # mid-import or mid-write of the first part
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        writer.stdout.close()
        assert store.latest() == previous
        assert [r.checkpoint_id for r in store.list()] == [previous.checkpoint_id]
    newer = store.save(30, {"model.bin": b"new"}, attempt=1)
    store.prune(keep=3)  # the torn versions below the newest commit go
    assert [r.checkpoint_id for r in store.list()] == [previous.checkpoint_id, newer.checkpoint_id]
    assert len(store.backend.children("checkpoints")) == 2
