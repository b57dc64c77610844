"""Which of a worker's watched flow runs are being cancelled: one read for all of them.

Why: each watched flow run used to read itself from the Prefect API every
``CANCEL_CHECK_SECONDS``, so a worker watching 200 runs sent 100 reads a second, and the
reads were the second cost of the worker's CPU after the heartbeats
(``bench/scale_prefect.py``). ``CancellingRuns`` answers every watcher from one
``read_flow_runs`` by id per interval (pages of ``PAGE`` ids), made by whichever watcher
asks first once the last answer is older than the interval. The server filters by state
too, so an answer holds only the runs being cancelled (usually none): parsing 200 full
flow runs every interval was most of an idle worker's CPU per watched run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import anyio

CANCEL_CHECK_SECONDS = 2.0  # how often the watched flow runs are checked for cancellation
PAGE = 200  # ids per read (the Prefect API's default page limit)


class CancellingRuns:
    """The watched flow runs and, as of the last read, those cancelling or cancelled."""

    def __init__(
        self, interval: float = CANCEL_CHECK_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._watched: dict[UUID, int] = {}
        self._cancelling: set[UUID] = set()
        self._read_at = float("-inf")
        self._lock: anyio.Lock | None = None  # made in the worker's event loop

    def watch(self, flow_run_id: UUID) -> None:
        self._watched[flow_run_id] = self._watched.get(flow_run_id, 0) + 1

    def unwatch(self, flow_run_id: UUID) -> None:
        left = self._watched.get(flow_run_id, 0) - 1
        if left > 0:
            self._watched[flow_run_id] = left
        else:
            self._watched.pop(flow_run_id, None)
            self._cancelling.discard(flow_run_id)

    async def is_cancelling(self, client: Any, flow_run_id: UUID) -> bool:
        """Whether the flow run is cancelling or cancelled, read at most an interval ago.

        A fresh answer is read without the lock, so the watchers a poll wakes together
        go on together (their checks then share a thread hop, ``spot_core.batched``)."""
        if self._clock() - self._read_at < self._interval:
            return flow_run_id in self._cancelling
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._clock() - self._read_at >= self._interval:
                self._cancelling = await self._read(client, [*self._watched, flow_run_id])
                self._read_at = self._clock()
        return flow_run_id in self._cancelling

    @staticmethod
    async def _read(client: Any, ids: list[UUID]) -> set[UUID]:
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterId,
            FlowRunFilterState,
            FlowRunFilterStateType,
        )
        from prefect.client.schemas.objects import StateType

        ending = FlowRunFilterState(
            type=FlowRunFilterStateType(any_=[StateType.CANCELLING, StateType.CANCELLED])
        )
        unique = list(dict.fromkeys(ids))
        found: set[UUID] = set()
        for start in range(0, len(unique), PAGE):
            page = unique[start : start + PAGE]
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=page), state=ending),
                limit=len(page),
            )
            found.update(
                run.id
                for run in runs
                if run.state is not None and (run.state.is_cancelling() or run.state.is_cancelled())
            )
        return found
