"""Error hierarchy whose retryability is data, not a matter of exception names.

Controllers and engine adapters decide what to do with an error by reading
``retryable`` and ``outcome`` (the attempt outcome it implies), never by matching
class names or message strings. Every message says what is wrong and how to fix it,
because these errors surface as one-line CLI errors and DAG parse-time errors.
"""

from __future__ import annotations


class SpotError(Exception):
    """Base of every error spot-pipelines raises on purpose.

    ``retryable``: whether retrying the same operation may succeed.
    ``outcome``: the attempt outcome this error implies (a value of
    ``spot_core.model.Outcome``), or None when it says nothing about an attempt.
    """

    retryable: bool = False
    outcome: str | None = None

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class ConfigError(SpotError, ValueError):
    """Bad input from the user: a URI, an interval, a cloud name. Never retryable."""


class CheckpointError(SpotError):
    """Something about checkpoints went wrong."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint's manifest or payload does not verify (torn write, bit flip, tampering)."""


class CheckpointNotFound(CheckpointError):
    """The checkpoint a reference names is not (or no longer) in the store."""


class IncompleteRead(CheckpointError):
    """A read from the store ended short of the length (or digest) the store declared:
    the connection was cut, not the object. Never taken as the object; retryable."""

    retryable = True


class StoreUnavailable(CheckpointError):
    """The store could not be written or read: full, read-only, unreachable, refusing
    access. The infrastructure's fault, never the step's: a step ends with the
    infrastructure exit code and its attempt is ``infrastructure_failed``, spending no
    user retry. ``retryable`` says whether the same call may succeed later (a full disk
    may drain; a read-only mount does not come back by itself)."""

    outcome = "infrastructure_failed"


class FencedOut(CheckpointError):
    """A save from an attempt older than the newest committed attempt.

    Raised so a zombie writer on a preempted node can never overwrite the progress of
    the attempt that resumed the job elsewhere. Not retryable: the writer is stale.
    """


class DriverConflict(SpotError):
    """Another driver process holds the job (its heartbeat is fresh): a second one would
    fence the first one's attempt out and run a second step at once. Not retryable as is:
    stop the other driver, wait for its heartbeat timeout, or take the job over."""


class ReplacementNotNeeded(SpotError):
    """A replacement launched on a rebalance recommendation learnt that the attempt it
    was to take over finished the work with no interruption (its step exited 0, no
    notice): it must not fence the store or run the step again; the controller ends its
    lease. Not retryable."""


class Preempted(SpotError):
    """The capacity this attempt ran on was reclaimed (or a notice says it will be)."""

    retryable = True
    outcome = "preempted"


class CapacityUnavailable(SpotError):
    """No capacity could be had in the requested pool(s) right now."""

    retryable = True
    outcome = "capacity_unavailable"


class InfrastructureError(SpotError):
    """A failure outside the step's own code that is not a preemption."""

    retryable = True
    outcome = "infrastructure_failed"


class UserStepFailed(SpotError):
    """The step's own code failed; it consumes the engine's user retries."""

    outcome = "user_failed"


class MetadataEndpointError(SpotError):
    """An instance metadata endpoint was down, slow or answered garbage."""

    retryable = True
