"""Fencing: a zombie writer on a reclaimed node never commits over the attempt that
resumed the job elsewhere. ``FENCE.json`` holds the lowest attempt still allowed to save;
committed attempts fence too (the store reads both under its lock before each commit)."""

from __future__ import annotations

import json
import logging
import time

from spot_core.bounds import MAX_ATTEMPT
from spot_core.checkpoint.manifest import Manifest
from spot_core.checkpoint.store_base import StoreBase, _check_count, _unwritable
from spot_core.errors import CorruptCheckpoint, FencedOut

log = logging.getLogger("spot_core.checkpoint.store")  # one logger for the store's parts

FENCE_KEY = "FENCE.json"
MAX_FENCE_BYTES = 64 << 10  # a fence is ~50 bytes


class Fencing(StoreBase):
    """The fence half of ``CheckpointStore`` (which it is always part of)."""

    def _committed(self, *, skip_incomplete: bool = False) -> list[Manifest]:
        raise NotImplementedError  # CheckpointStore's: the self-verified manifests

    def fence(self, attempt: int) -> None:
        """Refuse saves from attempts below ``attempt`` from now on.

        The controller (or ``Checkpointer.from_env``) calls this when attempt N
        starts, before N has saved anything. Raises FencedOut if ``attempt`` is itself
        already stale, and CheckpointError (not a raw OSError) when the store cannot be
        written: the fence object is replaced whole, so a full or read-only store keeps
        its old fence and every checkpoint as they were.
        """
        attempt = _check_count("attempt", attempt, minimum=0, maximum=MAX_ATTEMPT)
        try:
            with self.backend.lock():
                self._check_fence(attempt)
                if attempt > self._fence_object():
                    doc = {"attempt": attempt, "fenced_at": time.time()}
                    self.backend.put_bytes(FENCE_KEY, json.dumps(doc, allow_nan=False).encode())
                    log.info("fenced %s: attempts below %d can no longer save", self.uri, attempt)
        except OSError as exc:
            raise _unwritable(self.uri, f"fence attempt {attempt}", exc) from exc

    def fence_level(self) -> int:
        """The lowest attempt still allowed to save: max of the fence and committed attempts."""
        committed = [m.attempt for m in self._committed()]
        return max([self._fence_object(), *committed])

    def _check_fence(self, attempt: int, committed: list[Manifest] | None = None) -> None:
        committed = self._committed() if committed is None else committed
        level = max([self._fence_object(), *(m.attempt for m in committed)])
        if attempt < level:
            raise FencedOut(
                f"attempt {attempt} may not write to {self.uri}: attempt {level} "
                "has started or committed there, so this writer is stale (its "
                "capacity was reclaimed); stop it instead of retrying"
            )

    def _fence_object(self) -> int:
        """The attempt in FENCE.json; 0 when absent or unreadable.

        An unreadable fence is skipped as corrupt (warned once) rather than blocking every
        resume: committed attempts still fence, and the next ``fence()`` rewrites it. A
        fence that could not be read whole is no such thing: its IncompleteRead is raised
        (the save fails, retryable), so a cut connection never unfences a stale writer.
        """
        try:
            data = self.backend.get_bytes(FENCE_KEY, max_bytes=MAX_FENCE_BYTES)
        except (FileNotFoundError, IsADirectoryError):
            return 0
        except CorruptCheckpoint as exc:  # a FIFO, a device, a huge file: never blocks
            self._warn_once(FENCE_KEY, exc)
            return 0
        attempt = _fence_attempt(data)
        if attempt is None:
            self._warn_once(
                FENCE_KEY,
                CorruptCheckpoint(
                    f"{FENCE_KEY} is not a fence object; the next fence() replaces it"
                ),
            )
            return 0
        return attempt


def _fence_attempt(data: bytes) -> int | None:
    """The attempt a fence object holds, or None if it is not one (any JSON, any depth)."""
    try:
        doc = json.loads(data, parse_constant=float)
        attempt = doc["attempt"]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt <= MAX_ATTEMPT:
        return None  # past MAX_ATTEMPT (an older version took any number): corrupt, replaced
    return attempt
