"""Blocking calls of one event loop's drivers, batched into few thread hops."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from spot_core import batched

WHO = contextvars.ContextVar("who", default="nobody")


def test_calls_of_one_moment_share_hops_and_each_gets_its_own_result_or_error():
    def work(i):
        if i % 7 == 0:
            raise ValueError(f"job {i} failed")
        return (i, WHO.get(), threading.current_thread() is not threading.main_thread())

    async def caller(i):
        WHO.set(f"trigger-{i}")  # the caller's context reaches the call (its log context)
        return await batched.to_thread(work, i)

    async def main():
        results = await asyncio.gather(*(caller(i) for i in range(450)), return_exceptions=True)
        return results, batched.batcher_for()

    results, batcher = asyncio.run(main())
    assert batcher.hops == 3 and batcher.calls == 450  # 200 + 200 + 50, not 450 hops
    for i, result in enumerate(results):
        if i % 7 == 0:
            assert isinstance(result, ValueError) and str(result) == f"job {i} failed"
        else:
            assert result == (i, f"trigger-{i}", True)


def test_a_call_whose_caller_is_cancelled_before_its_hop_is_not_run():
    ran = []

    async def main():
        kept = asyncio.create_task(batched.to_thread(ran.append, "kept"))
        dropped = asyncio.create_task(batched.to_thread(ran.append, "dropped"))
        await asyncio.sleep(0)  # both queued, the hop not yet made
        dropped.cancel()
        await kept
        with pytest.raises(asyncio.CancelledError):
            await dropped

    asyncio.run(main())
    assert ran == ["kept"]


def test_calls_apart_in_time_are_not_held_back():
    async def main():
        first = await batched.to_thread(lambda: 1)
        await asyncio.sleep(2 * batched.WINDOW)
        second = await batched.to_thread(lambda: 2)
        return first, second, batched.batcher_for().hops

    assert asyncio.run(main()) == (1, 2, 2)


def test_a_chunk_slowed_by_io_hands_back_finished_calls_before_it_ends():
    """The first calls of a chunk whose later calls block (a slow store) are answered
    while those still run, not once the whole chunk is done."""
    release = threading.Event()

    def quick(i):
        return i

    def stall():
        time.sleep(batched.SETTLE_EVERY)  # the chunk has run long enough to hand back
        return "stall"

    def slow():
        release.wait(10)  # blocks until the quick callers were answered
        return "slow"

    async def main():
        loop = asyncio.get_running_loop()
        quick_calls = [asyncio.create_task(batched.to_thread(quick, i)) for i in range(5)]
        stalls = [asyncio.create_task(batched.to_thread(stall))]
        slow_call = asyncio.create_task(batched.to_thread(slow))
        answered = await asyncio.wait_for(asyncio.gather(*quick_calls, *stalls), timeout=5)
        still_running = not slow_call.done()
        loop.call_soon(release.set)
        return answered, still_running, await slow_call

    answered, still_running, slow_result = asyncio.run(main())
    assert answered == [0, 1, 2, 3, 4, "stall"] and still_running and slow_result == "slow"
