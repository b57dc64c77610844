"""The trigger that watches one spot lease from the triggerer, without holding a worker slot.

It carries everything it needs in its kwargs, the JobRecord included, so a triggerer
that restarts (or another triggerer that picks the trigger up) resumes watching the
same lease: nothing lives in the triggerer's memory. It fires once, when the lease
ends (finished, failed, reclaimed), when an interruption notice is first seen, or when
its bounded wait runs out (it then terminates the lease first). With no lease it is a
bounded timer, used while the job waits for capacity.

It never terminates the lease in ``cleanup()``: cleanup also runs when a triggerer
restarts, and a restart must not cost the training run its node.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Mapping

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_spot.hooks.spot import SpotHook, status_to_dict
from spot_core.model import Lease
from spot_core.providers.base import LeaseState, LeaseStatus

EVENT_STATUSES = ("ended", "notice", "timeout", "wake", "error")


class SpotJobTrigger(BaseTrigger):
    """Watch ``lease`` until it ends or ``end_by`` (POSIX seconds) passes.

    :param provider: capacity provider name (``local``, ``ec2``, ``kubernetes``).
    :param provider_options: JSON-able options that reopen the provider in the triggerer.
    :param record: the job's JobRecord as a dict (``JobRecord.to_dict()``).
    :param lease: the lease to watch as a dict (``Lease.to_dict()``), or None to sleep.
    :param end_by: POSIX time at which the wait ends (a sleep wakes; a watch terminates).
    :param poll_interval: seconds between observations.
    :param return_on_notice: fire as soon as an interruption notice is served.
    :param not_before: POSIX time before which no event fires. Airflow 3.3 can resume a
        task whose trigger fires before the executor has reported the deferring process's
        exit, then retry it as a zombie; holding the event a few seconds avoids that race.
    """

    def __init__(self, *, provider: str, provider_options: Mapping[str, Any],
                 record: Mapping[str, Any], end_by: float, lease: Mapping[str, Any] | None = None,
                 poll_interval: float = 5.0, return_on_notice: bool = True,
                 not_before: float = 0.0) -> None:
        super().__init__()
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        self.provider = provider
        self.provider_options = dict(provider_options)
        self.record = dict(record)
        self.lease = None if lease is None else dict(lease)
        self.end_by = float(end_by)
        self.poll_interval = float(poll_interval)
        self.return_on_notice = bool(return_on_notice)
        self.not_before = float(not_before)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{self.__class__.__module__}.{self.__class__.__qualname__}", {
            "provider": self.provider, "provider_options": self.provider_options,
            "record": self.record, "lease": self.lease, "end_by": self.end_by,
            "poll_interval": self.poll_interval, "return_on_notice": self.return_on_notice,
            "not_before": self.not_before,
        })

    def _event(self, status: str, lease_status: LeaseStatus | None = None,
               message: str = "") -> TriggerEvent:
        return TriggerEvent({"status": status, "record": self.record, "lease": self.lease,
                             "lease_status": None if lease_status is None
                             else status_to_dict(lease_status), "message": message})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        if self.lease is None:
            await asyncio.sleep(max(0.0, max(self.end_by, self.not_before) - time.time()))
            yield self._event("wake")
            return
        try:
            event = await self._watch(SpotHook(self.provider, self.provider_options),
                                      Lease.from_dict(self.lease))
        except Exception as exc:  # noqa: BLE001 - reported to the operator, which terminates
            self.log.exception("watching lease %s failed", self.lease.get("lease_id"))
            event = self._event("error", message=f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(max(0.0, self.not_before - time.time()))
        yield event

    async def _watch(self, hook: SpotHook, lease: Lease) -> TriggerEvent:
        while True:
            status = await hook.aobserve(lease)
            if status.ended:
                return self._event("ended", status, status.message)
            if self.return_on_notice and status.notice_at is not None:
                return self._event("notice", status, "interruption notice served")
            if time.time() >= self.end_by:
                await hook.aterminate(lease)
                stopped = LeaseStatus(LeaseState.TERMINATED, ended_at=time.time(),
                                      message="stopped: the attempt's time limit passed")
                return self._event("timeout", stopped, stopped.message)
            await asyncio.sleep(min(self.poll_interval, max(0.05, self.end_by - time.time())))
