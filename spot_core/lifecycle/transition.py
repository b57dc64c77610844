"""The one transition every driver makes between the controller's answers.

A driver (``Controller.run``, the Airflow operator and its trigger, the Prefect worker)
asks the controller what to do (``advance``), watches a lease (``check``) and goes on
once an attempt ended. What follows each answer is the same for all of them; only how
they wait differs (a sleep, an anyio sleep, a deferral, the shared observer). So the
rule is written here once, and a driver keeps its waits::

    transition = Transition(controller, spec)
    step = transition.start(record)
    while step.action != "finished":
        if step.action == "wait":
            wait(step.wait_seconds)                          # the driver's own way
            step = transition.woke(step.next)
        else:                                                # watch step.lease
            step = transition.follow(watch_until_it_ends(step.next))

``follow`` of an ``ended`` Next asks the controller again. When the attempt's handover
replacement (launched on its notice) is waiting, that adopts it: the job goes on on the
replacement (``Step.adopted``), neither ending nor relaunching. Pure of engine
knowledge: it calls nothing but ``advance``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from spot_core.lifecycle.handover import pending_replacement
from spot_core.lifecycle.types import JobSpec, Next
from spot_core.model import JobRecord, Lease

StepAction = Literal["finished", "wait", "watch"]


class Lifecycle(Protocol):
    """What a transition uses of the controller."""

    def advance(self, spec: JobSpec, record: JobRecord, now: float | None = None) -> Next: ...


@dataclass(frozen=True)
class Step:
    """What the driver does now, with the controller's ``Next`` it comes from.

    ``finished``: report ``record`` (its status says how, ``reason`` why). ``wait``: wait
    ``wait_seconds``, then call ``Transition.woke``. ``watch``: watch ``lease`` (the
    controller's ``check``, until it answers anything but ``watch``), then call
    ``Transition.follow``; ``adopted``: that lease is a handover's replacement, adopted
    just now from the attempt that ended (a Prefect worker lets the flow run's engine
    start on it).
    """

    action: StepAction
    next: Next
    wait_seconds: float = 0.0
    adopted: bool = False

    @property
    def record(self) -> JobRecord:
        return self.next.record

    @property
    def reason(self) -> str:
        return self.next.reason

    @property
    def lease(self) -> Lease:
        """The watched lease (a ``watch`` step always carries one)."""
        if self.next.lease is None:
            raise ValueError(f"job {self.record.job_id}: a {self.action} step has no lease")
        return self.next.lease


def adopts(nxt: Next) -> bool:
    """``nxt`` is an ended attempt whose handover replacement waits: following it adopts
    the replacement (the job goes on on it) rather than deciding the job's next attempt."""
    return nxt.action == "ended" and pending_replacement(nxt.record) is not None


class Transition:
    """One job's way from each of the controller's answers to what its driver does next.

    ``clock``: the time a ``wait`` is measured against (the controller's own, for
    ``Controller.run``; POSIX time for every other driver, as ``Next.until`` is).
    """

    def __init__(
        self, lifecycle: Lifecycle, spec: JobSpec, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.lifecycle = lifecycle
        self.spec = spec
        self._clock = clock

    def start(self, record: JobRecord) -> Step:
        """The first step for ``record`` (a new one, or one an earlier driver left: a
        running attempt is watched again, not relaunched; a waiting replacement is adopted
        too, but not flagged ``adopted``, which marks an adoption after an end this driver
        followed, as before this helper)."""
        return self.follow(self.lifecycle.advance(self.spec, record))

    def woke(self, nxt: Next) -> Step:
        """The wait of a ``wait`` step (its ``next``) is over: ask the controller again."""
        return self.follow(self.lifecycle.advance(self.spec, nxt.record))

    def follow(self, nxt: Next) -> Step:
        """The step that follows ``nxt``; an ``ended`` attempt asks the controller again
        (adopting a waiting handover replacement, see ``adopts``).

        Raises what ``Controller.advance`` raises, for an ended attempt.
        """
        if nxt.action == "finished":
            return Step("finished", nxt)
        if nxt.action == "sleep":
            return Step("wait", nxt, wait_seconds=max(0.0, nxt.until - self._clock()))
        if nxt.action == "watch":
            return Step("watch", nxt)
        adopting = adopts(nxt)
        after = self.lifecycle.advance(self.spec, nxt.record)
        if after.action == "ended":  # advance decides, launches or watches; it ends nothing
            raise ValueError(f"job {self.spec.job_id}: advance() answered 'ended'")
        step = self.follow(after)
        return dataclasses.replace(step, adopted=adopting and step.action == "watch")
