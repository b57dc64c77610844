"""Blocking calls of many drivers in one event loop, run in one thread hop per batch.

Why: a process that watches many leases from one event loop (the Airflow triggerer's
``SpotJobTrigger``s, a Prefect spot worker's flow runs) hands every lease's
``Controller.check`` to a thread, because a check may block (the heartbeat PUT, closing
an attempt). The shared observer (``spot_core.observer``) wakes every driver of a poll at
once, so 1,000 watched jobs made 1,000 ``asyncio.to_thread`` hops per poll, each about
0.1-0.3 ms of CPU (a thread-pool hand-off and a wake-up back on the loop) for a check that
itself takes about 10 us when it has no I/O to do.

``to_thread(fn, *args)`` is ``asyncio.to_thread``'s drop-in: calls made on one loop
within ``WINDOW`` seconds of each other are queued and run one after another in one
worker thread, in chunks of at most ``MAX_BATCH`` (each chunk its own thread, so a
chunk whose calls do I/O, such as a poll in which many heartbeats fall due, delays at
most ``MAX_BATCH`` others), and their results come back with one wake-up per chunk. Each
call runs in its caller's ``contextvars`` context (as ``asyncio.to_thread`` does: a
trigger's log context reaches what it logs) and gets its own result or exception; a call
whose caller was cancelled before its chunk started is not run.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

WINDOW = 0.05  # seconds: calls this close together share a hop
MAX_BATCH = 200  # calls per hop at most; a poll's calls beyond it go in further hops
SETTLE_EVERY = 0.5  # seconds: a slow chunk hands back its finished calls this often

# (the caller's future, its context, fn, args, kwargs)
_Call = tuple[
    asyncio.Future[Any],
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
    dict[str, Any],
]


class Batcher:
    """The batches of one event loop (``batcher_for``). ``hops``: thread hand-offs made;
    ``calls``: calls run through them."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, *, window: float = WINDOW, max_batch: int = MAX_BATCH
    ) -> None:
        if max_batch < 1 or window < 0:
            raise ValueError(f"max_batch={max_batch!r} must be >= 1, window={window!r} >= 0")
        self._loop = loop
        self.window = window
        self.max_batch = max_batch
        self._pending: list[_Call] = []
        self._flush_at: asyncio.TimerHandle | None = None
        self.hops = 0
        self.calls = 0

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker thread, batched with this loop's other calls."""
        future: asyncio.Future[T] = self._loop.create_future()
        self._pending.append((future, contextvars.copy_context(), fn, args, kwargs))
        if self._flush_at is None:
            self._flush_at = self._loop.call_later(self.window, self._flush)
        return await future

    def _flush(self) -> None:
        self._flush_at = None
        pending = [call for call in self._pending if not call[0].done()]  # done: cancelled
        self._pending = []
        for start in range(0, len(pending), self.max_batch):
            chunk = pending[start : start + self.max_batch]
            self.hops += 1
            self.calls += len(chunk)
            self._loop.run_in_executor(None, self._run_chunk, chunk)

    def _run_chunk(self, chunk: list[_Call]) -> None:
        """In the worker thread: every call of the chunk, then one wake-up of the loop.
        A chunk slowed by I/O (first heartbeats against a slow store) hands back what is
        done every ``SETTLE_EVERY`` seconds, so no caller waits for all the others."""
        outcomes: list[tuple[asyncio.Future[Any], bool, Any]] = []
        settled_at = time.monotonic()
        for future, context, fn, args, kwargs in chunk:
            try:
                outcomes.append((future, True, context.run(fn, *args, **kwargs)))
            except BaseException as exc:  # noqa: BLE001 - the caller's own exception
                outcomes.append((future, False, exc))
            if time.monotonic() - settled_at >= SETTLE_EVERY:
                self._hand_back(outcomes)
                outcomes, settled_at = [], time.monotonic()
        self._hand_back(outcomes)

    def _hand_back(self, outcomes: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
        if not outcomes:
            return
        try:
            self._loop.call_soon_threadsafe(_settle, outcomes)
        except RuntimeError:  # the loop closed: nobody waits for these any more
            pass


def _settle(outcomes: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in outcomes:
        if future.done():  # its caller was cancelled meanwhile
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


_BATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Batcher] = (
    weakref.WeakKeyDictionary()
)


def batcher_for(loop: asyncio.AbstractEventLoop | None = None) -> Batcher:
    """The running (or given) loop's batcher, made on first use."""
    loop = loop or asyncio.get_running_loop()
    batcher = _BATCHERS.get(loop)
    if batcher is None:
        batcher = _BATCHERS[loop] = Batcher(loop)
    return batcher


async def to_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread``, with this loop's calls of the same moment in one hop."""
    return await batcher_for().run(fn, *args, **kwargs)
