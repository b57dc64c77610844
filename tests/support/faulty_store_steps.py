"""User code for tests/core/test_store_faults.py: steps that break their own store midway.

Each fault is real: the step remounts the store's tmpfs read-only or fills it (the test
runs it in its own user and mount namespace), or stops the S3 server (moto) it uses.
``FAULT``: ``read-only``, ``full`` or ``unreachable``; ``FAULT_MOUNT``: the tmpfs;
``FAULT_MOTO_PID``: the moto server's process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

FAULT_AT_ITEM = 3


def break_the_store() -> None:
    fault = os.environ["FAULT"]
    if fault == "read-only":
        subprocess.run(["mount", "-o", "remount,ro", os.environ["FAULT_MOUNT"]], check=True)
    elif fault == "full":
        try:
            with open(os.path.join(os.environ["FAULT_MOUNT"], "filler"), "wb") as fh:
                while True:
                    fh.write(b"x" * 4096)
                    fh.flush()
        except OSError:
            pass
    else:
        pid = int(os.environ["FAULT_MOTO_PID"])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def process(item: int) -> dict[str, int]:
    """A batch item; the store breaks while the worker holds its unit."""
    if item == FAULT_AT_ITEM:
        break_the_store()
    return {"item": item, "square": item * item}


def objective(trial, checkpointer) -> float:  # noqa: ANN001 - optuna's and ours
    """A sweep trial that saves, breaks its store, and saves again."""
    checkpointer.save_now(1, lambda: {"x": b"1"})
    break_the_store()
    checkpointer.save_now(2, lambda: {"x": b"2"})
    return 1.0


def user_training_loop() -> None:
    """A user's own step, as docs/cli.md shows it but with no exception handling at all:
    ``Checkpointer.from_env``, a save, the store breaks, the next save."""
    from spot_core.checkpoint import Checkpointer

    checkpointer = Checkpointer.from_env(every_steps=1)
    checkpointer.restore()
    checkpointer.maybe_save(2, lambda: {"x": b"2"})
    break_the_store()
    checkpointer.maybe_save(3, lambda: {"x": b"3" * 200_000})
