"""The checkpoint commit protocol, written once against any ``ObjectBackend``.

A save writes every payload object first and the manifest LAST; the manifest's
presence is the commit. Readers trust nothing they have not verified: ``latest``
hashes every file of the checkpoint it returns, ``load`` re-hashes what it reads.
Fencing (``fencing.py``) stops a zombie writer on a reclaimed node from committing over
the progress of the attempt that resumed the job elsewhere.

A checkpoint may be written by many processes (the ranks of a distributed job): one
of them opens a version (``begin_version``), each writes its parts (``write_part``,
which returns the part's size and digest), and one commits them all
(``commit_version``) with a manifest naming every part, written once and only if
absent. ``save`` is the same three steps in one process.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from spot_core.bounds import MAX_ATTEMPT
from spot_core.checkpoint.backend import ObjectBackend
from spot_core.checkpoint.digests import DEFAULT_DIGEST, hex_of, new_digest
from spot_core.checkpoint.fencing import FENCE_KEY, MAX_FENCE_BYTES, Fencing
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
from spot_core.checkpoint.payload import (
    CHUNK_SIZE,
    HashingStream,
    PayloadItem,
    _check_no_nesting,
    prepare_payload,
    validate_name,
)
from spot_core.checkpoint.store_base import (
    _check_count,
    _corrupt,
    _is_full,
    _unreadable,
    _unwritable,
    step_went_back,
)
from spot_core.checkpoint.store_objects import MAX_OBJECT_BYTES, JobObjects
from spot_core.errors import (
    CheckpointError,
    CheckpointNotFound,
    ConfigError,
    CorruptCheckpoint,
    IncompleteRead,
    StoreUnavailable,
)
from spot_core.model import CheckpointRef
from spot_core.safe_files import WriteFailed, write_bytes

log = logging.getLogger(__name__)

__all__ = [
    "FENCE_KEY",
    "MAX_FENCE_BYTES",
    "MAX_OBJECT_BYTES",
    "CheckpointStore",
    "step_went_back",
]


class CheckpointStore(JobObjects, Fencing):
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
        checkpoint_id = self.begin_version(step, attempt=attempt)
        committed = False
        try:
            with self._saving(checkpoint_id):
                parts = {item.name: self._write_file(checkpoint_id, item) for item in items}
            ref = self.commit_version(checkpoint_id, parts, meta)
            committed = True
        finally:
            if not committed:
                self._discard(checkpoint_id)
        self._verified.add(checkpoint_id)  # this process hashed every byte it wrote
        log.info(
            "saved checkpoint %s (%d files, %d bytes) to %s",
            checkpoint_id,
            len(parts),
            sum(e.size for e in parts.values()),
            self.uri,
        )
        return ref

    # -- a version written by many processes ----------------------------------------
    def begin_version(self, step: int, *, attempt: int = 1) -> str:
        """Open a checkpoint version of ``step``: its id, which every writer of a part
        passes to ``write_part`` and the committer to ``commit_version``.

        Refuses at once what the commit would refuse, before any part is uploaded:
        FencedOut for a stale attempt, ConfigError for a step below the store's newest
        valid checkpoint (or a bad ``step``/``attempt``). Writes nothing: a version that
        never commits leaves only parts, which no reader sees and ``prune`` removes once
        a newer version commits."""
        step = _check_count("step", step, minimum=0)
        attempt = _check_count("attempt", attempt, minimum=0, maximum=MAX_ATTEMPT)
        self._check_save(step, attempt)
        return new_checkpoint_id(step, attempt)

    def write_part(self, checkpoint_id: str, name: str, data: Any) -> FileEntry:
        """Write one part of the open version ``checkpoint_id``, from any process (a rank):
        streamed, hashed on the way, durable when this returns. Returns the part's size
        and digest, which the committer names in the manifest. ``data`` and ``name`` as a
        ``save`` payload's entry; each part has one writer. Readers see nothing of it
        until ``commit_version``."""
        _version_of(checkpoint_id)
        [item] = prepare_payload({name: data})
        with self._saving(checkpoint_id):
            return self._write_file(checkpoint_id, item)

    def commit_version(
        self,
        checkpoint_id: str,
        parts: Mapping[str, FileEntry],
        metadata: Mapping[str, Any] | None = None,
    ) -> CheckpointRef:
        """Commit the version: one manifest naming every part and its digest, written once,
        after every part is durable.

        Under the store's lock, the fence and the step rule are checked again (FencedOut
        when a newer attempt started or committed meanwhile: a zombie rank never commits),
        every part must be in the store with the size its writer reported
        (CheckpointError, retryable, when one is missing or short: a writer did not
        finish), and the manifest is written only if none exists (a conditional write:
        ``If-None-Match: *`` on S3, a hard link in a file store), so a version commits
        once. Before that, nothing of the version is visible: ``latest()`` never returns
        a version with a part missing, and a crash at any moment leaves the previous
        version as it was."""
        step, attempt = _version_of(checkpoint_id)
        files = _part_entries(parts)
        manifest = Manifest(
            checkpoint_id=checkpoint_id,
            step=step,
            attempt=attempt,
            created_at=time.time(),
            metadata=encode_metadata(metadata),
            files=files,
        )
        with self._saving(checkpoint_id):
            self._commit(manifest)
        return manifest.to_ref(self.uri)

    def abandon_version(self, checkpoint_id: str) -> None:
        """Remove the parts of a version that will not commit (a save that failed on some
        rank). A committed version is left alone: abandoning never deletes a checkpoint."""
        _version_of(checkpoint_id)
        with self._saving(checkpoint_id), self.backend.lock():
            if not self.backend.exists(checkpoint_key(checkpoint_id, MANIFEST_NAME)):
                self._discard(checkpoint_id)

    @contextmanager
    def _saving(self, checkpoint_id: str) -> Iterator[None]:
        """A failing store as one line naming the fix, never a raw OSError."""
        try:
            yield
        except OSError as exc:
            raise StoreUnavailable(
                f"could not save checkpoint {checkpoint_id} to {self.uri}: "
                f"{exc.strerror or exc}; check free space and permissions",
                retryable=True,
            ) from exc

    def _write_file(self, checkpoint_id: str, item: PayloadItem) -> FileEntry:
        stream = HashingStream(item, self.chunk_size, self.digest)
        try:
            self.backend.put_stream(checkpoint_key(checkpoint_id, item.name), stream)
        except BaseException:
            stream.finish(check=False)  # keep the original error
            raise
        stream.finish()
        return FileEntry(size=stream.size, digest=stream.hexdigest, algorithm=stream.algorithm)

    def _commit(self, manifest: Manifest) -> None:
        """Under the store lock: re-check the fence, check the parts, write the manifest
        once (conditionally: never over another commit, whatever the lock allowed)."""
        with self.backend.lock():
            self._check_save(manifest.step, manifest.attempt)
            self._check_sizes(manifest)
            key = checkpoint_key(manifest.checkpoint_id, MANIFEST_NAME)
            if not self.backend.put_if_absent(key, manifest.encode()):
                raise CheckpointError(
                    f"checkpoint {manifest.checkpoint_id} is already committed in "
                    f"{self.uri}; a version commits once: begin_version() a new one"
                )

    def _discard(self, checkpoint_id: str) -> None:
        try:
            self.backend.delete_prefix(checkpoint_key(checkpoint_id))
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the original error
            log.warning("could not remove partial checkpoint %s: %s", checkpoint_id, exc)

    def size_of(self, ref: CheckpointRef) -> int:
        """Payload bytes of checkpoint ``ref`` (what a resume reads), from its manifest."""
        return sum(entry.size for entry in self._manifest_for(ref).files.values())

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

    def read_part(self, ref: CheckpointRef, name: str) -> bytes:
        """One payload file (part) of ``ref``, read whole and verified against its size and
        digest: what a rank restoring a sharded version reads of it. CheckpointNotFound
        when the version names no such part; otherwise the errors of ``load``."""
        manifest = self._manifest_for(ref)
        entry = manifest.files.get(name)
        if entry is None:
            raise CheckpointNotFound(
                f"checkpoint {manifest.checkpoint_id} in {self.uri} has no part {name!r}"
            )
        try:
            return self._read_verified(manifest, name, entry)
        except OSError as exc:
            raise _unreadable(self.uri, manifest.checkpoint_id, exc) from exc

    def read_parts(
        self, ref: CheckpointRef, names: Collection[str], *, workers: int = 8
    ) -> dict[str, bytes]:
        """The parts ``names`` of ``ref``, verified, read as ``load`` reads (at once, large
        S3 parts in ranges, digests checked as they stream): what a DCP rank restores.
        CheckpointNotFound when the version names no such part; otherwise ``load``'s errors."""
        manifest = self._manifest_for(ref)
        missing = sorted(set(names) - set(manifest.files))
        if missing:
            raise CheckpointNotFound(
                f"checkpoint {manifest.checkpoint_id} in {self.uri} has no part {missing[0]!r}"
            )
        try:
            return fetch_payload(self.backend, manifest, workers=workers, names=set(names))
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
                f"{exc} before its manifest was written (a writer did not finish "
                "it, or a concurrent prune removed it); save again",
                retryable=True,
            ) from exc

    def _check_size(self, manifest: Manifest, name: str, entry: FileEntry) -> None:
        try:
            size = self.backend.size(checkpoint_key(manifest.checkpoint_id, name))
        except FileNotFoundError:
            raise _corrupt(manifest, name, "is missing") from None
        if size != entry.size:
            raise _corrupt(manifest, name, f"has {size} bytes, manifest says {entry.size}")

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


def _version_of(checkpoint_id: object) -> tuple[int, int]:
    """(step, attempt) of a version id ``begin_version`` made; ConfigError for anything else."""
    parsed = parse_checkpoint_id(checkpoint_id) if isinstance(checkpoint_id, str) else None
    if parsed is None:
        raise ConfigError(
            f"{str(checkpoint_id)[:80]!r} is not a checkpoint version id; pass the one "
            "begin_version() returned"
        )
    return parsed


def _part_entries(parts: Mapping[str, FileEntry]) -> dict[str, FileEntry]:
    """Every part's name checked as a payload name, each entry a ``write_part`` result."""
    if not isinstance(parts, Mapping) or not parts:
        raise ConfigError(
            "commit_version needs the parts: a non-empty dict of name -> the FileEntry "
            "write_part() returned for it"
        )
    _check_no_nesting([validate_name(name) for name in parts])
    bad = [name for name, entry in parts.items() if not isinstance(entry, FileEntry)]
    if bad:
        raise ConfigError(
            f"part {bad[0]!r} is not a FileEntry; pass what write_part() returned for it"
        )
    return dict(parts)
