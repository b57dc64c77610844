"""``CheckpointStore.swap_object``: of several writers swapping the same object from the same
content at once, exactly one wins, on a file root and on S3 (moto server). It is how two
Prefect workers that find the same orphaned flow run agree which of them adopts it."""

from __future__ import annotations

import threading

import pytest

from spot_core.checkpoint import open_store
from tests.support.aws_helpers import client, unique

pytestmark = pytest.mark.timeout(120)
WRITERS = 8


@pytest.fixture(params=["file", "s3"])
def uri(request, tmp_path):
    if request.param == "file":
        return (tmp_path / "job").as_uri()
    aws_env = request.getfixturevalue("aws_env")
    bucket = unique("swap")
    client("s3", aws_env).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/jobs/j1"


def _race(uri: str, expected: bytes | None, name: bytes) -> dict[int, bool]:
    """Every writer, on its own store (its own client or file descriptor), swaps at once."""
    stores = [open_store(uri) for _ in range(WRITERS)]
    start, won = threading.Barrier(WRITERS), {}

    def swap(i: int) -> None:
        start.wait(timeout=30)
        won[i] = stores[i].swap_object("adoption/attempt-000001.json", expected, name + b" %d" % i)

    threads = [threading.Thread(target=swap, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(won) == WRITERS, "a writer hung"
    return won


def test_of_writers_racing_from_the_same_content_exactly_one_wins(uri):
    store = open_store(uri)
    won = _race(uri, None, b"writer")  # nothing there yet
    [winner] = [i for i, ok in won.items() if ok]
    assert store.get_object("adoption/attempt-000001.json") == b"writer %d" % winner

    won = _race(uri, b"writer %d" % winner, b"taker")  # all take over the claim at once
    [second] = [i for i, ok in won.items() if ok]
    assert store.get_object("adoption/attempt-000001.json") == b"taker %d" % second


def test_a_swap_from_stale_content_writes_nothing(uri):
    store = open_store(uri)
    assert store.swap_object("adoption/attempt-000002.json", None, b"first")
    assert not store.swap_object("adoption/attempt-000002.json", None, b"second")
    assert not store.swap_object("adoption/attempt-000002.json", b"other", b"third")
    assert store.get_object("adoption/attempt-000002.json") == b"first"
    assert store.list() == [] and store.latest() is None  # beside the checkpoints, not in them
