"""Saves in the background: stage the state on the loop's thread, upload it on another.

``Checkpointer(background=True)`` hands each save to a ``BackgroundSave``: the training
loop pays for ``stage`` (building the payload and copying what the loop will change next
into host memory) and goes on while a thread writes the staged copy through the store's
ordinary commit protocol (payload first, manifest last), so a save that fails or is cut
short is never committed.

At most one save is in flight, so the memory a background save costs is bounded by one
staged copy of the state (plus the store's own write buffers): a save that falls due while
one is in flight is skipped (the next ``maybe_save`` after it has committed saves the
newest state), never queued.

Staging: ``bytes`` are immutable and handed over as they are; ``bytearray`` and
``memoryview`` values are copied (the loop may write into them next step); a ``Staged``
value (``torch_state.staged_torch_payload``: tensors copied to CPU) is copied on the loop's
thread and serialised on the background one. Its copy goes into the staging buffers the
previous save used (kept by the Checkpointer, one set): filling memory already mapped is
several times faster than new memory (100 MB: 0.05 s against 0.35 s on this machine, where
the page faults of fresh memory dominate), and the staged copy stays one copy. Paths and
file objects cannot be staged (the loop could change the file while it is read) and are
refused in one line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from spot_core.errors import CheckpointError, ConfigError
from spot_core.model import CheckpointRef

log = logging.getLogger(__name__)

Serialise = Callable[[], bytes]


@runtime_checkable
class Staged(Protocol):
    """A payload value that copies itself now and serialises the copy later."""

    def stage(self, buffers: dict[str, Any]) -> Serialise:
        """Copy what the loop will change (on the loop's thread) into ``buffers`` where it
        fits (what this name's previous staging left there: no save reads them any more),
        keeping new ones there; return the serialiser of that copy (called once, on the
        saving thread)."""


def stage(payload: Mapping[str, Any], buffers: dict[str, Any]) -> dict[str, bytes | Serialise]:
    """The payload with every value safe to read from another thread while the loop goes
    on: bytes as they are, buffers copied, ``Staged`` values copied (serialised later).
    ``buffers``: the staging memory the previous save left, reused (one staged copy)."""
    return {name: _staged(name, value, buffers) for name, value in payload.items()}


def _staged(name: str, value: Any, buffers: dict[str, Any]) -> bytes | Serialise:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)  # the one staged copy
    if isinstance(value, Staged):
        return value.stage(buffers.setdefault(name, {}))
    raise ConfigError(
        f"payload {name!r} is a {type(value).__name__}, which a background save cannot "
        "stage (the loop could change it while it uploads); pass bytes, or tensors through "
        "spot_core.checkpoint.torch_state.staged_torch_payload, or save with background=False"
    )


def serialised(staged: Mapping[str, bytes | Serialise]) -> dict[str, bytes]:
    """The staged payload as bytes: each ``Staged`` value's serialiser run now."""
    return {name: value if isinstance(value, bytes) else value() for name, value in staged.items()}


class BackgroundSave:
    """One save running on its own thread; ``result`` after ``join``."""

    def __init__(self, step: int, save: Callable[[], CheckpointRef]) -> None:
        self.step = step
        self.started_at = time.perf_counter()
        self.seconds = 0.0  # from hand-over to commit (or failure)
        self.ref: CheckpointRef | None = None
        self.error: BaseException | None = None
        self._save = save
        # not a daemon: an interpreter that exits mid-save waits for the upload (bounded by
        # the store's own call deadlines) rather than leave a torn, uncommitted one
        self._thread = threading.Thread(target=self._run, name=f"ckpt-save-{step}")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.ref = self._save()
        except BaseException as exc:  # noqa: BLE001 - reported at the loop's next maybe_save
            self.error = exc
            log.warning("background checkpoint save of step %d failed: %s", self.step, exc)
        finally:
            self.seconds = time.perf_counter() - self.started_at

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout_seconds: float) -> bool:
        """Wait up to ``timeout_seconds``; True if the save has ended (committed or failed)."""
        self._thread.join(timeout_seconds)
        return self.done


def failed(save: BackgroundSave, uri: str, newest: int | None) -> CheckpointError:
    """The one error a failed background save surfaces as at the next ``maybe_save``: of
    the same class as the store's (a FencedOut stays a FencedOut), saying nothing was
    committed and what the store still holds."""
    exc = save.error
    assert exc is not None
    holds = "nothing" if newest is None else f"step {newest}"
    message = (
        f"the background checkpoint save of step {save.step} to {uri} failed: {exc}; "
        f"nothing of it was committed (the newest this loop committed is {holds})"
    )
    kind = type(exc) if isinstance(exc, CheckpointError) else CheckpointError
    retryable = getattr(exc, "retryable", None)
    try:
        return kind(message, retryable=retryable)
    except TypeError:  # a subclass with another signature: the base class says the same
        return CheckpointError(message, retryable=retryable)
