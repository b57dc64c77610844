"""Child process for the crash-consistency tests: saves checkpoints forever.

Payloads are derived deterministically from the step, so the parent can recompute
exactly what a checkpoint of a given step must contain. Usage:
    python checkpoint_writer.py URI [ATTEMPT]
Prints "ready <start step>" once the store is open, then saves steps start, start+1,
... and prunes every third save, until it is killed.
"""

from __future__ import annotations

import json
import random
import sys


def payload_for(step: int) -> dict[str, bytes]:
    """Several files, one of them 1 MiB, all a pure function of ``step``."""
    rng = random.Random(step)
    return {
        "state.json": json.dumps({"step": step, "loss": 1.0 / (step + 1)}).encode(),
        "weights/big.bin": rng.randbytes(1 << 20),
        "weights/small.bin": rng.randbytes(rng.randrange(1, 200_000)),
        "empty.bin": b"",
    }


def main(uri: str, attempt: int) -> None:
    from spot_core.checkpoint import open_store

    store = open_store(uri)
    latest = store.latest()
    step = 1 if latest is None else latest.step + 1
    print(f"ready {step}", flush=True)
    while True:
        store.save(step, payload_for(step), {"step": step}, attempt=attempt)
        if step % 3 == 0:
            store.prune(keep=3)
        step += 1


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
