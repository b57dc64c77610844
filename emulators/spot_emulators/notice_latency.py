"""How long from a notice appearing at the metadata service to a handler running.

The number that matters for a 2-minute AWS notice (or GCE's 30 s) is how much of the
notice the step actually gets. This measures it end to end over real HTTP: the metadata
emulator makes a notice visible at a random phase of the watcher's poll cycle, and the
clock stops when the watcher's handler runs. Expect about ``poll_interval / 2`` on
average and at most ``poll_interval`` plus one request round trip.
"""

from __future__ import annotations

import random
import threading
import time

from spot_core.errors import SpotError
from spot_core.interruption.aws import AwsDetector
from spot_core.interruption.watcher import InterruptionWatcher
from spot_core.localcloud.metadata import MetadataEmulator


def measure_detection_latency(
    poll_interval: float = 1.0, trials: int = 10, *, seed: int | None = 0, timeout: float = 1.0
) -> list[float]:
    """Seconds from notice visible to handler fired, one sample per trial (AWS IMDSv2).

    Each trial uses a fresh watcher (fresh token, fresh dedupe) against one emulator;
    the notice appears a uniformly random fraction of a poll interval after a poll.
    """
    if trials < 1 or not poll_interval > 0:
        raise ValueError("need trials >= 1 and poll_interval > 0")
    phases = random.Random(seed)
    with MetadataEmulator() as emulator:
        return [
            _one_trial(emulator, poll_interval, phases.random(), timeout) for _ in range(trials)
        ]


def _one_trial(
    emulator: MetadataEmulator, poll_interval: float, phase: float, timeout: float
) -> float:
    emulator.clear()
    fired = threading.Event()
    fired_at: list[float] = []

    def handler(notice: object) -> None:
        fired_at.append(time.time())
        fired.set()

    watcher = InterruptionWatcher([AwsDetector(emulator.url, timeout)], poll_interval)
    watcher.add_handler(handler)
    with watcher:
        time.sleep(phase * poll_interval)
        visible_at = time.time()
        emulator.schedule_interruption(at=visible_at)
        if not fired.wait(poll_interval * 2 + timeout * 3 + 1.0):
            raise SpotError("the watcher never saw the emulated notice")
    return fired_at[0] - visible_at
