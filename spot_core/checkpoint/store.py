"""The checkpoint commit protocol, written once against any ``ObjectBackend``.

A save writes every payload object first and the manifest LAST; the manifest's
presence is the commit. Readers trust nothing they have not verified: ``latest``
hashes every file of the checkpoint it returns, ``load`` re-hashes what it reads.
Fencing stops a zombie writer on a reclaimed node from committing over the
progress of the attempt that resumed the job elsewhere.
"""

from __future__ import annotations

import builtins
import errno
import json
import logging
import numbers
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from spot_core.bounds import MAX_ATTEMPT
from spot_core.checkpoint.backend import ObjectBackend, UnknownAge, judged_age
from spot_core.checkpoint.digests import DEFAULT_DIGEST, hex_of, new_digest
from spot_core.checkpoint.fetch import fetch_payload
from spot_core.checkpoint.manifest import (
    CHECKPOINTS_PREFIX,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    checkpoint_key,
    encode_metadata,
    new_checkpoint_id,
    parse_checkpoint_id,
)
from spot_core.checkpoint.names import MANIFEST_NAME
from spot_core.checkpoint.payload import CHUNK_SIZE, HashingStream, PayloadItem, prepare_payload
from spot_core.errors import (
    CheckpointError,
    CheckpointNotFound,
    ConfigError,
    CorruptCheckpoint,
    FencedOut,
    IncompleteRead,
    StoreUnavailable,
)
from spot_core.model import CheckpointRef
from spot_core.safe_files import WriteFailed, write_bytes

log = logging.getLogger(__name__)

FENCE_KEY = "FENCE.json"
MAX_FENCE_BYTES = 64 << 10  # a fence is ~50 bytes
MAX_OBJECT_BYTES = 16 << 20  # heartbeats, driver beats, status reports: kilobytes


class CheckpointStore:
    """Durable, atomic, versioned checkpoints of one job in one backend."""

    def __init__(
        self,
        backend: ObjectBackend,
        uri: str,
        *,
        chunk_size: int = CHUNK_SIZE,
        digest: str = DEFAULT_DIGEST,
    ) -> None:
        new_digest(digest)  # an unknown name fails here, not halfway through a save
        self.backend = backend
        self.uri = uri
        self.chunk_size = chunk_size
        # What new saves record per file; reads verify whatever each manifest names.
        self.digest = digest
        self._warned: set[str] = set()
        self._verified: set[str] = set()  # ids this instance wrote or fully hashed

    def __repr__(self) -> str:
        return f"CheckpointStore({self.uri!r})"

    # -- save ------------------------------------------------------------------------
    def save(
        self,
        step: int,
        payload: Mapping[str, Any],
        metadata: Mapping[str, Any] | None = None,
        *,
        attempt: int = 1,
    ) -> CheckpointRef:
        """Write ``payload`` as the checkpoint of ``step``; atomic: all of it or nothing.

        Values are bytes-like, or a path / binary file object streamed in chunks.
        Raises ConfigError for bad input (before writing), a ``step`` below a valid
        checkpoint's in the store included (steps never go back: docs/checkpoints.md),
        FencedOut if a newer attempt has started or committed, CheckpointError if the
        backend fails.
        """
        step = _check_count("step", step, minimum=0)
        attempt = _check_count("attempt", attempt, minimum=0, maximum=MAX_ATTEMPT)
        items = prepare_payload(payload)
        meta = encode_metadata(metadata)
        self._check_save(step, attempt)
        checkpoint_id = new_checkpoint_id(step, attempt)
        manifest = self._write_and_commit(checkpoint_id, step, attempt, meta, items)
        self._verified.add(checkpoint_id)
        log.info(
            "saved checkpoint %s (%d files, %d bytes) to %s",
            checkpoint_id,
            len(manifest.files),
            sum(e.size for e in manifest.files.values()),
            self.uri,
        )
        return manifest.to_ref(self.uri)

    def _write_and_commit(
        self,
        checkpoint_id: str,
        step: int,
        attempt: int,
        meta: dict[str, Any],
        items: list[PayloadItem],
    ) -> Manifest:
        """Payload first, manifest last; on any failure remove what this save wrote."""
        committed = False
        try:
            files = {item.name: self._write_file(checkpoint_id, item) for item in items}
            manifest = Manifest(
                checkpoint_id=checkpoint_id,
                step=step,
                attempt=attempt,
                created_at=time.time(),
                metadata=meta,
                files=files,
            )
            committed = self._commit(manifest)
            return manifest
        except OSError as exc:
            raise StoreUnavailable(
                f"could not save checkpoint {checkpoint_id} to {self.uri}: "
                f"{exc.strerror or exc}; check free space and permissions",
                retryable=True,
            ) from exc
        finally:
            if not committed:
                self._discard(checkpoint_id)

    def _write_file(self, checkpoint_id: str, item: PayloadItem) -> FileEntry:
        stream = HashingStream(item, self.chunk_size, self.digest)
        try:
            self.backend.put_stream(checkpoint_key(checkpoint_id, item.name), stream)
        except BaseException:
            stream.finish(check=False)  # keep the original error
            raise
        stream.finish()
        return FileEntry(size=stream.size, digest=stream.hexdigest, algorithm=stream.algorithm)

    def _commit(self, manifest: Manifest) -> bool:
        """Under the store lock: re-check the fence, check the files, write the manifest."""
        with self.backend.lock():
            self._check_save(manifest.step, manifest.attempt)
            self._check_sizes(manifest)
            key = checkpoint_key(manifest.checkpoint_id, MANIFEST_NAME)
            self.backend.put_bytes(key, manifest.encode())
        return True

    def _discard(self, checkpoint_id: str) -> None:
        try:
            self.backend.delete_prefix(checkpoint_key(checkpoint_id))
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the original error
            log.warning("could not remove partial checkpoint %s: %s", checkpoint_id, exc)

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

    def size_of(self, ref: CheckpointRef) -> int:
        """Payload bytes of checkpoint ``ref`` (what a resume reads), from its manifest."""
        return sum(entry.size for entry in self._manifest_for(ref).files.values())

    # -- fencing ---------------------------------------------------------------------
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

    def _check_save(self, step: int, attempt: int) -> None:
        """The fence, then the step rule, from one listing of the manifests."""
        committed = self._committed()
        self._check_fence(attempt, committed)
        self._check_step(step, committed)

    def _check_step(self, step: int, committed: list[Manifest]) -> None:
        """Refuse a step below a valid checkpoint's: checkpoints are ordered by step, so
        such a save would rank below what the store holds; ``latest()`` would never return
        it and ``prune`` would delete it at once (a loop whose counter restarts each epoch
        lost every checkpoint of the new epoch). Only newer checkpoints are verified, and
        only on this path; one found corrupt does not count (a resume from an older one)."""
        for manifest in reversed(committed):
            if manifest.step <= step:
                return
            if manifest.checkpoint_id in self._warned:  # found corrupt before: not hashed again
                continue
            known = manifest.checkpoint_id in self._verified
            try:
                self._check_files(manifest, hash_files=not known)
            except CorruptCheckpoint as exc:
                self._warn_once(manifest.checkpoint_id, exc)
                continue
            self._verified.add(manifest.checkpoint_id)
            raise step_went_back(step, manifest.step, self.uri)

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

    # -- read ------------------------------------------------------------------------
    def list(self) -> list[CheckpointRef]:
        """Committed checkpoints, oldest to newest.

        Cheap: each manifest is parsed and self-verified, but payload files are not
        hashed (``latest`` and ``load`` do that), so a listed checkpoint may still
        fail to load if a payload file was damaged after the commit.
        """
        return [m.to_ref(self.uri) for m in self._committed()]

    def newest(self) -> CheckpointRef | None:
        """``list()[-1]`` for one listing and, usually, one manifest read instead of one per
        checkpoint: ids sort by (step, attempt), so manifests are read newest first until
        one is committed. What a waiting replacement polls (``checkpoint.handover``)."""
        groups: dict[tuple[int, int], builtins.list[str]] = {}
        for checkpoint_id in self._checkpoint_ids():
            key = parse_checkpoint_id(checkpoint_id)
            assert key is not None  # _checkpoint_ids keeps only parseable ids
            groups.setdefault(key, []).append(checkpoint_id)
        for key in sorted(groups, reverse=True):
            found = [self._manifest_or_none(c) for c in groups[key]]
            committed = [m for m in found if m is not None]
            if committed:
                return max(committed, key=lambda m: m.order_key).to_ref(self.uri)
        return None

    def latest(self) -> CheckpointRef | None:
        """The newest checkpoint that fully verifies (manifest and every file hashed), or None.

        One that cannot be read whole (the connection cut every try) is skipped with a
        warning like a corrupt one: an older checkpoint beats a failed resume."""
        for manifest in reversed(self._committed(skip_incomplete=True)):
            try:
                self._check_files(manifest, hash_files=True)
            except (CorruptCheckpoint, IncompleteRead) as exc:
                self._warn_once(manifest.checkpoint_id, exc)
                continue
            self._verified.add(manifest.checkpoint_id)
            return manifest.to_ref(self.uri)
        return None

    def load(self, ref: CheckpointRef, *, workers: int = 8) -> dict[str, bytes]:
        """Every payload file of ``ref``, re-verified; CorruptCheckpoint names the bad file,
        CheckpointError (never a raw OSError) says why the store could not be read."""
        manifest = self._manifest_for(ref)
        try:  # issue 47 fast restore: files at once, large S3 ones in ranges (fetch.py)
            return fetch_payload(self.backend, manifest, workers=workers)
        except OSError as exc:
            raise _unreadable(self.uri, manifest.checkpoint_id, exc) from exc

    def load_concurrently(self, ref: CheckpointRef, *, workers: int = 8) -> dict[str, bytes]:
        """``load``, with the payload files read at once on up to ``workers`` threads and
        each file's digest checked as its chunks stream in (no second pass over it): how a
        replacement prefetches while its predecessor still saves. Same errors as ``load``.
        A backend where reading at once is no faster (a local disk) is read as ``load``
        reads it."""
        payload = self.load(ref, workers=workers)  # issue 47: one read path (fetch.py)
        self._verified.add(ref.checkpoint_id)
        return payload

    def load_to_dir(self, ref: CheckpointRef, directory: str | os.PathLike[str]) -> dict[str, str]:
        """Stream every file of ``ref`` into ``directory`` (verified), for payloads too big for RAM.

        Each file is written beside its target and renamed over it, and only over a regular
        file (``spot_core.safe_files``); a full or read-only ``directory`` is one
        CheckpointError naming it."""
        manifest = self._manifest_for(ref)
        targets = _targets_inside(manifest, os.fspath(directory))  # before creating anything
        try:
            return {
                name: self._copy_verified(manifest, name, entry, targets[name])
                for name, entry in manifest.files.items()
            }
        except WriteFailed as exc:  # says which file and the fix
            raise CheckpointError(
                f"could not load checkpoint {manifest.checkpoint_id}: {exc}",
                retryable=exc.retryable,
            ) from exc
        except OSError as exc:
            full = _is_full(exc)
            raise CheckpointError(
                f"could not load checkpoint {manifest.checkpoint_id} into "
                f"{os.fspath(directory)} ({exc.strerror or exc}); "
                f"{'free space there' if full else 'choose a writable directory'}",
                retryable=full,
            ) from exc

    def _manifest_for(self, ref: CheckpointRef) -> Manifest:
        if ref is None:
            raise CheckpointNotFound(
                f"no checkpoint to load: {self.uri} has no verified "
                "checkpoint (store.latest() returned None); check for None "
                "and start from scratch"
            )
        checkpoint_id = getattr(ref, "checkpoint_id", None)
        if not isinstance(checkpoint_id, str) or parse_checkpoint_id(checkpoint_id) is None:
            raise CheckpointNotFound(f"{checkpoint_id!r} is not a checkpoint id of {self.uri}")
        key = checkpoint_key(checkpoint_id, MANIFEST_NAME)
        try:
            data = self.backend.get_bytes(key, max_bytes=MAX_MANIFEST_BYTES)
        except (FileNotFoundError, IsADirectoryError):
            raise CheckpointNotFound(
                f"checkpoint {checkpoint_id} is not in {self.uri} (pruned "
                "or never committed); use store.latest()"
            ) from None
        except OSError as exc:
            raise _unreadable(self.uri, key, exc) from exc
        return Manifest.decode(data, checkpoint_id)

    def _read_verified(self, manifest: Manifest, name: str, entry: FileEntry) -> bytes:
        try:  # never more than the manifest says: a forged or grown file is not read whole
            data = self.backend.get_bytes(
                checkpoint_key(manifest.checkpoint_id, name), max_bytes=entry.size
            )
        except (FileNotFoundError, IsADirectoryError):
            raise _corrupt(manifest, name, "is missing (or not a file)") from None
        if len(data) != entry.size:
            raise _corrupt(manifest, name, f"has {len(data)} bytes, manifest says {entry.size}")
        if hex_of(entry.algorithm, data) != entry.digest:
            raise _corrupt(manifest, name, f"fails its {entry.algorithm} check")
        return data

    def _copy_verified(self, manifest: Manifest, name: str, entry: FileEntry, target: str) -> str:
        """Written beside ``target`` and renamed over it only once every byte verified."""
        os.makedirs(os.path.dirname(target), exist_ok=True)
        write_bytes(
            target, self._verified_chunks(manifest, name, entry), what=f"payload file {name!r} in"
        )
        return target

    def _verified_chunks(self, manifest: Manifest, name: str, entry: FileEntry) -> Iterator[bytes]:
        """The file's chunks, then CorruptCheckpoint if its size or digest is not the
        manifest's (the caller's temporary file is then removed, never renamed)."""
        digest, size = new_digest(entry.algorithm), 0
        for chunk in self._chunks(manifest, name):
            digest.update(chunk)
            size += len(chunk)
            if size > entry.size:
                break
            yield chunk
        if size != entry.size or digest.hexdigest() != entry.digest:
            raise _corrupt(manifest, name, f"fails its size or {entry.algorithm} check")

    def _chunks(self, manifest: Manifest, name: str) -> Iterator[bytes]:
        try:
            yield from self.backend.iter_chunks(
                checkpoint_key(manifest.checkpoint_id, name), self.chunk_size
            )
        except (FileNotFoundError, IsADirectoryError):
            raise _corrupt(manifest, name, "is missing (or not a file)") from None

    # -- verification helpers ----------------------------------------------------------
    def _committed(self, *, skip_incomplete: bool = False) -> builtins.list[Manifest]:
        """Self-verified manifests, oldest to newest; torn saves (no manifest) are skipped,
        and with ``skip_incomplete`` manifests that could not be read whole (else that
        IncompleteRead is raised: a save or prune must not act on a partial listing)."""
        manifests = [self._manifest_or_none(c, skip_incomplete) for c in self._checkpoint_ids()]
        return sorted((m for m in manifests if m is not None), key=lambda m: m.order_key)

    def _manifest_or_none(
        self, checkpoint_id: str, skip_incomplete: bool = False
    ) -> Manifest | None:
        """The checkpoint's self-verified manifest; None for a torn save or a bad manifest."""
        try:
            data = self.backend.get_bytes(
                checkpoint_key(checkpoint_id, MANIFEST_NAME), max_bytes=MAX_MANIFEST_BYTES
            )
            return Manifest.decode(data, checkpoint_id)
        except IsADirectoryError:
            self._warn_once(checkpoint_id, CorruptCheckpoint(f"{MANIFEST_NAME} is a folder"))
        except FileNotFoundError:
            log.debug("checkpoint %s has no manifest (torn or in progress)", checkpoint_id)
        except CorruptCheckpoint as exc:
            self._warn_once(checkpoint_id, exc)
        except IncompleteRead as exc:
            if not skip_incomplete:
                raise
            self._warn_once(checkpoint_id, exc)
        return None

    def _checkpoint_ids(self) -> builtins.list[str]:
        return [
            c
            for c in self.backend.children(CHECKPOINTS_PREFIX)
            if parse_checkpoint_id(c) is not None
        ]

    def _check_files(self, manifest: Manifest, *, hash_files: bool) -> None:
        for name, entry in manifest.files.items():
            if hash_files:
                digest, size = new_digest(entry.algorithm), 0
                for chunk in self._chunks(manifest, name):
                    digest.update(chunk)
                    size += len(chunk)
                    if size > entry.size:  # a file grown past its entry is not hashed whole
                        break
                if size != entry.size or digest.hexdigest() != entry.digest:
                    raise _corrupt(manifest, name, f"fails its size or {entry.algorithm} check")
            else:
                self._check_size(manifest, name, entry)

    def _check_sizes(self, manifest: Manifest) -> None:
        try:
            self._check_files(manifest, hash_files=False)
        except CorruptCheckpoint as exc:
            raise CheckpointError(
                f"{exc} before its manifest was written (removed by a "
                "concurrent prune?); save again",
                retryable=True,
            ) from exc

    def _check_size(self, manifest: Manifest, name: str, entry: FileEntry) -> None:
        try:
            size = self.backend.size(checkpoint_key(manifest.checkpoint_id, name))
        except FileNotFoundError:
            raise _corrupt(manifest, name, "is missing") from None
        if size != entry.size:
            raise _corrupt(manifest, name, f"has {size} bytes, manifest says {entry.size}")

    def _warn_once(self, checkpoint_id: str, exc: Exception) -> None:
        if checkpoint_id not in self._warned:
            self._warned.add(checkpoint_id)
            log.warning("skipping checkpoint %s in %s: %s", checkpoint_id, self.uri, exc)

    # -- prune -----------------------------------------------------------------------
    def prune(self, keep: int = 3) -> builtins.list[str]:
        """Delete all but the newest ``keep`` committed checkpoints; return deleted ids.

        The newest checkpoint that fully verifies is always kept, even when newer
        (damaged) ones fill ``keep``. Leftovers of torn saves (no or corrupt manifest)
        older than the newest commit are deleted too; newer ones may be saves in
        progress and are left alone.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(
                f"prune(keep={keep!r}): keep must be an int >= 1 (the newest "
                "valid checkpoint is never deleted)"
            )
        try:
            with self.backend.lock():
                doomed = self._prune_candidates(keep)
                for checkpoint_id in doomed:
                    self.backend.delete_prefix(checkpoint_key(checkpoint_id))
        except OSError as exc:
            raise _unwritable(self.uri, "prune", exc) from exc
        if doomed:
            log.info("pruned %d checkpoint(s) from %s", len(doomed), self.uri)
        return doomed

    def _prune_candidates(self, keep: int) -> builtins.list[str]:
        committed = self._committed()
        if not committed:
            return []
        kept = {m.checkpoint_id for m in committed[-keep:]}
        newest_valid = self._newest_valid(committed)
        if newest_valid is not None:
            kept.add(newest_valid)
        committed_ids = {m.checkpoint_id for m in committed}
        doomed = [m.checkpoint_id for m in committed if m.checkpoint_id not in kept]
        newest = (committed[-1].step, committed[-1].attempt)
        torn = [
            c
            for c in self._checkpoint_ids()
            if c not in committed_ids
            and (order := parse_checkpoint_id(c)) is not None  # _checkpoint_ids: never None
            and order < newest
        ]
        return doomed + torn

    def _newest_valid(self, committed: builtins.list[Manifest]) -> str | None:
        """Like ``latest`` but trusts files this instance already hashed (sizes still checked)."""
        for manifest in reversed(committed):
            known = manifest.checkpoint_id in self._verified
            try:
                self._check_files(manifest, hash_files=not known)
            except CorruptCheckpoint as exc:
                self._warn_once(manifest.checkpoint_id, exc)
                continue
            self._verified.add(manifest.checkpoint_id)
            return manifest.checkpoint_id
        return None


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


def _targets_inside(manifest: Manifest, directory: str) -> dict[str, str]:
    """Each payload file's path under ``directory``; refuses any that would land outside.

    Manifest names are already checked on decode; this is the last line on the local
    disk (a symlink inside ``directory`` pointing elsewhere counts as outside)."""
    root = os.path.realpath(directory)
    targets = {}
    for name in manifest.files:
        target = os.path.join(root, *name.split("/"))
        if os.path.commonpath([root, os.path.realpath(target)]) != root:
            raise _corrupt(manifest, name, f"would be written outside {directory}; refused")
        targets[name] = target
    return targets


def step_went_back(step: int, newest: int, uri: str) -> ConfigError:
    """The one line for a save whose step is below a checkpoint's the store holds."""
    return ConfigError(
        f"checkpoint step {step} is below step {newest}, which {uri} already "
        "holds: steps must never go back (the new checkpoint would rank below "
        "the old ones, so latest() would skip it and pruning would delete "
        "it); pass a step that keeps growing across epochs and restarts, "
        "e.g. epoch * steps_per_epoch + step, or continue from the restored "
        "step (nothing was written)"
    )


def _unreadable(uri: str, key: str, exc: OSError) -> StoreUnavailable:
    """A store that cannot be read (permissions, an I/O error) as one line naming the fix."""
    return StoreUnavailable(
        f"could not read {key} in {uri}: {exc.strerror or exc}; check the "
        "store's permissions and disk (nothing was changed)",
        retryable=exc.errno in (errno.EIO, errno.EAGAIN, errno.ETIMEDOUT),
    )


def _is_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _unwritable(uri: str, what: str, exc: OSError) -> StoreUnavailable:
    """A full, read-only or unreachable store as one line that names the fix."""
    full = _is_full(exc)
    fix = "free space on it" if full else "make it writable or point the store URI elsewhere"
    return StoreUnavailable(
        f"could not {what} in {uri}: {exc.strerror or exc}; {fix} (existing "
        "checkpoints are untouched)",
        retryable=full,
    )


def _corrupt(manifest: Manifest, name: str, problem: str) -> CorruptCheckpoint:
    return CorruptCheckpoint(
        f"checkpoint {manifest.checkpoint_id} (step {manifest.step}): "
        f"payload file {name!r} {problem}"
    )


def _check_count(what: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """Accept any integral (also numpy ints), never bools or floats; return a plain int."""
    if (
        not isinstance(value, numbers.Integral)
        or isinstance(value, bool)
        or int(value) < minimum
        or (maximum is not None and int(value) > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum:,}"
        raise ConfigError(f"{what} must be an int {bound}, got {repr(value)[:40]}")
    return int(value)
