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
        self._warned_links: set[str] = set()  # prefixes listed as empty for a symlink
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
        folders, name = self._leaf(key)
        with self._folder(folders, key, create=True, write=True) as folder:
            tmp, written = _write_temp(folder, chunks)
            try:  # replaces a symlink itself, never what it points to
                os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
            except BaseException:
                _unlink_quietly(tmp, folder)
                raise
            os.fsync(folder)
        return written

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` only if nothing (of any kind) is there; False, and
        nothing written, if something is. Written beside the name and hard-linked to it:
        ``link`` fails when the name exists, so of two writers exactly one wins, atomically,
        without the store's lock (what S3's ``If-None-Match: *`` does)."""
        folders, name = self._leaf(key)
        with self._folder(folders, key, create=True, write=True) as folder:
            tmp, _ = _write_temp(folder, (data,))
            try:
                os.link(tmp, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
            except FileExistsError:
                return False
            finally:
                _unlink_quietly(tmp, folder)
            os.fsync(folder)
        return True

    def delete(self, key: str) -> None:
        """A missing object is not an error; a store that refuses the unlink (read-only,
        no permission) is, so the caller can say so."""
        folders, name = self._leaf(key)
        try:
            with self._folder(folders, key, write=True) as folder:
                os.unlink(name, dir_fd=folder)  # a symlink itself, never its target
        except (FileNotFoundError, NotADirectoryError):
            pass
        except IsADirectoryError:  # no object of ours; leave someone's folder alone
            log.warning("not removing %s: it is a folder, not an object", self._path(key))

    def delete_prefix(self, prefix: str) -> None:
        parts = self._parts(prefix)
        if not parts:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        *folders, name = parts
        try:
            with self._folder(folders, prefix, write=True) as folder:
                # rmtree with a dir_fd opens every level without following symlinks
                shutil.rmtree(name, ignore_errors=True, dir_fd=folder)
                _unlink_non_folder(name, folder)
                os.fsync(folder)
        except (FileNotFoundError, NotADirectoryError):
            pass

    # -- reads -------------------------------------------------------------------
    # Only regular files are objects: each is opened with O_NOFOLLOW | O_NONBLOCK after an
    # lstat (``spot_core.safe_files``), so a FIFO, a device, a socket or a symlink put in
    # the store by someone else is a corrupt object, never a read that blocks or never ends.
    # The folders above it are opened the same way one by one from the root (``_folder``),
    # so a folder replaced by a symlink leads no read or write outside the root.
    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        limit = sys.maxsize if max_bytes is None else max_bytes
        folders, name = self._leaf(key)
        with self._folder(folders, key) as folder:
            try:
                return read_bytes(
                    name, limit=limit, what="object", follow_symlinks=False, dir_fd=folder
                )
            except UnsafeFile as exc:
                raise _not_an_object(key, exc) from None

    def iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        folders, name = self._leaf(key)
        with self._folder(folders, key) as folder:
            try:
                handle = open_regular(name, what="object", follow_symlinks=False, dir_fd=folder)
            except UnsafeFile as exc:
                raise _not_an_object(key, exc) from None
        with handle:
            while chunk := handle.read(chunk_size):
                yield chunk

    def size(self, key: str) -> int:
        folders, name = self._leaf(key)
        with self._folder(folders, key) as folder:
            info = os.lstat(name, dir_fd=folder)
        if stat.S_ISDIR(info.st_mode):
            raise FileNotFoundError(errno.ENOENT, "is a directory, not an object", key)
        if not stat.S_ISREG(info.st_mode):
            path = self._path(key)
            raise _not_an_object(key, not_regular(path, info.st_mode, "object"))
        return info.st_size

    def exists(self, key: str) -> bool:
        folders, name = self._leaf(key)
        try:
            with self._folder(folders, key) as folder:
                return stat.S_ISREG(os.lstat(name, dir_fd=folder).st_mode)
        except (OSError, CorruptCheckpoint):
            return False

    def age_seconds(self, key: str) -> float:
        """The object's mtime against the mtime the same filesystem gives a probe written
        now: both are the clock of whatever sets mtimes (the local kernel, or an NFS
        server), never this process's clock against another machine's."""
        path = self._path(key)  # for messages: the object is reached from the root
        folders, name = self._leaf(key)
        with self._folder(folders, key) as folder:
            info = os.lstat(name, dir_fd=folder)
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
            with self._folder(self._parts(prefix), prefix) as folder:
                names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except CorruptCheckpoint as exc:  # a planted symlink: lists as empty, warned once
            if prefix not in self._warned_links:
                self._warned_links.add(prefix)
                log.warning("%s: listing %r as empty: %s", self.root, prefix, exc)
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

    # -- paths -------------------------------------------------------------------
    def _parts(self, key: str) -> list[str]:
        parts = key.strip("/").split("/") if key else []
        if any(p in ("", ".", "..") or "\x00" in p for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        return parts

    def _leaf(self, key: str) -> tuple[list[str], str]:
        """An object key as its folders and its name (the root holds no nameless object)."""
        *folders, name = self._parts(key) or [""]
        if not name:
            raise ValueError(f"invalid object key {key!r}")
        return folders, name

    def _path(self, key: str) -> str:
        """The key's path, for messages (every access goes through ``_folder``)."""
        return os.path.join(self.root, *self._parts(key))

    @contextmanager
    def _folder(
        self, parts: list[str], key: str, *, create: bool = False, write: bool = False
    ) -> Iterator[int]:
        """A descriptor of the folder ``root/parts...``, walked one level at a time from
        the root with O_NOFOLLOW (``openat``), so no folder under the root can be a
        symlink: someone who can write the store (a step) cannot make the driver read or
        write elsewhere. The root itself is the user's choice and may be a link.

        ``create``: make missing folders (each fsynced into its parent). A symlink on the
        way is a CorruptCheckpoint for a read (the store's rules skip it, with a warning)
        and a CheckpointError for a ``write``; FileNotFoundError when a folder is missing."""
        fd = os.open(self.root, _FOLDER_FLAGS)
        try:
            for depth, part in enumerate(parts):
                below = self._open_below(fd, part, create)
                if below is None:
                    raise self._planted(parts[: depth + 1], key, fd, part, write=write)
                os.close(fd)
                fd = below
            yield fd
        finally:
            os.close(fd)

    def _open_below(self, fd: int, part: str, create: bool) -> int | None:
        """The folder ``part`` in ``fd`` opened without following a link; None if a link."""
        for _ in range(2):
            try:
                return os.open(part, _FOLDER_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, dir_fd=fd)
                    os.fsync(fd)  # the new entry survives a crash
                except FileExistsError:
                    pass
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if not stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise  # a file where a folder should be: as before, no object here
                return None
        return os.open(part, _FOLDER_FLAGS | os.O_NOFOLLOW, dir_fd=fd)

    def _planted(
        self, parts: list[str], key: str, fd: int, part: str, *, write: bool
    ) -> CheckpointError:
        folder = os.path.join(self.root, *parts)
        try:
            target = os.readlink(part, dir_fd=fd)
        except OSError:
            target = "?"
        link = (
            f"{folder} is a symbolic link (to {target}); no writer of this store made it, "
            "and nothing is read or written through it (remove the link)"
        )
        if write:
            return CheckpointError(f"refusing to write {key} in {self.root}: {link}")
        return CorruptCheckpoint(f"object {key} is not read: {link}")


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _not_an_object(key: str, exc: UnsafeFile) -> CorruptCheckpoint:
    return CorruptCheckpoint(
        f"object {key} {exc.problem}; no writer of this store made it (remove it)"
    )


def _write_temp(folder: int, chunks: Iterable[bytes | memoryview]) -> tuple[str, int]:
    """A fresh temporary file in ``folder`` holding ``chunks``, fsynced: (its name, bytes);
    removed again if writing fails."""
    tmp = f"{TEMP_PREFIX}{secrets.token_hex(6)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(tmp, flags, 0o644, dir_fd=folder)
    try:
        written = _write_all(fd, chunks)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp, folder)
        raise
    os.close(fd)
    return tmp, written


def _write_all(fd: int, chunks: Iterable[bytes | memoryview]) -> int:
    written = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view:
            n = os.write(fd, view)
            view = view[n:]
            written += n
    return written


def _unlink_non_folder(name: str, folder: int) -> None:
    """What rmtree left of ``name``: a file or a symlink (the link, never its target)."""
    try:
        if not stat.S_ISDIR(os.lstat(name, dir_fd=folder).st_mode):
            os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass


def _unlink_quietly(name: str, folder: int) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", name, exc)
