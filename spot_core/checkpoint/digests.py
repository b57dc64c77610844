"""Payload digests by name: what a manifest records for each file, and how to recompute it.

A save hashes every byte it writes, beside the write on a helper thread, so the digest
bounds a save's speed whenever it is slower than the disk. SHA-256 runs at about 1 GB/s on
one core here, below a local disk's write+fsync; BLAKE3 (the ``blake3`` package, the
reference implementation's Python binding, SIMD on one thread) runs several times faster,
so new saves record ``blake3``. The manifest names the digest of each file, and every name
here stays readable: checkpoints written with ``sha256`` by older versions still verify.

BLAKE3 runs on one thread: the other core is the writer's (a save is max(write, hash)).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from spot_core.errors import ConfigError

if TYPE_CHECKING:  # collections.abc.Buffer from 3.12; typing_extensions is a typing-only need
    from typing_extensions import Buffer


class Digest(Protocol):
    def update(self, data: Buffer, /) -> object: ...

    def hexdigest(self) -> str: ...


def _blake3() -> Digest:
    try:
        from blake3 import blake3
    except ImportError as exc:  # a core dependency; a broken install says so
        raise ConfigError(
            "checkpoint digest blake3 needs the 'blake3' package: "
            "pip install 'blake3>=1.0' (a spot-pipelines dependency)"
        ) from exc
    return blake3(max_threads=1)


DIGESTS: dict[str, Callable[[], Digest]] = {"blake3": _blake3, "sha256": hashlib.sha256}
"""Every digest a manifest may name; each gives 64 hex digits."""

DEFAULT_DIGEST = "blake3"
"""What new saves record."""


def new_digest(name: str) -> Digest:
    """A fresh hasher for the digest called ``name``."""
    maker = DIGESTS.get(name)
    if maker is None:
        raise ConfigError(
            f"unknown checkpoint digest {name!r}; choose one of {', '.join(sorted(DIGESTS))}"
        )
    return maker()


def hex_of(name: str, data: bytes | memoryview) -> str:
    """The digest called ``name`` of ``data``, in hex."""
    digest = new_digest(name)
    digest.update(data)
    return digest.hexdigest()


__all__ = ["DEFAULT_DIGEST", "DIGESTS", "Digest", "hex_of", "new_digest"]
