"""The job's other objects beside its checkpoints: status reports, the call exchange, the
driver's heartbeat, a work queue's spec. Each is one small object written whole, outside
the commit protocol (``store.py``)."""

from __future__ import annotations

from collections.abc import Callable

from spot_core.checkpoint.backend import UnknownAge, judged_age
from spot_core.checkpoint.fencing import FENCE_KEY
from spot_core.checkpoint.manifest import CHECKPOINTS_PREFIX
from spot_core.checkpoint.store_base import StoreBase, _unreadable, _unwritable
from spot_core.errors import ConfigError, CorruptCheckpoint

MAX_OBJECT_BYTES = 16 << 20  # heartbeats, driver beats, status reports: kilobytes


class JobObjects(StoreBase):
    # -- the job's other objects -------------------------------------------------------
    # Status reports, the call exchange and the driver's heartbeat live beside the
    # checkpoints (one place the instance profile already grants), but outside the commit
    # protocol: each is one small object, written whole. Keys are relative to the store
    # and must not fall under the checkpoints' own prefix.
    def put_object(self, key: str, data: bytes) -> None:
        """Write one whole object (atomic on every backend: a reader sees old or new).
        A full or read-only store is one CheckpointError naming the fix."""
        key = _object_key(key)
        try:
            self.backend.put_bytes(key, data)
        except OSError as exc:
            raise _unwritable(self.uri, f"write {key}", exc) from exc

    def get_object(self, key: str, *, max_bytes: int = MAX_OBJECT_BYTES) -> bytes | None:
        """The object's bytes, or None when there is none.

        What no writer of an object could have made (a FIFO, a device or a symlink in a
        file store, more than ``max_bytes``) is warned once and read as none, like a
        corrupt heartbeat: never a read that blocks, never an exception in a watcher."""
        try:
            return self.read_object(key, max_bytes=max_bytes)
        except CorruptCheckpoint as exc:
            self._warn_once(_object_key(key), exc)
            return None

    def read_object(self, key: str, *, max_bytes: int = MAX_OBJECT_BYTES) -> bytes | None:
        """The object's bytes, or None only when there is none; CorruptCheckpoint naming
        the problem when something is there that cannot be read (more than ``max_bytes``,
        not an object). For objects whose absence means something to the reader (a work
        queue's spec: absent means "create it first"), so "too big" never reads as absent.
        """
        key = _object_key(key)
        try:
            return self.backend.get_bytes(key, max_bytes=max_bytes)
        except (FileNotFoundError, IsADirectoryError):
            return None
        except OSError as exc:
            raise _unreadable(self.uri, key, exc) from exc

    def put_object_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``data`` only if nothing is stored under ``key``; False, and nothing
        written, if something is, even something no reader can read (too big, not an
        object). Why: what one writer made once (a work queue's spec) is never replaced by
        another, whatever the second could read of it."""
        key = _object_key(key)
        return self._write_if(key, data, lambda: not self._present(key), f"write {key}")

    def _write_if(self, key: str, data: bytes, may_write: Callable[[], bool], what: str) -> bool:
        """Write ``data`` under the backend's lock if ``may_write()`` still holds there."""
        try:
            with self.backend.lock():
                if not may_write():
                    return False
                self.backend.put_bytes(key, data)
                return True
        except OSError as exc:
            raise _unwritable(self.uri, what, exc) from exc

    def _present(self, key: str) -> bool:
        try:
            self.backend.size(key)
        except FileNotFoundError:
            return False
        except CorruptCheckpoint:
            return True  # something no writer made: still not nothing
        return True

    def delete_object(self, key: str) -> None:
        """Remove the object; a missing one is not an error."""
        key = _object_key(key)
        try:
            self.backend.delete(key)
        except OSError as exc:
            raise _unwritable(self.uri, f"delete {key}", exc) from exc

    def object_age(self, key: str) -> float | None:
        """Seconds since the object was last written, on the store's own clock
        (``ObjectBackend.age_seconds``); None when there is none. UnknownAge (warned once)
        when the store's clock cannot tell: the caller picks its safe side. Read the
        object first and its age after: the age is then that of the version read or of a
        newer one, never more than the version read's, so nothing read counts as older
        than it is."""
        return self._age(_object_key(key))

    def fence_age(self) -> float | None:
        """Seconds since the fence was last raised, on the store's clock; None without a
        fence; UnknownAge as ``object_age``. A driver tells by it a fence another driver
        raised a moment ago from one left by a driver long gone."""
        return self._age(FENCE_KEY)

    def _age(self, key: str) -> float | None:
        try:
            seconds = self.backend.age_seconds(key)
        except (FileNotFoundError, IsADirectoryError):
            return None
        except CorruptCheckpoint as exc:
            self._warn_once(key, exc)
            return None
        except OSError as exc:
            raise _unreadable(self.uri, key, exc) from exc
        age = judged_age(seconds, f"{self.uri}/{key}")
        if age is None:
            raise UnknownAge(
                f"the age of {key} in {self.uri} cannot be told by the store's clock "
                f"({seconds} s: written in its future, or it gave no time)"
            )
        return age

    def swap_object(self, key: str, expected: bytes | None, data: bytes) -> bool:
        """Write ``data`` only if the object still holds ``expected`` (None: absent).

        Compare-and-swap under the backend's lock (``flock`` on a file root, a
        conditional PUT on S3), so of several processes or machines swapping from the same
        content exactly one wins; False, and nothing written, for the others. Why: two
        drivers that both decide to take over the same job (an orphaned flow run) must
        agree on one.
        """
        key = _object_key(key)
        return self._write_if(key, data, lambda: self.get_object(key) == expected, f"swap {key}")


def _object_key(key: str) -> str:
    parts = key.split("/")
    if (
        not key
        or key.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or parts[0] in (CHECKPOINTS_PREFIX, FENCE_KEY)
    ):
        raise ConfigError(
            f"object key {key!r} is not a plain relative key outside "
            f"{CHECKPOINTS_PREFIX}/; use one like 'status/attempt-000001.json'"
        )
    return key
