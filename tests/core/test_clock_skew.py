"""Liveness on one clock: heartbeats, claims and locks are aged on the store's clock (a
file's mtime against a probe's, S3's LastModified against the same response's Date) or on
the reader's own monotonic clock, never this machine's clock against a time another
machine wrote.

Each machine with a wrong clock is a real process whose ``time.time`` runs ahead or
behind (``skewed_clock.py``); the stores are real: a file store and moto in server mode.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from spot_core.checkpoint import open_store
from spot_core.checkpoint.heartbeat import HEARTBEAT_KEY, DriverIdentity, Heartbeat, live_holder
from spot_core.checkpoint.s3_backend import LOCK_NAME, S3Backend
from spot_core.workloads.batch import STATE_PREFIX, ItemRange, WorkQueue
from tests.support import SUPPORT
from tests.support.aws_helpers import client, unique
from tests.support.fault_proxy import FaultProxy
from tests.support.spot_helpers import marked_processes, train_command, wait_until

pytestmark = pytest.mark.timeout(300)

HOOK = str(SUPPORT / "skewed_clock.py")
HEARTBEAT = 60.0  # seconds: no honest beat in these tests goes stale by itself
SLACK = 60.0  # seconds: what a loaded machine may add to a wait
OTHER = DriverIdentity("f" * 32, "other-host", 4242)


def skewed(offset_seconds: float, *args: str, **popen) -> subprocess.Popen:
    """A process of a machine whose clock is ``offset_seconds`` off."""
    env = {**os.environ, "SPOT_TEST_CLOCK_OFFSET": str(offset_seconds)}
    return subprocess.Popen(
        [sys.executable, HOOK, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


@pytest.fixture(params=["file", "s3"])
def root(request, tmp_path) -> str:
    """Where a test's stores live: a folder, or a fresh bucket on moto."""
    if request.param == "file":
        return tmp_path.as_uri()
    endpoint = request.getfixturevalue("aws_env")
    bucket = unique("skew")
    client("s3", endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}"


def written_ago(store, key: str, seconds: float) -> None:
    """A file store's object as if written ``seconds`` ago on the store's clock (its mtime)."""
    path = Path(store.backend.root) / key
    when = path.stat().st_mtime - seconds
    os.utime(path, (when, when))


AGES = """
import sys
from spot_core.checkpoint import open_store

store = open_store(sys.argv[1])
print(store.fence_age(), store.object_age("status/x.json"), store.object_age("status/none"))
"""


def test_ages_read_from_machines_an_hour_off_are_the_stores(tmp_path, root):
    """The primitive: a fence and an object written just now read as seconds old from a
    machine an hour ahead and one an hour behind; an absent object has no age."""
    uri = f"{root}/jobs/ages"
    store = open_store(uri)
    store.fence(3)
    store.put_object("status/x.json", b"{}")
    script = tmp_path / "ages.py"
    script.write_text(AGES)
    for offset in (3600, -3600):
        out, err = skewed(offset, str(script), uri).communicate(timeout=SLACK)
        fence, obj, none = out.split()
        assert float(fence) < 30 and float(obj) < 30 and none == "None", (out, err[-2000:])


# -- one live driver per job -----------------------------------------------------------------
def calm_trace(tmp_path: Path) -> Path:
    path = tmp_path / "us-east-1a_calm.json"
    data = {"gap_seconds": 600, "price_info": {"price": 0.9, "on_demand_price": 3.06}}
    path.write_text(json.dumps({"metadata": data, "data": [0] * 5000}))
    return path


def run_args(tmp_path: Path, uri: str, steps: int) -> list[str]:
    return [
        "-m",
        "spot_core.cli",
        "run",
        "--trace",
        str(calm_trace(tmp_path)),
        "--job-id",
        "twin",
        "--checkpoint-uri",
        uri,
        "--heartbeat-timeout",
        f"{HEARTBEAT:g}s",
        "--json",
        "--",
        *train_command(steps=steps, step_seconds=0.02, every_steps=20),
    ]


def test_a_second_run_from_a_machine_an_hour_ahead_is_refused(tmp_path):
    """The issue's case: the first `run` drives the job on an honest clock; a second `run`
    of the same job from a machine whose clock is 1 h ahead used to read the first one's
    beat as an hour old, launch, and fence it out (two drivers, two attempts at once).
    Now the beat's age is the store's: the second is refused in one line, fences nothing,
    and the first finishes with its one attempt."""
    uri = (tmp_path / "jobs" / "twin").as_uri()  # the local cloud's leases reach no moto
    store = open_store(uri)
    first = skewed(0, *run_args(tmp_path, uri, steps=600), cwd=tmp_path)
    try:
        assert wait_until(
            lambda: store.latest() is not None or first.poll() is not None, timeout=SLACK
        ), "no checkpoint in time"
        assert first.poll() is None, first.communicate(timeout=10)
        level = store.fence_level()
        second = skewed(3600, *run_args(tmp_path, uri, steps=600), cwd=tmp_path)
        out, err = second.communicate(timeout=SLACK * 2)
        assert second.returncode == 2, (out[-2000:], err[-2000:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
        assert "driven by another driver" in lines[0] and "--take-over" in lines[0], lines[0]
        assert store.fence_level() == level, "the refused driver fenced the store"
    finally:
        out, err = first.communicate(timeout=240)
    assert first.returncode == 0, err[-2000:]
    record = json.loads(out.strip().splitlines()[-1])
    assert [a["outcome"] for a in record["attempts"]] == ["succeeded"]
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=SLACK)


HOLDER = """
import sys, time
from spot_core.checkpoint import open_store
from spot_core.checkpoint.heartbeat import live_holder

held = live_holder(open_store(sys.argv[1]), time.time(), timeout=60.0)
print("free" if held is None else held.describe())
"""


def test_a_beat_in_s3_is_aged_on_the_servers_clock(tmp_path, bucket):
    """The same judgement on S3: a beat renewed just now is held for a machine an hour
    ahead (which read it as an hour old), and one older than its timeout (the server's
    LastModified against its Date) is free for a machine an hour behind (which read it as
    not yet written), whatever time the beat says inside."""
    uri = f"s3://{bucket}/jobs/twin"
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    Heartbeat(open_store(uri), timeout=10.0, identity=OTHER).renew(1, time.time())
    out, err = skewed(3600, str(script), uri).communicate(timeout=SLACK)
    assert out.startswith("other-host pid 4242 renewed its heartbeat"), (out, err[-2000:])
    time.sleep(12)  # older than its 10 s timeout on the server's clock (whole seconds)
    out, err = skewed(-3600, str(script), uri).communicate(timeout=SLACK)
    assert out.strip() == "free", (out, err[-2000:])


@pytest.mark.parametrize("renewed_at", [1e12, -1e12])
def test_a_beat_stamped_far_from_now_is_judged_by_the_store(tmp_path, renewed_at):
    """A beat whose writer stamped a time far ahead (a clock set to the year 33658) held
    its job for ever: every later run was refused. Its age is the store's now: stale when
    its object is older than the timeout, held while it is fresh."""
    store = open_store((tmp_path / "ckpt").as_uri())
    Heartbeat(store, timeout=HEARTBEAT, identity=OTHER).renew(1, renewed_at)
    held = live_holder(store, time.time(), timeout=HEARTBEAT, me=DriverIdentity("a", "b", 1))
    assert held is not None and held.age_seconds is not None and held.age_seconds < 5
    written_ago(store, HEARTBEAT_KEY, HEARTBEAT + 10)
    assert live_holder(store, time.time(), timeout=HEARTBEAT) is None


def test_a_beat_from_the_stores_future_is_held_and_says_so(tmp_path):
    """An age the store's clock cannot tell (an mtime a day in its future) is the safe side
    for a second driver: held, and the line says why and names --take-over."""
    store = open_store((tmp_path / "ckpt").as_uri())
    Heartbeat(store, timeout=HEARTBEAT, identity=OTHER).renew(1, time.time())
    written_ago(store, HEARTBEAT_KEY, -86400)
    held = live_holder(store, time.time(), timeout=HEARTBEAT)
    assert held is not None and held.age_seconds is None
    assert "cannot tell" in held.describe()


# -- batch claims ----------------------------------------------------------------------------
WORKER = """
import sys, time
from spot_core.workloads.batch import WorkQueue
from spot_core.workloads.batch_worker import run_worker

uri, name, log = sys.argv[1:4]

def process(item):
    with open(log, "a") as f:  # one line per run of the user's code, before it works
        f.write(f"{name} {item}\\n")
    time.sleep(float(sys.argv[4]))
    return item * 2

stats = run_worker(
    WorkQueue.open(uri), process, worker_id=name, poll_seconds=0.1, idle_timeout_seconds=120
)
print(stats.units_done, stats.units_lost)
"""


def worker(tmp_path: Path, offset: float, uri: str, name: str, item_seconds: float):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    log = tmp_path / "runs.log"
    return skewed(offset, str(script), uri, name, str(log), str(item_seconds))


def runs(tmp_path: Path) -> Counter:
    lines = (tmp_path / "runs.log").read_text().splitlines()
    return Counter(int(line.split()[1]) for line in lines)


def finished(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=SLACK * 3)
    assert proc.returncode == 0, err[-3000:]
    return out


def test_a_worker_a_minute_ahead_takes_no_live_claim_over(tmp_path, root):
    """An honest worker holds a unit and renews it; a worker whose clock is 60 s ahead used
    to read that claim as a minute old and take it over, and the unit's items ran twice.
    Now the claim is aged on the store's clock: every item's code runs once."""
    uri = f"{root}/batches/ahead"
    queue = WorkQueue.create(uri, ItemRange(0, 16), unit_size=16, claim_timeout_seconds=6)
    honest = worker(tmp_path, 0, uri, "honest", 0.5)
    try:  # one unit: the worker ahead has nothing to take but the honest one's claim
        assert wait_until(lambda: queue.progress().claimed >= 1, timeout=SLACK)
        ahead = worker(tmp_path, 60, uri, "ahead", 0.5)
        finished(ahead)
    finally:
        finished(honest)
    assert runs(tmp_path) == Counter(range(16)), runs(tmp_path)
    assert [v for _, outs in queue.outputs() for v in outs] == [2 * i for i in range(16)]
    assert queue.progress().complete and queue.progress().reclaims == 0


def test_a_worker_a_minute_behind_takes_a_lapsed_claim_over_at_once(tmp_path, root):
    """A worker vanished holding a unit. A worker whose clock is 60 s behind used to wait
    for its clock to pass the dead claim's stamp plus the timeout (a minute more); it takes
    the unit over once the claim is older than the timeout on the store's clock."""
    uri = f"{root}/batches/behind"
    queue = WorkQueue.create(uri, ItemRange(0, 4), unit_size=4, claim_timeout_seconds=3)
    assert queue.claim("dead") is not None  # its lease vanished: never renewed
    time.sleep(4.5)  # older than the timeout on every clock (S3's dates are whole seconds)
    started = time.monotonic()
    finished(worker(tmp_path, -60, uri, "behind", 0.0))
    assert time.monotonic() - started < 40, "the lapsed claim waited for the wrong clock"
    assert queue.progress().complete and queue.progress().reclaims == 1
    assert runs(tmp_path) == Counter(range(4))


def _stamp(queue, stamp):
    """The queue's one unit claimed by a dead worker whose object says ``heartbeat_at``
    ``stamp`` (a literal: NaN is no JSON a writer of this project makes)."""
    claim = queue.claim("dead")
    doc = json.loads(claim.raw)
    raw = json.dumps({**doc, "heartbeat_at": 0}).replace(
        '"heartbeat_at": 0', f'"heartbeat_at": {stamp}'
    )
    queue.store.put_object(f"{STATE_PREFIX}/{claim.unit}.json", raw.encode())


def test_a_claim_stamped_far_ahead_lapses(tmp_path, root):
    """A claim whose heartbeat time is far in the future never lapsed: the queue never
    completed. Its age is the store's, whatever it says inside."""
    uri = f"{root}/batches/stamped"
    queue = WorkQueue.create(uri, ItemRange(0, 2), unit_size=2, claim_timeout_seconds=2)
    _stamp(queue, "1e12")
    time.sleep(3.5)
    other = WorkQueue.open(uri)
    taken = other.claim("live")
    assert taken is not None and taken.number == 2
    assert other.complete(taken, [0, 2]) and other.progress().complete


def test_a_claim_stamped_nan_is_corrupt_and_the_queue_still_completes(tmp_path, root, caplog):
    """A claim stamped NaN never lapsed: the queue never completed. No writer of this
    project writes NaN, so the object is corrupt (docs/batch.md): the unit counts as
    failed with one warning, nothing waits on it, and the queue completes."""
    uri = f"{root}/batches/stamped"
    queue = WorkQueue.create(uri, ItemRange(0, 2), unit_size=2, claim_timeout_seconds=2)
    _stamp(queue, "NaN")
    other = WorkQueue.open(uri)
    assert other.claim("live") is None
    progress = other.progress()
    assert progress.complete and progress.corrupt == 1 and progress.failed == 1
    assert any("not a finite time" in r.getMessage() for r in caplog.records)


def test_a_claim_from_the_stores_future_lapses_on_the_readers_clock(tmp_path):
    """An age the store's clock cannot tell (an mtime a day ahead) is timed by the reader's
    own monotonic clock: the claim lapses a timeout after the reader first saw it
    unchanged, never never, and not before."""
    uri = (tmp_path / "q").as_uri()
    queue = WorkQueue.create(uri, ItemRange(0, 2), unit_size=2, claim_timeout_seconds=2)
    claim = queue.claim("dead")
    written_ago(queue.store, f"{STATE_PREFIX}/{claim.unit}.json", -86400)
    other = WorkQueue.open(uri)
    assert other.claim("live") is None  # first seen now: not lapsed by any clock
    assert wait_until(lambda: other.claim("live") is not None, timeout=10)
    assert other.progress().reclaims == 1


# -- the S3 lock -----------------------------------------------------------------------------
LOCKER = """
import sys
from spot_core.checkpoint.s3_backend import S3Backend
from spot_core.errors import CheckpointError

backend = S3Backend(sys.argv[1], "lock", lock_ttl=30, lock_timeout=float(sys.argv[2]))
try:
    with backend.lock():
        print("acquired")
except CheckpointError:
    print("timed out")
"""


@pytest.fixture
def bucket(aws_env) -> str:
    name = unique("lock")
    client("s3", aws_env).create_bucket(Bucket=name)
    return name


def test_a_live_s3_lock_is_not_broken_by_a_clock_an_hour_ahead(tmp_path, bucket):
    """A writer holds the store's lock (TTL 30 s) for a few seconds; a process whose clock
    is an hour ahead used to read its expiry as long past and break it (two writers in the
    check-then-commit section). Aged on the server's clock, the lock holds: it waits."""
    holder = S3Backend(bucket, "lock", lock_ttl=30)
    script = tmp_path / "locker.py"
    script.write_text(LOCKER)
    with holder.lock():
        mine = (
            client("s3", os.environ["SPOT_S3_ENDPOINT_URL"])
            .get_object(Bucket=bucket, Key=f"lock/{LOCK_NAME}")["Body"]
            .read()
        )
        out, err = skewed(3600, str(script), bucket, "4").communicate(timeout=SLACK)
        assert out.strip() == "timed out", (out, err[-2000:])
        now = (
            client("s3", os.environ["SPOT_S3_ENDPOINT_URL"])
            .get_object(Bucket=bucket, Key=f"lock/{LOCK_NAME}")["Body"]
            .read()
        )
        assert now == mine, "the live lock was replaced"
    out, err = skewed(3600, str(script), bucket, "4").communicate(timeout=SLACK)
    assert out.strip() == "acquired", err[-2000:]  # released: taken at once


def test_an_expired_s3_lock_is_broken_only_by_compare_and_swap(aws_env, bucket):
    """Two writers find the lock of a writer that died, expired on the server's clock. The
    first one's writes to the lock are slow (held 2 s by a proxy, as by a stall); the
    second takes the lock over meanwhile. The first one's break then used to be an
    unconditional DELETE that removed the second one's live lock (two writers in the
    check-then-commit section); now it is a PUT with If-Match on the ETag it judged
    expired, which fails, and the first waits its turn. Each holder's lock stays its own
    until it releases it."""
    s3 = client("s3", aws_env)
    key = f"cas/{LOCK_NAME}"
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps({"owner": "dead"}).encode())
    time.sleep(6.5)  # older than the TTL (5 s) on the server's clock (whole seconds)
    kept: dict[str, bool] = {}

    def hold(name: str, endpoint: str, after_seconds: float) -> None:
        time.sleep(after_seconds)
        backend = S3Backend(bucket, "cas", endpoint_url=endpoint, lock_ttl=5, lock_timeout=60)
        with backend.lock():
            etag = s3.head_object(Bucket=bucket, Key=key)["ETag"]
            time.sleep(2.5)
            try:
                kept[name] = s3.head_object(Bucket=bucket, Key=key)["ETag"] == etag
            except Exception:  # noqa: BLE001 - deleted under its holder
                kept[name] = False

    with FaultProxy(aws_env, match=LOCK_NAME, methods=("PUT", "DELETE"), delay=2.0) as proxy:
        proxy.mode = "slow"
        threads = [
            threading.Thread(target=hold, args=("slow", proxy.url, 0.0)),
            threading.Thread(target=hold, args=("fast", aws_env, 2.5)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert kept == {"slow": True, "fast": True}, kept


def test_a_nan_age_is_unknown_never_alive_or_lapsed():
    from spot_core.checkpoint.backend import judged_age

    assert judged_age(math.nan, "x") is None and judged_age(-3600.0, "x") is None
    assert judged_age(math.inf, "x") is None and judged_age(-1.0, "x") == 0.0
    assert judged_age(12.5, "x") == 12.5
