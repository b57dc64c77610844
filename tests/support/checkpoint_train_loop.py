"""Child process for the Checkpointer tests: a tiny deterministic NumPy training loop.

Reads SPOT_CHECKPOINT_URI / SPOT_ATTEMPT like a real step, restores, trains, and
on SIGTERM saves an emergency checkpoint and exits with code 3 (preempted).
Usage: python checkpoint_train_loop.py TOTAL_STEPS STEP_SECONDS
Prints "ready <start step>" after restoring and "final <sha256 of weights>" at the end.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import numpy as np

from spot_core.checkpoint import Checkpointer
from spot_core.checkpoint.state import arrays_from_bytes, arrays_to_bytes
from spot_core.errors import Preempted


def main(total: int, step_seconds: float) -> int:
    ckpt = Checkpointer.from_env(every_steps=50, keep=2).attach_signals()
    weights, rng = np.zeros(1000), np.random.default_rng(42)
    restored = ckpt.restore()
    if restored is not None:
        weights = arrays_from_bytes(restored[1]["weights.npz"])["w"]
        rng.bit_generator.state = json.loads(restored[1]["rng.json"])

    def payload() -> dict[str, bytes]:
        return {
            "weights.npz": arrays_to_bytes({"w": weights}),
            "rng.json": json.dumps(rng.bit_generator.state).encode(),
        }

    print(f"ready {ckpt.start_step}", flush=True)
    try:
        for step in range(ckpt.start_step, total):
            weights = 0.99 * weights + 0.01 * rng.standard_normal(weights.shape)
            time.sleep(step_seconds)
            ckpt.maybe_save(step + 1, payload)
    except Preempted as exc:
        print(f"preempted {exc}", flush=True)
        return 3
    finally:
        ckpt.close()
    print(f"final {hashlib.sha256(weights.tobytes()).hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2])))
