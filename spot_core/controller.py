"""The one attempt lifecycle: decide, launch, watch, classify, bill, close, record.

Its code lives in ``spot_core.lifecycle`` (the controller in parts: the lifecycle, the
handover, driver liveness, mid-run moves); this module keeps the import path every driver
uses::

    nxt = controller.advance(spec, record)          # finished | sleep until T | watch lease L
    while nxt.action == "watch":
        nxt = controller.check(spec, nxt)            # one observation; "ended" once it closed
    record = nxt.record

and ``Transition`` (``spot_core.lifecycle.transition``) is what every driver does between
those answers: finished, wait N seconds, or watch; an ended attempt's waiting handover
replacement adopted.
"""

from __future__ import annotations

from spot_core.lifecycle.closing import classify
from spot_core.lifecycle.controller import Controller
from spot_core.lifecycle.handover import (
    Replacement,
    ReplacementState,
    handover_mode,
    pending_replacement,
)
from spot_core.lifecycle.liveness import DriverLiveness
from spot_core.lifecycle.moves import Moves
from spot_core.lifecycle.transition import Step, Transition, adopts
from spot_core.lifecycle.types import (
    FINAL_STATUSES,
    NEXT_ACTIONS,
    JobSpec,
    Listener,
    Next,
    NextAction,
    Persist,
    provider_stores,
)

__all__ = [
    "FINAL_STATUSES",
    "NEXT_ACTIONS",
    "Controller",
    "DriverLiveness",
    "JobSpec",
    "Listener",
    "Moves",
    "Next",
    "NextAction",
    "Persist",
    "Replacement",
    "ReplacementState",
    "Step",
    "Transition",
    "adopts",
    "classify",
    "handover_mode",
    "pending_replacement",
    "provider_stores",
]
