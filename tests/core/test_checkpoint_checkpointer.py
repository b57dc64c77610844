"""Checkpointer: schedules, emergency save on notice, restore, and a real SIGTERM resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spot_core.checkpoint import Checkpointer, CheckpointStore, open_store
from spot_core.errors import ConfigError, FencedOut, Preempted
from tests.support import SUPPORT

TRAIN_LOOP = SUPPORT / "checkpoint_train_loop.py"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return open_store(f"file://{tmp_path}/store")


def _payload(step: int):
    return lambda: {"state": str(step).encode()}


def test_step_schedule(store: CheckpointStore) -> None:
    ckpt = Checkpointer(store, every_steps=10, keep=2)
    saved = [s for s in range(1, 36) if ckpt.maybe_save(s, _payload(s)) is not None]
    assert saved == [10, 20, 30]
    assert [r.step for r in store.list()] == [20, 30]  # keep=2 prunes as it goes
    assert ckpt.saves == 3 and ckpt.total_save_seconds >= ckpt.last_save_seconds > 0
    meta = store.latest().metadata
    assert meta["checkpoint_saves"] == 3
    assert 0 < meta["checkpoint_seconds_total"] <= ckpt.total_save_seconds


# -- steps never go back (docs/checkpoints.md) ----------------------------------------------
def test_a_step_that_goes_back_is_refused_and_every_checkpoint_survives(store) -> None:
    """A loop whose counter restarts each epoch (saves at 10, 20, 30, 40, then 5): the
    save of 5 used to return a ref that its own pruning had just deleted."""
    ckpt = Checkpointer(store, keep=3)
    refs = [ckpt.save_now(step, _payload(step)) for step in (10, 20, 30, 40)]
    with pytest.raises(ConfigError, match=r"step 5 is below step 40.*epoch \* steps_per_epoch"):
        ckpt.save_now(5, _payload(5))
    assert [r.step for r in store.list()] == [20, 30, 40]
    assert store.latest() == refs[-1] and store.load(refs[-1]) == {"state": b"40"}
    with pytest.raises(ConfigError, match="steps must never go back"):
        store.save(5, {"state": b"5"})  # the store refuses it too, whoever saves
    assert [r.step for r in store.list()] == [20, 30, 40]


def test_a_global_step_across_epochs_keeps_the_newest_checkpoints(store) -> None:
    ckpt = Checkpointer(store, keep=3)
    for epoch in range(3):
        for step in (10, 20, 30, 40):
            ref = ckpt.save_now(epoch * 40 + step, _payload(epoch * 40 + step))
            assert store.load(ref) == {"state": str(epoch * 40 + step).encode()}
    assert [r.step for r in store.list()] == [100, 110, 120] and store.latest() == ref


def test_a_new_attempt_that_starts_below_the_store_is_refused(store) -> None:
    """The next attempt's loop ignored restore() and counts from 0 again."""
    Checkpointer(store, attempt=1).save_now(40, _payload(40))
    store.fence(2)
    with pytest.raises(ConfigError, match="step 5 is below step 40"):
        Checkpointer(store, attempt=2).save_now(5, _payload(5))
    restarted = Checkpointer(store, attempt=2)
    assert restarted.restore() == (40, {"state": b"40"})
    with pytest.raises(ConfigError, match="step 39 is below step 40"):
        restarted.save_now(39, _payload(39))
    assert restarted.save_now(41, _payload(41)).step == 41


def test_a_resume_from_below_a_corrupt_newest_checkpoint_may_save(store) -> None:
    """The newest checkpoint is damaged, so the next attempt resumes from the one before
    and saves below the damaged one's step: allowed, and the new one is the latest."""
    first = Checkpointer(store, attempt=1)
    first.save_now(10, _payload(10))
    damaged = first.save_now(20, _payload(20))
    folder = Path(store.backend.root) / "checkpoints" / damaged.checkpoint_id
    (folder / "state").write_bytes(b"xx")  # same size, other bytes
    resumed = Checkpointer(open_store(store.uri), attempt=2)
    assert resumed.restore()[0] == 10
    ref = resumed.save_now(15, _payload(15))
    assert resumed.store.latest() == ref
    resumed.store.prune(keep=1)
    assert resumed.store.load(ref) == {"state": b"15"}
    assert open_store(store.uri).save(16, {"state": b"16"}, attempt=2).step == 16


def test_time_schedule_with_injected_clock(store: CheckpointStore) -> None:
    clock = FakeClock()
    ckpt = Checkpointer(store, every_seconds=60, clock=clock)
    calls = []

    def make() -> dict[str, bytes]:
        calls.append(1)
        return {"s": b"x"}

    assert ckpt.maybe_save(1, make) is None
    clock.now += 59.9
    assert ckpt.maybe_save(2, make) is None and calls == []  # not serialised when not due
    clock.now += 0.1
    assert ckpt.maybe_save(3, make).step == 3
    clock.now += 30
    assert ckpt.maybe_save(4, make) is None
    clock.now += 30
    assert ckpt.maybe_save(5, make).step == 5 and len(calls) == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"every_seconds": 0},
        {"every_seconds": -1},
        {"every_steps": 0},
        {"every_steps": -5},
        {"every_seconds": float("nan")},
        {"keep": 0},
    ],
)
def test_bad_intervals(store: CheckpointStore, kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        Checkpointer(store, **kwargs)


def test_emergency_save_then_preempted(store: CheckpointStore) -> None:
    ckpt = Checkpointer(store, every_steps=1000)
    assert ckpt.maybe_save(7, _payload(7)) is None
    ckpt.request_emergency_save("spot interruption notice")
    assert ckpt.emergency_requested
    with pytest.raises(Preempted, match="step 8"):
        ckpt.maybe_save(8, _payload(8))
    ref = store.latest()
    assert ref.step == 8 and ref.metadata["emergency"] == "spot interruption notice"
    assert store.load(ref) == {"state": b"8"}


def test_emergency_from_watcher_thread(store: CheckpointStore) -> None:
    ckpt = Checkpointer(store, every_steps=10**6)
    watcher = threading.Timer(0.05, ckpt.request_emergency_save, args=("rebalance",))
    watcher.start()
    step = 0
    with pytest.raises(Preempted):
        while step < 10**6:
            step += 1
            time.sleep(0.001)
            ckpt.maybe_save(step, _payload(step))
    assert store.latest().step == step


def test_notice_file_triggers_emergency(store: CheckpointStore, tmp_path: Path) -> None:
    notice = tmp_path / "notice.json"
    ckpt = Checkpointer(store, every_steps=100, notice_file=str(notice))
    assert ckpt.maybe_save(1, _payload(1)) is None
    notice.write_text('{"action": "terminate"}')
    with pytest.raises(Preempted):
        ckpt.maybe_save(2, _payload(2))
    assert store.latest().step == 2


def test_restore_on_start(store: CheckpointStore) -> None:
    assert Checkpointer(store).restore() is None
    first = Checkpointer(store, every_steps=5)
    for step in range(1, 13):
        first.maybe_save(step, _payload(step))
    second = Checkpointer(store, every_steps=5)
    assert second.start_step == 0
    assert second.restore() == (10, {"state": b"10"})
    assert second.start_step == 10
    assert second.maybe_save(14, _payload(14)) is None and second.maybe_save(15, _payload(15))


def test_save_now_and_sigterm_handler(store: CheckpointStore) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with Checkpointer(store).attach_signals() as ckpt:
        assert ckpt.save_now(3, _payload(3)).step == 3
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert ckpt.emergency_requested
        with pytest.raises(Preempted, match="SIGTERM"):
            ckpt.maybe_save(4, _payload(4))
    assert signal.getsignal(signal.SIGTERM) is before


def test_from_env_fences_older_attempts(store: CheckpointStore) -> None:
    zombie = Checkpointer(store, attempt=1)
    zombie.save_now(5, _payload(5))
    env = {"SPOT_CHECKPOINT_URI": store.uri, "SPOT_ATTEMPT": "2"}
    resumed = Checkpointer.from_env(env, every_steps=10)
    assert resumed.attempt == 2 and resumed.restore()[0] == 5
    with pytest.raises(FencedOut):
        zombie.save_now(6, _payload(6))
    with pytest.raises(ConfigError, match="SPOT_CHECKPOINT_URI"):
        Checkpointer.from_env({})


def _run_loop(uri: str, attempt: int, total: int, sigterm_after: float | None):
    env = {**os.environ, "SPOT_CHECKPOINT_URI": uri, "SPOT_ATTEMPT": str(attempt)}
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_LOOP), str(total), "0.002"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    ready = proc.stdout.readline()
    if sigterm_after is not None:
        time.sleep(sigterm_after)
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, ready + out


def test_sigterm_emergency_checkpoint_and_identical_resume(tmp_path: Path) -> None:
    total = 400
    code, out = _run_loop(f"file://{tmp_path}/clean", 1, total, None)
    assert code == 0
    clean_final = out.split("final ")[1].strip()

    uri = f"file://{tmp_path}/interrupted"
    code, out = _run_loop(uri, 1, total, sigterm_after=0.3)
    assert code == 3 and "preempted" in out, out
    ref = open_store(uri).latest()
    assert ref.metadata["emergency"] == "received SIGTERM" and 0 < ref.step < total

    code, out = _run_loop(uri, 2, total, None)
    assert code == 0 and out.startswith(f"ready {ref.step}")
    assert out.split("final ")[1].strip() == clean_final


def test_a_users_loop_that_lets_preempted_escape_ends_as_preempted(tmp_path):
    """A user's loop with no ``except Preempted``: the step still ends as preempted (143,
    one JSON line, no traceback), its emergency checkpoint saved, not as its own failure
    (exit 1), which would spend a user retry."""
    uri = (tmp_path / "store").as_uri()
    loop = (
        "from spot_core.checkpoint import Checkpointer\n"
        "ckpt = Checkpointer.from_env(every_steps=100)\n"
        "for step in range(1, 50):\n"
        "    if step == 7:\n"
        "        ckpt.request_emergency_save('spot interruption notice')\n"
        "    ckpt.maybe_save(step, lambda: {'state': str(step).encode()})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", loop],
        env={**os.environ, "SPOT_CHECKPOINT_URI": uri, "SPOT_ATTEMPT": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 143, done.stderr
    assert "Traceback" not in done.stderr
    assert '"preempted": true' in done.stdout.strip().splitlines()[-1]
    assert open_store(uri).latest().step == 7
