"""The benchmark's step: a loop with a payload of PAYLOAD_MIB split over FILES files.

Like a real training step it runs under ``Checkpointer.from_env`` (the handover variables
included), saves every SAVE_EVERY steps and on a notice, and restores at start, so its
resume report says when it resumed and what restoring cost.
Usage: python -m bench.resume_step STEPS STEP_SECONDS PAYLOAD_MIB FILES SAVE_EVERY
"""

from __future__ import annotations

import sys
import time

import numpy as np

from spot_core.attempt_env import PREEMPTED_EXIT_CODE
from spot_core.checkpoint import Checkpointer
from spot_core.errors import Preempted

MiB = 1 << 20


def main(steps: int, step_seconds: float, payload_mib: int, files: int, every: int) -> int:
    ckpt = Checkpointer.from_env(every_steps=every, keep=2).attach_signals()
    size = max(1, payload_mib * MiB // files)
    shards = [np.random.default_rng(i).bytes(size) for i in range(files)]
    restored = ckpt.restore()
    if restored is not None:
        shards = [restored[1][f"shard-{i}.bin"] for i in range(files)]

    def payload() -> dict[str, bytes]:
        return {f"shard-{i}.bin": shard for i, shard in enumerate(shards)}

    try:
        for step in range(ckpt.start_step, steps):
            time.sleep(step_seconds)
            ckpt.maybe_save(step + 1, payload)
    except Preempted:
        return PREEMPTED_EXIT_CODE
    finally:
        ckpt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*map(int, sys.argv[1:2]), float(sys.argv[2]), *map(int, sys.argv[3:6])))
