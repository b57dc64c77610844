"""The small object-store interface the checkpoint commit protocol is written against.

The protocol in ``store.py`` only needs what S3 offers natively (whole-object
atomic PUT, GET, LIST, DELETE), so an S3 backend can slot in beside ``FileBackend``
without touching the commit logic. Keys are relative POSIX paths ("a/b/c").
A missing key is reported as ``FileNotFoundError`` by every backend; something under a
key that no writer could have made (a FIFO, a device, a symlink, more bytes than the
reader's bound) as ``CorruptCheckpoint``, so readers skip it like any corrupt object.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from spot_core.errors import CheckpointError

log = logging.getLogger(__name__)

_warned: set[str] = set()
AGE_SLACK_SECONDS = 2.0
"""How far an object may seem to come from the store's future and still count as written
just now: S3's dates are whole seconds, and its servers' clocks differ by a little."""


@runtime_checkable
class ObjectBackend(Protocol):
    """Whole-object, atomically visible storage under one root.

    Every ``put_*`` is atomic and durable when it returns: readers see either no
    object or the complete one, never a prefix of it.
    """

    concurrent_reads: bool
    """Whether reading several objects at once is faster than one after another: a
    remote store's request latencies overlap; a local disk's reads only contend for the
    same cores (``make bench-resume``: S3 on moto 1.43x faster at once, a file store
    0.57x)."""

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically and durably."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` only if nothing is stored there; False, and nothing
        written, if something is. Atomic without ``lock()``: of two writers exactly one
        wins (S3: ``PUT If-None-Match: *``; a file store: a hard link). How a checkpoint's
        manifest is written, so no commit ever replaces another."""

    def put_stream(self, key: str, chunks: Iterable[bytes | memoryview]) -> int:
        """Store the concatenated ``chunks`` under ``key``; return bytes written.

        If iterating ``chunks`` raises, nothing becomes visible under ``key``.
        """

    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        """Return the whole object (FileNotFoundError if absent); CorruptCheckpoint if it
        holds more than ``max_bytes`` (then it is not read) or is no object at all (a FIFO,
        a device or a symlink in a file store: never opened in a way that could block)."""

    def iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        """Yield the object in chunks, so large objects can be hashed in bounded memory."""

    def size(self, key: str) -> int:
        """Return the object's size in bytes (FileNotFoundError if absent)."""

    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    def age_seconds(self, key: str) -> float:
        """Seconds since ``key`` was last written, both ends read on the STORE's clock
        (FileNotFoundError if absent): never this machine's clock against a time another
        machine wrote, since the two may be minutes or hours apart. Unjudged: negative
        (written in the store's future) or NaN (the store did not say); ``judged_age``
        turns it into an age or None."""

    def children(self, prefix: str) -> list[str]:
        """Names directly below ``prefix`` (like S3 LIST with delimiter '/'), sorted."""

    def delete(self, key: str) -> None:
        """Remove one object; a missing object is not an error."""

    def delete_prefix(self, prefix: str) -> None:
        """Remove every object under ``prefix`` (including partial uploads)."""

    def lock(self) -> AbstractContextManager[None]:
        """Exclusive section across processes for check-then-commit steps."""


class UnknownAge(CheckpointError):
    """The store's clock cannot tell an object's age (``judged_age`` gave None)."""


def judged_age(seconds: float, what: str) -> float | None:
    """An age the store's clock gives, or None when it cannot be one: not finite, or in
    the store's future by more than ``AGE_SLACK_SECONDS`` (a clock stepped back, a hand
    that set a date). None is "unknown", warned here; each caller picks its safe side
    for it (a second driver is refused, a lock or a claim is timed by the reader's own
    monotonic clock instead), so an unknown age never keeps a holder alive for ever and
    never ends one silently."""
    if math.isfinite(seconds) and seconds >= -AGE_SLACK_SECONDS:
        return max(0.0, seconds)
    if what in _warned or len(_warned) >= 1000:  # once per object: readers poll
        return None
    _warned.add(what)
    log.warning(
        "the store's clock gives %s an age of %s s; not an age (a time in the store's "
        "future, or none), so it is judged without it",
        what,
        seconds,
    )
    return None
