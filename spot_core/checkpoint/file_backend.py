"""Local-filesystem object backend with S3-like atomic whole-object writes.

Every object is written to a temporary name in its final directory, fsynced,
renamed into place and the directory fsynced: after a crash (or SIGKILL) a key is
either absent or complete. Temporary names start with ``TEMP_PREFIX`` and are
invisible to ``children``; ``delete_prefix`` sweeps them with the rest.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import shutil
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from spot_core.errors import CheckpointError, ConfigError, CorruptCheckpoint
from spot_core.safe_files import (
    UnsafeFile,
    is_regular,
    kind_of,
    not_regular,
    open_regular,
    read_bytes,
)

log = logging.getLogger(__name__)

TEMP_PREFIX = ".spot-tmp-"
LOCK_NAME = ".spot-lock"
CLOCK_NAME = LOCK_NAME  # the clock probe: the lock file, whose content nothing reads


class FileBackend:
    """Objects as files under ``root``; keys are relative POSIX paths."""

    concurrent_reads = False  # a local disk: reading files at once only adds contention

    def __init__(self, root: str, *, lock_timeout: float = 120.0) -> None:
        self.root = os.path.abspath(root)
        self.lock_timeout = lock_timeout
        self._clock_warned = False
        try:
            os.makedirs(self.root, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise ConfigError(
                f"checkpoint store path {self.root} exists and is not a "
                "directory; point the store URI at a directory"
            ) from exc
        except OSError as exc:  # permission, read-only or pseudo file system, no space
            raise ConfigError(
                f"cannot create checkpoint store directory {self.root} "
                f"({exc.strerror}); choose a writable path"
            ) from exc

    def __repr__(self) -> str:
        return f"FileBackend({self.root!r})"

    # -- writes ------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        self.put_stream(key, (data,))

    def put_stream(self, key: str, chunks: Iterable[bytes | memoryview]) -> int:
        path = self._path(key)
        directory = os.path.dirname(path)
        self._makedirs_durable(directory)
        tmp = os.path.join(directory, f"{TEMP_PREFIX}{secrets.token_hex(6)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            written = _write_all(fd, chunks)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        _fsync_dir(directory)
        return written

    def delete(self, key: str) -> None:
        """A missing object is not an error; a store that refuses the unlink (read-only,
        no permission) is, so the caller can say so."""
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except IsADirectoryError:  # no object of ours; leave someone's folder alone
            log.warning("not removing %s: it is a folder, not an object", self._path(key))

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        shutil.rmtree(path, ignore_errors=True)
        if os.path.lexists(path) and not os.path.isdir(path):
            _unlink_quietly(path)
        if os.path.isdir(os.path.dirname(path)):
            _fsync_dir(os.path.dirname(path))

    # -- reads -------------------------------------------------------------------
    # Only regular files are objects: each is opened with O_NOFOLLOW | O_NONBLOCK after an
    # lstat (``spot_core.safe_files``), so a FIFO, a device, a socket or a symlink put in
    # the store by someone else is a corrupt object, never a read that blocks or never ends.
    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        limit = sys.maxsize if max_bytes is None else max_bytes
        try:
            return read_bytes(self._path(key), limit=limit, what="object", follow_symlinks=False)
        except UnsafeFile as exc:
            raise _not_an_object(key, exc) from None

    def iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        try:
            handle = open_regular(self._path(key), what="object", follow_symlinks=False)
        except UnsafeFile as exc:
            raise _not_an_object(key, exc) from None
        with handle:
            while chunk := handle.read(chunk_size):
                yield chunk

    def size(self, key: str) -> int:
        path = self._path(key)
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            raise FileNotFoundError(errno.ENOENT, "is a directory, not an object", path)
        if not stat.S_ISREG(info.st_mode):
            raise _not_an_object(key, not_regular(path, info.st_mode, "object"))
        return info.st_size

    def exists(self, key: str) -> bool:
        return is_regular(self._path(key))

    def age_seconds(self, key: str) -> float:
        """The object's mtime against the mtime the same filesystem gives a probe written
        now: both are the clock of whatever sets mtimes (the local kernel, or an NFS
        server), never this process's clock against another machine's."""
        path = self._path(key)
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            raise FileNotFoundError(errno.ENOENT, "is a directory, not an object", path)
        if not stat.S_ISREG(info.st_mode):
            raise _not_an_object(key, not_regular(path, info.st_mode, "object"))
        return self._now() - info.st_mtime

    def _now(self) -> float:
        """The store's time now: the mtime of a one-byte write to the probe file. A store
        this process cannot write (read-only) falls back to this machine's clock, which is
        the same clock on a local disk (warned once: on a network filesystem it is not)."""
        path = os.path.join(self.root, CLOCK_NAME)
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(path, flags, 0o644)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file", path)
                os.pwrite(fd, b"\n", 0)
                return os.fstat(fd).st_mtime
            finally:
                os.close(fd)
        except OSError as exc:
            if not self._clock_warned:
                self._clock_warned = True
                log.warning(
                    "cannot write the clock probe %s (%s); judging ages in %s by this "
                    "machine's clock",
                    path,
                    exc.strerror or exc,
                    self.root,
                )
            return time.time()

    def children(self, prefix: str) -> list[str]:
        try:
            names = os.listdir(self._path(prefix) if prefix else self.root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(n for n in names if not n.startswith((TEMP_PREFIX, LOCK_NAME)))

    # -- locking -----------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[None]:
        """``flock`` on a lock file; bounded wait so a hung holder cannot block forever."""
        path = os.path.join(self.root, LOCK_NAME)
        fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644
        )
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise CheckpointError(
                    f"the store's lock file {path} is {kind_of(mode)}, not a "
                    "regular file; remove it (no writer holds it)"
                )
            self._acquire(fd)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _acquire(self, fd: int) -> None:
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise CheckpointError(
                        f"timed out after {self.lock_timeout:.0f}s waiting for the lock on "
                        f"{self.root}; another process holds it (is a writer hung?)",
                        retryable=True,
                    ) from None
                time.sleep(0.005)

    # -- helpers -----------------------------------------------------------------
    def _path(self, key: str) -> str:
        parts = key.strip("/").split("/") if key else []
        if any(p in ("", ".", "..") or "\x00" in p for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        return os.path.join(self.root, *parts)

    def _makedirs_durable(self, directory: str) -> None:
        """Create missing directories and fsync each parent so the new entry survives a crash."""
        if os.path.isdir(directory):
            return
        parent = os.path.dirname(directory)
        self._makedirs_durable(parent)
        try:
            os.mkdir(directory)
        except FileExistsError:
            return
        _fsync_dir(parent)


def _not_an_object(key: str, exc: UnsafeFile) -> CorruptCheckpoint:
    return CorruptCheckpoint(
        f"object {key} {exc.problem}; no writer of this store made it (remove it)"
    )


def _write_all(fd: int, chunks: Iterable[bytes | memoryview]) -> int:
    written = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view:
            n = os.write(fd, view)
            view = view[n:]
            written += n
    return written


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
