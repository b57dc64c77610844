"""Child process for the crash-consistency tests: saves checkpoints forever.

Payloads are derived deterministically from the step, so the parent can recompute
exactly what a checkpoint of a given step must contain. Usage:
    python checkpoint_writer.py URI [ATTEMPT]
Prints "ready <start step>" once the store is open, then saves steps start, start+1,
... (printing "saved <step>" when each save has returned) and prunes every third save,
until it is killed. The parent waits for a chosen number of returned saves before its
random kill delay, so how much a trial commits depends on the seed, not on the machine's
load, and every returned save must survive the kill.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading


def payload_for(step: int) -> dict[str, bytes]:
    """Several files, one of them 1 MiB, all a pure function of ``step``."""
    rng = random.Random(step)
    return {
        "state.json": json.dumps({"step": step, "loss": 1.0 / (step + 1)}).encode(),
        "weights/big.bin": rng.randbytes(1 << 20),
        "weights/small.bin": rng.randbytes(rng.randrange(1, 200_000)),
        "empty.bin": b"",
    }


def wait_for_saves(proc: subprocess.Popen[str], count: int, timeout: float = 60.0) -> int:
    """Read the writer's lines until ``count`` saves have returned; the last step saved
    (0 if ``count`` is 0). Bounded: a writer that stalls is killed after ``timeout``."""
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        step = 0
        for _ in range(count):
            line = proc.stdout.readline()
            assert line.startswith("saved "), f"writer stopped before {count} saves: {line!r}"
            step = int(line.split()[1])
        return step
    finally:
        watchdog.cancel()


def main(uri: str, attempt: int) -> None:
    from spot_core.checkpoint import open_store

    store = open_store(uri)
    latest = store.latest()
    step = 1 if latest is None else latest.step + 1
    print(f"ready {step}", flush=True)
    while True:
        store.save(step, payload_for(step), {"step": step}, attempt=attempt)
        print(f"saved {step}", flush=True)
        if step % 3 == 0:
            store.prune(keep=3)
        step += 1


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
