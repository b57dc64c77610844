"""Fast restore: a checkpoint's files read at once, large ones in byte ranges, each digest
checked as its bytes arrive.

``CheckpointStore.load`` (the restore), ``load_concurrently`` (the handover's prefetch) and
``read_parts`` (a DCP rank's restore, ``torch_dcp.StoreReader``) all read through
``fetch_payload``. On a backend where reads overlap (S3:
``concurrent_reads``), every file is a task on one pool of ``workers`` threads, and a file
of at least ``RANGE_THRESHOLD_BYTES`` is split into ranges of at least ``RANGE_BYTES``
(``range_bytes``; S3 ``GET`` with ``Range``: one connection delivers a few hundred MB/s at
most, several deliver more), so one large file no longer reads at one connection's speed.
A file's digest is fed its ranges in order as each lands (no second pass over it), while
later ranges still download. On a local disk the files are read one after another
(reading them at once only adds contention there: ``ObjectBackend.concurrent_reads``).

Every read is whole or an error (``S3Backend.get_bytes`` / ``get_range``: a read cut short
is read again within the call deadline, then ``IncompleteRead``), and no file is trusted
until its size and digest are the manifest's (``CorruptCheckpoint`` names the file).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor

from spot_core.checkpoint.backend import ObjectBackend
from spot_core.checkpoint.digests import new_digest
from spot_core.checkpoint.manifest import FileEntry, Manifest, checkpoint_key
from spot_core.errors import CorruptCheckpoint

RANGE_THRESHOLD_BYTES = 64 << 20
RANGE_BYTES = 16 << 20
DEFAULT_WORKERS = 8


def fetch_payload(
    backend: ObjectBackend,
    manifest: Manifest,
    *,
    workers: int = DEFAULT_WORKERS,
    names: Collection[str] | None = None,
) -> dict[str, bytes]:
    """Every payload file of ``manifest`` (or only ``names``: the parts a DCP rank needs),
    verified; in the manifest's order."""
    files = {
        name: entry for name, entry in manifest.files.items() if names is None or name in names
    }
    if not backend.concurrent_reads or workers <= 1:
        return {name: _local(backend, manifest, name, entry) for name, entry in files.items()}
    with ThreadPoolExecutor(workers, thread_name_prefix="spot-fetch") as pool:
        pending = {
            name: _submit(pool, backend, manifest, name, entry, workers)
            for name, entry in files.items()
        }
        try:
            return {
                name: _verified(manifest, name, entry, pending[name])
                for name, entry in files.items()
            }
        finally:
            for futures in pending.values():
                for future in futures:
                    future.cancel()  # a failed file: what has not started never will


def _submit(
    pool: ThreadPoolExecutor,
    backend: ObjectBackend,
    manifest: Manifest,
    name: str,
    entry: FileEntry,
    workers: int,
) -> list[Future[bytes]]:
    """The file's reads, queued: one whole read, or one per range of a large S3 object."""
    key = checkpoint_key(manifest.checkpoint_id, name)
    get_range: Callable[[str, int, int], bytes] | None = getattr(backend, "get_range", None)
    if get_range is None or entry.size < RANGE_THRESHOLD_BYTES:
        return [pool.submit(_whole, backend, manifest, name, entry)]
    step = range_bytes(entry.size, workers)
    return [
        pool.submit(get_range, key, start, min(step, entry.size - start))
        for start in range(0, entry.size, step)
    ]


def range_bytes(size: int, workers: int) -> int:
    """``RANGE_BYTES``, or larger for a file that would be more than two ranges per thread:
    ranges are for reading at once, and each is a request (moto, unlike S3, reads the whole
    object to serve one, bench/README.md), so a 4 GiB file is 16 ranges, not 256."""
    per_thread = -(-size // (2 * max(1, workers)))
    return max(RANGE_BYTES, -(-per_thread // (1 << 20)) * (1 << 20))


def _whole(backend: ObjectBackend, manifest: Manifest, name: str, entry: FileEntry) -> bytes:
    key = checkpoint_key(manifest.checkpoint_id, name)
    try:  # never more than the manifest says: a forged or grown file is not read whole
        return backend.get_bytes(key, max_bytes=entry.size)
    except (FileNotFoundError, IsADirectoryError):
        raise _corrupt(manifest, name, "is missing (or not a file)") from None


def _local(backend: ObjectBackend, manifest: Manifest, name: str, entry: FileEntry) -> bytes:
    """One file of a local store: read whole (from the page cache, no slower than in
    chunks), then hashed."""
    data = _whole(backend, manifest, name, entry)
    digest = new_digest(entry.algorithm)
    digest.update(data)
    _check(manifest, name, entry, len(data), digest.hexdigest())
    return data


def _verified(
    manifest: Manifest, name: str, entry: FileEntry, futures: list[Future[bytes]]
) -> bytes:
    """The file's pieces joined, its digest fed each piece in order as it lands."""
    digest, size, pieces = new_digest(entry.algorithm), 0, []
    for future in futures:
        try:
            piece = future.result()
        except FileNotFoundError:
            raise _corrupt(manifest, name, "is missing (or not a file)") from None
        digest.update(piece)
        size += len(piece)
        pieces.append(piece)
    _check(manifest, name, entry, size, digest.hexdigest())
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _check(manifest: Manifest, name: str, entry: FileEntry, size: int, digest: str) -> None:
    if size != entry.size:
        raise _corrupt(manifest, name, f"has {size} bytes, manifest says {entry.size}")
    if digest != entry.digest:
        raise _corrupt(manifest, name, f"fails its {entry.algorithm} check")


def _corrupt(manifest: Manifest, name: str, problem: str) -> CorruptCheckpoint:
    return CorruptCheckpoint(
        f"checkpoint {manifest.checkpoint_id} (step {manifest.step}): "
        f"payload file {name!r} {problem}"
    )


__all__ = ["RANGE_BYTES", "RANGE_THRESHOLD_BYTES", "fetch_payload"]
