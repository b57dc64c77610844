"""Moments an event loop could not run, counted as Airflow's triggerer counts them.

Why: Airflow's triggerer logs "Triggerer's async thread was blocked for N seconds ...
likely caused by a badly-written trigger" whenever a 0.1 s ``asyncio.sleep`` of its
watchdog takes longer than ``[triggerer] blocked_main_thread_warning_threshold``
(0.2 s by default). A process watching 1,000 spot jobs logs that now and then, so the
scale bench counts the same moments in its own loop and says how many of them a full
(oldest-generation) garbage collection of CPython overlapped: those are the
interpreter's pauses, not a trigger blocking the loop.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

WATCHDOG_SLEEP = 0.1  # seconds, as Airflow's TriggerRunner.block_watchdog
THRESHOLD = 0.2  # seconds, Airflow's default blocked_main_thread_warning_threshold


class LoopStalls:
    """``async with LoopStalls() as stalls:`` counts the loop's stalls over the block;
    ``stalls.summary()`` after it."""

    def __init__(self, threshold: float = THRESHOLD) -> None:
        self.threshold = threshold
        self.stalls: list[tuple[float, float]] = []  # (ended at, seconds)
        self.collections: list[tuple[float, float]] = []  # full collections: (start, seconds)
        self._collecting_since: float | None = None
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> LoopStalls:
        gc.callbacks.append(self._on_collection)
        self._task = asyncio.create_task(self._watchdog())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        gc.callbacks.remove(self._on_collection)

    async def _watchdog(self) -> None:
        while True:
            started = time.monotonic()
            await asyncio.sleep(WATCHDOG_SLEEP)
            elapsed = time.monotonic() - started
            if elapsed > self.threshold:
                self.stalls.append((time.monotonic(), elapsed))

    def _on_collection(self, phase: str, info: dict) -> None:
        """gc's callback (any thread): time each collection of the oldest generation."""
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._collecting_since = time.monotonic()
        elif self._collecting_since is not None:
            self.collections.append(
                (self._collecting_since, time.monotonic() - self._collecting_since)
            )
            self._collecting_since = None

    def _overlaps_collection(self, ended_at: float, seconds: float) -> bool:
        return any(
            start < ended_at and start + took > ended_at - seconds
            for start, took in self.collections
        )

    def summary(self) -> dict[str, Any]:
        over = [s for s in self.stalls if self._overlaps_collection(*s)]
        return {
            "loop_stalls": len(self.stalls),
            "longest_stall_s": round(max((s for _, s in self.stalls), default=0.0), 2),
            "stalls_during_full_gc": len(over),
            "full_gcs": len(self.collections),
            "full_gc_s": round(sum(took for _, took in self.collections), 2),
            "longest_full_gc_s": round(max((t for _, t in self.collections), default=0.0), 2),
        }
