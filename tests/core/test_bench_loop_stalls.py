"""The scale bench counts the moments its event loop could not run as Airflow's triggerer
logs them ("async thread was blocked"), and tells a full garbage collection's pause from
a callback that blocks the loop."""

from __future__ import annotations

import asyncio
import gc
import time

from bench.loop_stalls import LoopStalls


def _blocking(seconds: float, collect: bool = False) -> None:
    if collect:
        gc.collect()  # a full collection, inside the stall
    time.sleep(seconds)


THRESHOLD = 0.45  # seconds: well above Airflow's 0.2, so a busy CI machine adds no stall


async def _measure(*blocks: tuple[float, bool]) -> dict:
    async with LoopStalls(threshold=THRESHOLD) as stalls:
        await asyncio.sleep(0.3)
        for seconds, collect in blocks:
            _blocking(seconds, collect)  # on the loop: nothing else runs meanwhile
            await asyncio.sleep(0.3)
    return stalls.summary()


def test_a_callback_that_blocks_the_loop_is_a_stall_not_a_collection():
    summary = asyncio.run(_measure((0.6, False)))
    assert summary["loop_stalls"] == 1 and summary["longest_stall_s"] >= 0.6
    assert summary["stalls_during_full_gc"] == 0


def test_a_full_collection_inside_a_stall_is_named_as_such():
    summary = asyncio.run(_measure((0.6, True), (0.05, False)))
    assert summary["loop_stalls"] == 1  # 0.05 s is under the threshold
    assert summary["stalls_during_full_gc"] == 1 and summary["full_gcs"] >= 1


def test_an_idle_loop_has_no_stall_and_leaves_gc_as_it_found_it():
    callbacks = list(gc.callbacks)
    summary = asyncio.run(_measure())
    assert summary["loop_stalls"] == 0 and summary["longest_stall_s"] == 0.0
    assert gc.callbacks == callbacks


def test_the_triggerer_bench_counts_airflows_notes_in_its_window_only(tmp_path):
    from bench.scale_triggerer import blocked_notes

    note = (
        "[info] Triggerer's async thread was blocked for {:.2f} seconds, exceeding the "
        "configured warning threshold of 0.20 seconds. This is likely caused by a "
        "badly-written trigger.\n"
    )
    log = tmp_path / "triggerer.log"
    log.write_text(note.format(3.0))  # before the window
    offset = log.stat().st_size
    with open(log, "a") as f:
        f.write(note.format(0.31) + "[info] trigger fired\n" + note.format(0.27))
    assert blocked_notes(log, offset) == {"blocked_notes": 2, "longest_blocked_s": 0.31}
