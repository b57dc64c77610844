"""The batch work queue: every unit's output exactly once, whatever takes workers away.

Workers race for units on a file store and on S3 (moto server); a worker that vanishes
mid-unit has its unit taken over once its claim's heartbeat lapses; a worker that stalled
past its claim and wakes up cannot make its output the unit's; the user's code failing
spends that unit's retries only; a notice releases the unit with its progress saved, and
the next claim resumes from it without running an item twice. The result is compared
with a plain loop over the same items.
"""

from __future__ import annotations

import threading

import pytest

from spot_core.errors import ConfigError, Preempted
from spot_core.workloads.batch import (
    CLAIMED,
    DONE,
    FAILED,
    ItemRange,
    Manifest,
    WorkQueue,
    outputs_sha256,
)
from spot_core.workloads.batch_inference import infer
from spot_core.workloads.batch_worker import Stop, run_worker
from tests.support.aws_helpers import client, unique

pytestmark = pytest.mark.timeout(180)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def plain(queue: WorkQueue) -> str:
    """The same batch as one loop, no queue: what the queue's result must equal."""
    spec = queue.spec
    return outputs_sha256([(u, [infer(i) for i in spec.unit_items(u)]) for u in spec.unit_ids()])


def items_in(queue: WorkQueue) -> list:
    return [o["item"] for _, outs in queue.outputs() for o in outs]


@pytest.fixture(params=["file", "s3"])
def uri(request, tmp_path):
    if request.param == "file":
        return (tmp_path / "queue").as_uri()
    aws_env = request.getfixturevalue("aws_env")
    bucket = unique("batch")
    client("s3", aws_env).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/batches/b1"


def test_workers_racing_over_a_queue_process_every_item_once(uri):
    queue = WorkQueue.create(uri, ItemRange(0, 103), unit_size=10)
    stats = {}

    def work(name: str) -> None:
        stats[name] = run_worker(WorkQueue.open(uri), infer, worker_id=name, poll_seconds=0.05)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(stats) == 3, "a worker hung"
    assert sorted(items_in(queue)) == list(range(103))
    assert sum(s.units_done for s in stats.values()) == 11
    assert sum(s.items_processed for s in stats.values()) == 103
    assert outputs_sha256(queue.outputs()) == plain(queue)
    assert queue.progress().done == 11 and queue.progress().complete


def test_a_vanished_workers_unit_is_taken_over_after_its_heartbeat_lapses(tmp_path):
    clock = Clock()
    uri = (tmp_path / "q").as_uri()
    queue = WorkQueue.create(
        uri,
        Manifest(("s3://in/a", "s3://in/b")),
        unit_size=1,
        claim_timeout_seconds=30,
        clock=clock,
        monotonic=clock,
    )
    dead = queue.claim("dead")  # its lease vanished: it never renews
    assert dead is not None and dead.number == 1
    other = WorkQueue.open(uri, clock=clock, monotonic=clock)
    second = other.claim("w2", start=0)
    assert second is not None and second.unit != dead.unit  # the live claim is respected
    assert other.claim("w2") is None
    clock.now += 31
    taken = other.claim("w2", start=0)
    assert taken is not None and taken.unit == dead.unit and taken.number == 2
    assert other.progress().reclaims == 1
    # the first claimant wakes up (a stall, not a death) and finishes: it loses the swap
    assert not queue.complete(dead, [{"by": "dead"}])
    assert other.complete(taken, [{"by": "w2"}]) and other.complete(second, [{"by": "w2"}])
    assert [o for _, outs in other.outputs() for o in outs] == [{"by": "w2"}, {"by": "w2"}]


def test_renewing_keeps_a_claim_and_a_lost_claim_cannot_be_renewed(tmp_path):
    from spot_core.workloads.batch import LostClaim

    clock = Clock()
    queue = WorkQueue.create(
        (tmp_path / "q").as_uri(),
        ItemRange(0, 1),
        unit_size=1,
        claim_timeout_seconds=10,
        clock=clock,
        monotonic=clock,
    )
    claim = queue.claim("a")
    for _ in range(5):
        clock.now += 8
        claim = queue.renew(claim)
        assert queue.claim("b") is None  # renewed in time: never lapsed
    clock.now += 11
    assert queue.claim("b") is not None
    with pytest.raises(LostClaim):
        queue.renew(claim)


def test_a_failing_item_spends_its_units_retries_not_the_jobs(tmp_path):
    queue = WorkQueue.create(
        (tmp_path / "q").as_uri(), ItemRange(0, 30), unit_size=5, max_unit_retries=2
    )
    calls = {"flaky": 0}

    def process(item):
        if item == 7:  # fails twice, then works: within unit-000001's two retries
            calls["flaky"] += 1
            if calls["flaky"] <= 2:
                raise ValueError("flaky input")
        if item == 23:
            raise ValueError("corrupt input")  # always: unit-000004 fails for good
        return infer(item)

    stats = run_worker(queue, process, worker_id="w", poll_seconds=0.01)
    states = {s.unit: s for s in queue.states()}
    assert states["unit-000001"].state == DONE and states["unit-000001"].failures == 2
    assert states["unit-000004"].state == FAILED and states["unit-000004"].failures == 3
    assert "corrupt input" in states["unit-000004"].errors[-1]
    assert sum(s.state == DONE for s in states.values()) == 5  # the others are unharmed
    assert stats.units_failed == 5 and queue.progress().complete


def test_a_notice_releases_the_unit_and_the_next_claim_resumes_from_its_checkpoint(tmp_path):
    uri = (tmp_path / "q").as_uri()
    queue = WorkQueue.create(uri, ItemRange(0, 40), unit_size=40)
    stop, seen = Stop(), []

    def process(item):
        seen.append(item)
        if item == 24:
            stop.set("notice")  # SIGTERM from the watcher, in the middle of the unit
        return infer(item)

    with pytest.raises(Preempted):
        run_worker(queue, process, worker_id="a", stop=stop, checkpoint_every_items=10)
    assert queue.progress().pending == 1  # released, not lapsed, no retry spent
    second = run_worker(
        WorkQueue.open(uri),
        lambda i: (seen.append(i), infer(i))[1],
        worker_id="b",
        checkpoint_every_items=10,
    )
    assert second.resumed_units == 1
    assert sorted(seen) == list(range(40))  # no item ran twice
    assert outputs_sha256(queue.outputs()) == plain(queue)
    assert [s.failures for s in queue.states()] == [0]


def test_a_queue_refuses_another_spec_and_bad_input_with_one_line(tmp_path):
    uri = (tmp_path / "q").as_uri()
    WorkQueue.create(uri, ItemRange(0, 10), unit_size=2)
    WorkQueue.create(uri, ItemRange(0, 10), unit_size=2)  # the same: a DAG re-run
    with pytest.raises(ConfigError, match="already holds another queue"):
        WorkQueue.create(uri, ItemRange(0, 11), unit_size=2)
    with pytest.raises(ConfigError, match="no work queue"):
        WorkQueue.open((tmp_path / "none").as_uri())
    with pytest.raises(ConfigError, match="unit_size"):
        WorkQueue.create((tmp_path / "r").as_uri(), ItemRange(0, 10), unit_size=0)
    with pytest.raises(ConfigError, match="no items"):
        WorkQueue.create((tmp_path / "r").as_uri(), Manifest(()), unit_size=3)


def test_progress_counts_claimed_and_lapsed_units(tmp_path):
    clock = Clock()
    queue = WorkQueue.create(
        (tmp_path / "q").as_uri(),
        ItemRange(0, 6),
        unit_size=2,
        claim_timeout_seconds=5,
        clock=clock,
        monotonic=clock,
    )
    claim = queue.claim("a")
    assert queue.complete(claim, [1, 2])
    queue.claim("b")
    clock.now += 6
    progress = queue.progress()
    assert (progress.done, progress.claimed, progress.pending, progress.lapsed) == (1, 1, 1, 1)
    assert not progress.complete
    assert {s.state for s in queue.states()} >= {DONE, CLAIMED}


def test_a_stalled_worker_whose_unit_was_taken_over_drops_it_without_crashing(tmp_path):
    """Found by the chaos seeds: the claim lapsed while the worker stalled, the new claim
    fenced the unit's progress store, and the old worker then opened it."""
    from spot_core.checkpoint import open_store
    from spot_core.workloads.batch_worker import WorkerStats, _work_unit

    clock = Clock()
    queue = WorkQueue.create(
        (tmp_path / "q").as_uri(),
        ItemRange(0, 4),
        unit_size=4,
        claim_timeout_seconds=5,
        clock=clock,
        monotonic=clock,
    )
    stalled = queue.claim("a")
    clock.now += 6
    taken = queue.claim("b")
    assert taken is not None and taken.number == 2
    open_store(queue.unit_store_uri(taken.unit)).fence(taken.number)  # b's checkpointer
    stats = WorkerStats()
    _work_unit(queue, stalled, infer, Stop(), stats, every=2)
    assert stats.units_lost == 1 and stats.units_done == 0
    assert [s.state for s in queue.states()] == [CLAIMED]  # still b's
    assert queue.complete(taken, [infer(i) for i in taken.items])
