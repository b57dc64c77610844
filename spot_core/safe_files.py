"""Read and write users' files without hanging on them or destroying them.

Every file a command reads (a trace, a price file, a record, a notice) and every file it
writes (an HTML report, a record, a notice, a result) goes through here, so one set of
rules holds everywhere:

- Reads open only regular files, never block, and never read more than a stated bound:
  a FIFO, a device (``/dev/zero``), a socket or a folder is refused before any byte is
  read (a FIFO with no writer would block ``open`` for ever; ``/dev/zero`` never ends).
- Writes go to a temporary file beside the target that is renamed over it, so a reader
  sees the old file or the whole new one. Only a regular file is ever replaced; a target
  that is a symbolic link, a device, a FIFO, a socket or a folder is refused, and so is a
  target that is the same file as one of the command's inputs (compared by device and
  inode, so a hard link or another spelling of the path is caught too). An existing
  file keeps its mode (and owner where allowed); a new one follows the umask.

Refusals are ``UnsafeFile`` (a ``ConfigError``): one line naming the path and the fix.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO, Union

from spot_core.errors import ConfigError, SpotError

PathLike = Union[str, "os.PathLike[str]"]
TEMP_PREFIX = ".spot-tmp-"
READ_CHUNK = 1 << 20


class WriteFailed(SpotError):
    """The file system refused a write (full, read-only, no permission); nothing changed.
    Retryable when the disk is full (space may come back), not otherwise."""


class UnsafeFile(ConfigError):
    """A path a command must not read or write: not a regular file, too large, a symlink
    where a write would replace the link, or the same file as an input.

    ``problem``: what is wrong, without the path or the fix ("is a FIFO (named pipe), not
    a regular file"), for callers that name the thing in their own words (a store object).
    """

    def __init__(self, message: str, *, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem or message


# -- reading --------------------------------------------------------------------------------
def read_bytes(
    path: PathLike,
    *,
    limit: int,
    what: str = "file",
    follow_symlinks: bool = True,
    dir_fd: int | None = None,
) -> bytes:
    """The whole regular file at ``path``, at most ``limit`` bytes.

    FileNotFoundError and IsADirectoryError pass through (callers name those in their
    own words); anything else that is not a regular file, or is larger than ``limit``,
    is UnsafeFile. ``follow_symlinks=False`` refuses a symlink too (a store's objects);
    ``dir_fd``: ``path`` is relative to that open folder (a store walks to it itself).
    """
    with open_regular(path, what=what, follow_symlinks=follow_symlinks, dir_fd=dir_fd) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise too_large(path, size, limit, what)
        return _read_at_most(handle, path, limit, what, size)


def read_text(path: PathLike, *, limit: int, what: str = "file", encoding: str = "utf-8") -> str:
    """``read_bytes`` decoded (UnicodeDecodeError passes through)."""
    return read_bytes(path, limit=limit, what=what).decode(encoding)


def read_stream(stream: BinaryIO, *, limit: int, what: str = "standard input") -> bytes:
    """At most ``limit`` bytes of an open binary stream (stdin redirected from /dev/zero
    must not read for ever); more is UnsafeFile."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{what} holds more than {_size(limit)}; pass a smaller file")
    return data


def open_regular(
    path: PathLike,
    *,
    what: str = "file",
    follow_symlinks: bool = True,
    dir_fd: int | None = None,
) -> BinaryIO:
    """An unbuffered binary handle on the regular file at ``path``, opened without blocking.

    Checked before opening (a tape drive rewinds, a FIFO blocks, on open) and again on the
    open descriptor (the path may have been swapped in between). ``dir_fd``: ``path`` is
    relative to that open folder."""
    _check_no_nul(path, what)
    before = os.stat(path, follow_symlinks=follow_symlinks, dir_fd=dir_fd)
    _check_readable(path, before, what)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise not_regular(path, stat.S_IFLNK, what) from None
        raise
    try:
        opened = os.fstat(fd)
        _check_readable(path, opened, what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: PathLike, *, what: str = "file", follow_symlinks: bool = True) -> None:
    """UnsafeFile unless ``path`` is a regular file (FileNotFoundError if there is none)."""
    mode = os.stat(path, follow_symlinks=follow_symlinks).st_mode
    if not stat.S_ISREG(mode):
        raise not_regular(path, mode, what)


def is_regular(path: PathLike, *, follow_symlinks: bool = False) -> bool:
    """Whether ``path`` is a regular file (by default a symlink is not one)."""
    try:
        return stat.S_ISREG(os.stat(path, follow_symlinks=follow_symlinks).st_mode)
    except (OSError, ValueError):
        return False


def _check_no_nul(path: PathLike, what: str) -> None:
    if "\x00" in os.fspath(path):
        raise UnsafeFile(
            f"{what} {os.fspath(path)!r} holds a NUL character; no file has "
            "such a name, check the path",
            problem="names no file (a NUL in it)",
        )


def _check_readable(path: PathLike, info: os.stat_result, what: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(path))
    if not stat.S_ISREG(info.st_mode):
        raise not_regular(path, info.st_mode, what)


def _read_at_most(handle: BinaryIO, path: PathLike, limit: int, what: str, size: int) -> bytes:
    """Read to the end, one allocation in the common case (the size ``fstat`` gave)."""
    first = handle.read(size + 1) if size else handle.read(min(READ_CHUNK, limit + 1))
    parts, total = [first], len(first)
    while first and total <= limit:
        more = handle.read(min(READ_CHUNK, limit + 1 - total))
        if not more:
            break
        parts.append(more)
        total += len(more)
    if total > limit:
        raise too_large(path, total, limit, what)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def not_regular(path: PathLike, mode: int, what: str) -> UnsafeFile:
    problem = f"is {kind_of(mode)}, not a regular file"
    return UnsafeFile(
        f"{what} {os.fspath(path)} {problem}; pass the path of a regular file", problem=problem
    )


def too_large(path: PathLike, size: int, limit: int, what: str) -> UnsafeFile:
    problem = f"holds more than {_size(limit)} ({_size(size)} read)"
    return UnsafeFile(
        f"{what} {os.fspath(path)} {problem}; that is not a file of this kind, check the path",
        problem=problem,
    )


def kind_of(mode: int) -> str:
    """'a FIFO', 'a character device', ... for a stat mode: what a user should look for."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


# -- writing --------------------------------------------------------------------------------
def check_target(
    path: PathLike, *, inputs: Sequence[PathLike | int] = (), what: str = "output"
) -> Path:
    """Refuse, in one line, a path a command must not write; return it as a Path.

    ``inputs``: the command's input paths (or open descriptors, such as stdin's 0), which
    the output must not be. The folder must exist already: a command creates no folders
    on its own (a typo would leave them behind)."""
    _check_no_nul(path, what)
    target = Path(path)
    if not target.name or target.name in (".", ".."):
        raise UnsafeFile(
            f"{what} {target} names a folder; give a file name such as {target / 'out'}"
        )
    folder = target.parent
    if not folder.is_dir():
        problem = "is not a folder" if os.path.lexists(folder) else "does not exist"
        raise UnsafeFile(
            f"{what} {target}: folder {folder} {problem}; create it or choose another path"
        )
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return target
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeFile(
            f"{what} {target} is a symbolic link (to {os.readlink(target)}); "
            "give the path of the file itself, or remove the link (writing "
            "would replace the link, not the file it points to)"
        )
    if stat.S_ISDIR(info.st_mode):
        raise UnsafeFile(
            f"{what} {target} is a folder; give a file name inside it, such as {target / 'out'}"
        )
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFile(
            f"{what} {target} is {kind_of(info.st_mode)}, not a regular file; "
            "give the path of a regular file (it is replaced whole)"
        )
    for source in inputs:
        if _same_file(info, source):
            shown = "standard input" if isinstance(source, int) else os.fspath(source)
            raise UnsafeFile(
                f"{what} {target} is the same file as the input {shown}; write "
                "to another path (the input would be destroyed)"
            )
    return target


def write_bytes(
    path: PathLike,
    data: bytes | bytearray | memoryview | str | Iterable[bytes],
    *,
    inputs: Sequence[PathLike | int] = (),
    what: str = "output",
) -> Path:
    """Replace (or create) the file at ``path`` with ``data`` whole, or change nothing.

    ``check_target`` first; the bytes go to a temporary file in the same folder (created
    with O_EXCL, mode 0666 less the umask), are fsynced, take the old file's mode, and
    are renamed over the target, whose folder is then fsynced."""
    target = check_target(path, inputs=inputs, what=what)
    chunks = (
        [data.encode("utf-8")]
        if isinstance(data, str)
        else [data]
        if isinstance(data, (bytes, bytearray, memoryview))
        else data
    )
    fd, temp = _new_temp(target, what)
    try:
        _write_all(fd, chunks)
        _keep_mode(fd, target)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        check_target(target, inputs=inputs, what=what)  # swapped while we wrote?
        os.replace(temp, target)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        _unlink_quietly(temp)
        if isinstance(exc, OSError):
            raise _write_failed(target, what, exc) from exc
        raise
    _fsync_dir(target.parent)
    return target


def _new_temp(target: Path, what: str) -> tuple[int, Path]:
    for _ in range(16):
        temp = target.parent / f"{TEMP_PREFIX}{target.name[:64]}-{secrets.token_hex(4)}"
        try:
            return os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666
            ), temp
        except FileExistsError:
            continue
        except OSError as exc:
            raise _write_failed(target, what, exc) from exc
    raise WriteFailed(f"{what} {target}: could not make a temporary file beside it")


def _write_failed(target: Path, what: str, exc: OSError) -> WriteFailed:
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    fix = "free space there" if full else "choose a writable folder"
    return WriteFailed(
        f"{what} {target}: could not write it ({exc.strerror or exc}); {fix} (nothing was changed)",
        retryable=full,
    )


def _keep_mode(fd: int, target: Path) -> None:
    """The old file's permission bits (and owner and group, where this user may set them)."""
    try:
        old = os.lstat(target)
    except FileNotFoundError:
        return  # a new file: 0666 less the umask, from os.open
    try:
        os.fchown(fd, old.st_uid, old.st_gid)
    except PermissionError:
        pass
    os.fchmod(fd, stat.S_IMODE(old.st_mode))


def _same_file(info: os.stat_result, source: PathLike | int) -> bool:
    try:
        other = os.fstat(source) if isinstance(source, int) else os.stat(source)
    except (OSError, ValueError):
        return False
    return (info.st_dev, info.st_ino) == (other.st_dev, other.st_ino)


def _write_all(fd: int, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view:
            view = view[os.write(fd, view) :]


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename is done
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
