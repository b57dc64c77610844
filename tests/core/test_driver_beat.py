"""One heartbeat per driver process (``heartbeat_uri``): a driver that watches many jobs
renews one object for all of them, each job's own heartbeat points at it, and the node
follows the pointer. Real watcher processes and real file:// stores; what a user cares
about: a step lives while its driver watches it, and stops once its driver stops
watching it, even while that driver lives on for other jobs."""

from __future__ import annotations

import json
import threading
import time

import pytest
from test_driver_heartbeat import TIMEOUT, finish, saved_on_stop, start_watch

from spot_core.attempt_env import DRIVER_LOST_EXIT_CODE
from spot_core.checkpoint import open_store
from spot_core.checkpoint.heartbeat import DRIVER_KEY, HEARTBEAT_KEY, DriverBeat, Heartbeat
from spot_core.errors import CheckpointError
from spot_core.localcloud.metadata import MetadataEmulator

pytestmark = pytest.mark.timeout(90)


class DriverRenewer:
    """A driver process: points each job's heartbeat at its one beat, then vouches for
    the jobs it still watches and renews every ``every`` seconds until stopped."""

    def __init__(self, drivers, jobs: dict[str, tuple[object, int]], every: float = 0.25):
        self.beat, self.every = DriverBeat(drivers), every
        self.watched = {job: attempt for job, (_, attempt) in jobs.items()}
        now = time.time()
        for job, (store, attempt) in jobs.items():
            self.beat.vouch(job, attempt, now)
            Heartbeat(store).point(attempt, self.beat, job, now)
        self.beat.renew(now)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            now = time.time()
            for job, attempt in list(self.watched.items()):
                self.beat.vouch(job, attempt, now)
            self.beat.renew(now, every=self.every / 2, window=self.every * 1.5)

    def __enter__(self) -> DriverRenewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def emulator():
    with MetadataEmulator() as emu:
        yield emu


def test_a_step_lives_while_its_driver_watches_it_and_stops_once_it_no_longer_does(
    emulator, tmp_path
):
    drivers_uri = f"file://{tmp_path / 'drivers'}"
    drivers = open_store(drivers_uri)
    mine, other = (
        open_store(f"file://{tmp_path / 'mine'}"),
        open_store(f"file://{tmp_path / 'other'}"),
    )
    with DriverRenewer(drivers, {"mine": (mine, 1), "other": (other, 1)}) as driver:
        proc = start_watch(
            emulator,
            mine.uri,
            "--heartbeat-timeout",
            f"{TIMEOUT:g}s",
            env={"SPOT_HEARTBEAT_URI": drivers_uri},
        )
        time.sleep(3 * TIMEOUT)  # well past the timeout: the one beat keeps it alive
        assert proc.poll() is None, finish(proc)[3]
        assert mine.latest() is not None, "the step made progress meanwhile"
        del driver.watched["mine"]  # the driver stops watching this job, lives on for "other"
        dropped_at = time.monotonic()
        code, events, _, err = finish(proc)
        took = time.monotonic() - dropped_at
        renewals = json.loads(drivers.get_object(DRIVER_KEY.format(driver.beat.driver_id)))
    assert code == DRIVER_LOST_EXIT_CODE, err[-2000:]
    assert TIMEOUT - 0.5 <= took < TIMEOUT + 8, took
    assert [e["event"] for e in events] == ["driver_lost"]
    assert renewals["jobs"] == {"other": 1}, "the driver lived on, for the other job only"
    assert saved_on_stop(mine.latest().metadata), mine.latest().metadata


def test_a_pointer_that_cannot_be_followed_is_no_renewal(emulator, tmp_path):
    """A node not told where drivers beat (no SPOT_HEARTBEAT_URI) sees no renewal through a
    pointer, and stops after the timeout: it never runs on unwatched."""
    drivers = open_store(f"file://{tmp_path / 'drivers'}")
    mine = open_store(f"file://{tmp_path / 'mine'}")
    started = time.monotonic()
    with DriverRenewer(drivers, {"mine": (mine, 1)}):
        proc = start_watch(emulator, mine.uri, "--heartbeat-timeout", f"{TIMEOUT:g}s")
        code, events, _, err = finish(proc)
    assert code == DRIVER_LOST_EXIT_CODE, err[-2000:]
    assert TIMEOUT <= time.monotonic() - started < TIMEOUT + 10


def test_a_bad_heartbeat_uri_is_one_line_naming_the_forms(emulator, tmp_path):
    proc = start_watch(
        emulator,
        f"file://{tmp_path / 'mine'}",
        "--heartbeat-timeout",
        "5",
        env={"SPOT_HEARTBEAT_URI": "drivers/here"},
    )
    code, _, _, err = finish(proc)
    assert code != 0
    assert "file:///absolute/path or s3://bucket/prefix" in err.strip().splitlines()[-1]


def test_reading_follows_the_pointer_to_the_listed_attempt_only(tmp_path):
    drivers = open_store(f"file://{tmp_path / 'drivers'}")
    job = open_store(f"file://{tmp_path / 'job'}")
    beat = DriverBeat(drivers)
    beat.vouch("j", 2, 100.0)
    Heartbeat(job).point(2, beat, "j", 100.0)
    reader = Heartbeat(job, drivers)
    assert reader.read() is None, "the driver has not renewed yet"
    assert beat.renew(101.0, every=10.0)
    first = reader.read()
    assert (first.attempt, first.sequence, first.driver) == (2, 1, beat.driver_id)
    assert not beat.renew(105.0, every=10.0), "one write per round"
    beat.vouch("j", 3, 111.0)  # the driver moved on to attempt 3
    assert beat.renew(111.0, every=10.0)
    assert (reader.read().attempt, reader.read().sequence) == (3, 2)
    assert beat.renew(200.0, every=10.0, window=20.0)  # not vouched for since 111
    assert reader.read() is None, "a job the driver no longer watches has no renewal"
    assert Heartbeat(job).read() is None, "without the drivers' store a pointer is no beat"


@pytest.mark.parametrize(
    "pointer",
    [
        {"attempt": 1, "renewed_at": 1.0, "sequence": 1, "driver": "../../etc/passwd", "job": "j"},
        {"attempt": 1, "renewed_at": 1.0, "sequence": 1, "driver": "a" * 32 + "\n", "job": "j"},
        {"attempt": 1, "renewed_at": 1.0, "sequence": 1, "driver": "a" * 32, "job": 7},
        {"attempt": 1, "renewed_at": 1.0, "sequence": 1, "driver": None, "job": "j"},
    ],
    ids=["path", "newline", "job-not-text", "no-driver"],
)
def test_a_pointer_naming_no_valid_driver_is_unreadable(tmp_path, pointer):
    drivers = open_store(f"file://{tmp_path / 'drivers'}")
    job = open_store(f"file://{tmp_path / 'job'}")
    job.put_object(HEARTBEAT_KEY, json.dumps(pointer).encode())
    assert Heartbeat(job, drivers).read() is None
    assert list((tmp_path / "drivers").rglob("*.json")) == []


@pytest.mark.parametrize(
    "doc",
    [
        b"garbage",
        b'{"jobs": {"j": true}, "renewed_at": 1, "sequence": 1}',
        b'{"jobs": {"j": 1}, "renewed_at": NaN, "sequence": 1}',
        b'{"jobs": [], "renewed_at": 1, "sequence": 1}',
    ],
    ids=["garbage", "bool-attempt", "nan", "jobs-not-a-map"],
)
def test_a_driver_object_it_did_not_write_is_no_renewal(tmp_path, doc):
    drivers = open_store(f"file://{tmp_path / 'drivers'}")
    job = open_store(f"file://{tmp_path / 'job'}")
    beat = DriverBeat(drivers)
    Heartbeat(job).point(1, beat, "j", 1.0)
    drivers.put_object(DRIVER_KEY.format(beat.driver_id), doc)
    assert Heartbeat(job, drivers).read() is None


def test_a_failed_renewal_leaves_the_round_due(tmp_path):
    """A store that refuses the write (here a file where the drivers' folder goes) raises;
    the next check writes the round it missed."""
    drivers = open_store(f"file://{tmp_path / 'drivers'}")
    blocker = tmp_path / "drivers" / "drivers"
    blocker.write_text("not a folder")
    beat = DriverBeat(drivers)
    beat.vouch("j", 1, 0.0)
    with pytest.raises(CheckpointError, match="could not write"):  # the folder is a file
        beat.renew(10.0, every=5.0)
    blocker.unlink()
    assert beat.renew(11.0, every=5.0), "the failed round is tried again at the next check"
    assert DriverBeat.entry(drivers.get_object(DRIVER_KEY.format(beat.driver_id)), "j") == (
        1,
        11.0,
        2,
    )
