"""Child process for the handover tests: a deterministic loop whose emergency save is slow.

Like a real step it reads SPOT_CHECKPOINT_URI / SPOT_ATTEMPT (and, as a replacement, the
handover variables) through ``Checkpointer.from_env``. Its emergency checkpoint takes
SAVE_SECONDS to write (a big model's save), so the old attempt's lease outlives the notice
long enough for the replacement to be launched beside it.
Usage: python handover_step.py TOTAL_STEPS STEP_SECONDS SAVE_SECONDS RESULT_FILE
Writes {"total": the sum of every step's number} to RESULT_FILE at the end: equal to an
uninterrupted run's only if the job resumed exactly where its newest checkpoint left it.
"""

from __future__ import annotations

import json
import sys
import time

from spot_core.attempt_env import PREEMPTED_EXIT_CODE
from spot_core.checkpoint import Checkpointer
from spot_core.errors import Preempted


def main(total_steps: int, step_seconds: float, save_seconds: float, result: str) -> int:
    ckpt = Checkpointer.from_env(every_steps=10, keep=100).attach_signals()
    total = 0
    restored = ckpt.restore()
    if restored is not None:
        total = json.loads(restored[1]["state.json"])["total"]

    def payload() -> dict[str, bytes]:
        if ckpt.emergency_requested:
            time.sleep(save_seconds)
        return {"state.json": json.dumps({"total": total}).encode()}

    try:
        for step in range(ckpt.start_step, total_steps):
            total += step
            time.sleep(step_seconds)
            ckpt.maybe_save(step + 1, payload)
    except Preempted:
        return PREEMPTED_EXIT_CODE
    finally:
        ckpt.close()
    with open(result, "w") as out:
        json.dump({"total": total}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]))
