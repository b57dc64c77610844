"""Validate checkpoint payloads and stream them in chunks, hashing as they go.

Names are checked before anything is written so bad input never leaves a partial
checkpoint behind. Values may be bytes-like (written without copying) or a file
(a path, or a binary file object) that is streamed in chunks, so a large payload is
never held twice in memory. Hashing runs on a helper thread beside the write
(hashlib and blake3 release the GIL), which keeps the digest off the critical path of large
saves; the digest is ``spot_core.checkpoint.digests.DEFAULT_DIGEST`` unless a store asks
for another.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from spot_core.checkpoint.digests import DEFAULT_DIGEST, new_digest
from spot_core.checkpoint.names import MANIFEST_NAME, name_problem
from spot_core.errors import ConfigError

CHUNK_SIZE = 4 << 20
_NAME_RULES = (
    "payload names are relative POSIX paths like 'model.bin' or 'optim/state.pt': "
    "non-empty parts separated by '/', no '..' or '.', no backslash, no control, "
    f"format (bidi) or line-separator characters, not {MANIFEST_NAME!r}"
)


@dataclass(frozen=True)
class PayloadItem:
    """One payload entry: its validated name, its source and its size if known up front."""

    name: str
    source: Any
    size_hint: int | None

    def chunks(self, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes | memoryview]:
        """The entry's bytes in order, in chunks of at most ``chunk_size``."""
        if isinstance(self.source, memoryview):
            for start in range(0, len(self.source), chunk_size):
                yield self.source[start : start + chunk_size]
            return
        if isinstance(self.source, str):
            with open(self.source, "rb", buffering=0) as fh:
                yield from _read_chunks(fh, chunk_size, self.name)
            return
        yield from _read_chunks(self.source, chunk_size, self.name)


def prepare_payload(payload: Mapping[str, Any]) -> list[PayloadItem]:
    """Validate every name and value; raise ConfigError before anything is written."""
    if not isinstance(payload, Mapping) or not payload:
        raise ConfigError(
            "checkpoint payload must be a non-empty dict of name -> bytes or "
            f"file path, got {type(payload).__name__}"
        )
    names = [validate_name(n) for n in payload]
    _check_no_nesting(names)
    return [_item(name, payload[name]) for name in names]


def validate_name(name: object) -> str:
    """Return ``name`` if it is a safe relative POSIX path, else raise ConfigError saying why."""
    if not isinstance(name, str):
        raise ConfigError(f"payload name {name!r} is a {type(name).__name__}; {_NAME_RULES}")
    problem = name_problem(name)
    if problem:
        raise ConfigError(f"payload name {name!r} {problem}; {_NAME_RULES}")
    return name


def _check_no_nesting(names: list[str]) -> None:
    """'a' and 'a/b' cannot both be files in a directory tree."""
    taken = set(names)
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in taken:
                raise ConfigError(
                    f"payload names {parent!r} and {name!r} collide: "
                    f"{parent!r} cannot be both a file and a directory; rename one"
                )


def _item(name: str, value: Any) -> PayloadItem:
    if isinstance(value, (bytes, bytearray, memoryview)):
        view = memoryview(value).cast("B") if isinstance(value, memoryview) else memoryview(value)
        return PayloadItem(name, view, view.nbytes)
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if not isinstance(path, str) or not os.path.isfile(path):
            raise ConfigError(
                f"payload {name!r}: {path!r} is not an existing file; pass bytes, "
                "or a path (str or pathlib.Path) to a file to stream (text "
                "content must be encoded to bytes first)"
            )
        return PayloadItem(name, path, os.path.getsize(path))
    if callable(getattr(value, "read", None)):
        return PayloadItem(name, value, None)
    raise ConfigError(
        f"payload {name!r} is a {type(value).__name__}; pass bytes, bytearray, "
        "memoryview, a path to a file, or a binary file object"
    )


def _read_chunks(fh: BinaryIO, chunk_size: int, name: str) -> Iterator[bytes]:
    while True:
        chunk = fh.read(chunk_size)
        if not chunk:
            return
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise ConfigError(
                f"payload {name!r}: file object returned {type(chunk).__name__}, "
                "not bytes; open it in binary mode ('rb')"
            )
        yield chunk


class HashingStream:
    """Iterate a payload's chunks while computing its digest and size.

    Large bytes-like and path sources are hashed on a helper thread that reads the
    same bytes independently of the writer (hashlib and file reads release the
    GIL), so a save costs about max(write, hash) rather than their sum; measured
    per-chunk hand-offs between the two threads were much slower. File objects can
    only be read once, so they are hashed inline. Call ``finish()`` after the
    consumer has drained the stream: it joins the helper and checks both passes saw
    the same number of bytes (a source modified mid-save is an error).
    """

    def __init__(
        self, item: PayloadItem, chunk_size: int = CHUNK_SIZE, algorithm: str = DEFAULT_DIGEST
    ) -> None:
        self._item = item
        self._chunk_size = chunk_size
        self.algorithm = algorithm
        self._hash = new_digest(algorithm)
        self._hashed = 0
        self._helper: threading.Thread | None = None
        self._helper_error: BaseException | None = None
        self.size = 0

    @property
    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def __iter__(self) -> Iterator[bytes | memoryview]:
        hint = self._item.size_hint
        if hint is None or hint <= self._chunk_size:
            return self._inline()
        self._helper = threading.Thread(target=self._hash_source, name="ckpt-hash", daemon=True)
        self._helper.start()
        return self._counted()

    def _hash_mapped_file(self, path: str) -> None:
        """Hash straight from the page cache: no copy on the thread that bounds throughput."""
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            self._hash.update(mapped)
            self._hashed = len(mapped)

    def finish(self, *, check: bool = True) -> None:
        """Join the hashing helper; raise if the two passes over the source disagree."""
        if self._helper is None:
            return
        self._helper.join()
        self._helper = None
        if not check:
            return
        if self._helper_error is not None:
            raise self._helper_error
        if self._hashed != self.size:
            raise ConfigError(
                f"payload {self._item.name!r} changed while it was being saved "
                f"({self._hashed} bytes hashed, {self.size} written); do not "
                "modify a payload source until save() returns"
            )

    def _inline(self) -> Iterator[bytes | memoryview]:
        for chunk in self._item.chunks(self._chunk_size):
            self._hash.update(chunk)
            self._hashed += len(chunk)
            self.size += len(chunk)
            yield chunk

    def _counted(self) -> Iterator[bytes | memoryview]:
        for chunk in self._item.chunks(self._chunk_size):
            self.size += len(chunk)
            yield chunk

    def _hash_source(self) -> None:
        try:
            if isinstance(self._item.source, str):
                self._hash_mapped_file(self._item.source)
                return
            for chunk in self._item.chunks(self._chunk_size):
                self._hash.update(chunk)
                self._hashed += len(chunk)
        except BaseException as exc:  # noqa: BLE001 - re-raised in finish() on the saving thread
            self._helper_error = exc
