"""PyTorch Distributed Checkpoint (DCP) through the checkpoint store: ``dcp.save``,
``dcp.async_save`` and ``dcp.load`` on a job's ``file://`` or ``s3://`` store, with the
store's digests, fencing and pruning::

    import torch.distributed.checkpoint as dcp
    from spot_core.checkpoint.torch_dcp import StoreReader, StoreWriter

    dcp.save(state, storage_writer=StoreWriter(store, step=step, attempt=attempt))
    dcp.load(state, storage_reader=StoreReader(store))  # the newest verified version

Each save is one version of the store (``CheckpointStore.begin_version``): the
coordinator opens it while DCP plans, every rank streams its own items into one part
(``__{rank}_0.distcp``, hashed on the way), and the coordinator, once DCP has gathered
every rank's results, writes DCP's ``.metadata`` and commits the version with one
manifest naming every part and its digest. A rank that dies mid-save leaves a version
without a manifest, which no reader returns; a rank of a fenced attempt (a zombie after
a handover) never commits. DCP plans the load for the world size that loads, so a
version saved at 4 ranks loads at 2 or 1 (resharding).

The parts are DCP's own format (items written by ``torch.save``, DCP's ``_StorageInfo``
offsets in a pickled ``Metadata``), so a version copied out with
``store.load_to_dir(ref, folder)`` is a folder ``dcp.load(..., checkpoint_id=folder)``
reads as is. Like DCP's ``FileSystemReader``, loading unpickles ``.metadata``: load only
from a store whose writers you trust (the store verifies its digest first).
torch is imported here only: ``spot_core.checkpoint`` does not import this module.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from spot_core.bounds import MAX_ATTEMPT
from spot_core.checkpoint.manifest import FileEntry
from spot_core.checkpoint.store import CheckpointStore
from spot_core.checkpoint.store_base import _check_count
from spot_core.errors import CheckpointNotFound, ConfigError
from spot_core.model import CheckpointRef

log = logging.getLogger(__name__)

METADATA_PART = ".metadata"  # DCP's own name for it
DCP_LAYOUT = "torch-dcp"  # the manifest metadata's "layout": how the parts are read back


@dataclass(frozen=True)
class _Assignment:
    """What the coordinator hands each rank in its plan: the version and the part to write."""

    checkpoint_id: str
    part: str


@dataclass(frozen=True)
class _PartWritten:
    """A rank's report of its part (in its write results): the manifest's entry for it."""

    part: str
    entry: FileEntry


class StoreWriter(StorageWriter):
    """A DCP ``StorageWriter`` that saves one version of ``store`` at ``step``.

    Build one per save, with the same ``step`` and ``attempt`` on every rank (the
    attempt from ``SPOT_ATTEMPT``: what the fence checks). ``metadata`` (JSON) goes into
    the manifest; ``keep`` prunes to that many versions after the commit (None: no
    pruning). After ``dcp.save`` returns, ``writer.ref`` on the coordinator is the
    committed version. A fenced attempt's save fails on every rank with DCP's
    ``CheckpointException`` wrapping ``FencedOut``, and commits nothing."""

    def __init__(
        self,
        store: CheckpointStore,
        step: int,
        *,
        attempt: int = 1,
        metadata: Mapping[str, Any] | None = None,
        keep: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(store, CheckpointStore):
            raise ConfigError(
                f"StoreWriter needs a checkpoint store (open_store(uri)), got "
                f"{type(store).__name__}"
            )
        self.store = store
        self.step = _check_count("step", step, minimum=0)
        self.attempt = _check_count("attempt", attempt, minimum=0, maximum=MAX_ATTEMPT)
        self.metadata = dict(metadata or {})
        self.keep = None if keep is None else _check_count("keep", keep, minimum=1)
        self.ref: CheckpointRef | None = None
        self._version: str | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        _no_checkpoint_id(checkpoint_id, "StoreWriter(store, step=...)")
        self.ref, self._version = None, None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise ConfigError(
                "StoreWriter commits one version for all ranks: call dcp.save with "
                "use_collectives=True (the default)"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """On the coordinator: open the version (fence and step checked before any rank
        uploads a byte) and give each rank its part."""
        self._version = self.store.begin_version(self.step, attempt=self.attempt)
        return [
            dataclasses.replace(
                plan, storage_data=_Assignment(self._version, f"__{rank}_0{DEFAULT_SUFFIX}")
            )
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Every rank: its items back to back into its one part, streamed and hashed."""
        assignment = plan.storage_data
        if not isinstance(assignment, _Assignment):
            raise ConfigError("StoreWriter.write_data got a plan its coordinator did not make")
        items = _ItemReader(plan.items, planner, assignment.part)
        entry = self.store.write_part(assignment.checkpoint_id, assignment.part, items)
        part = WriteResult(
            index=MetadataIndex(f"spot-pipelines/part/{assignment.part}"),
            size_in_bytes=entry.size,
            storage_data=_PartWritten(assignment.part, entry),
        )
        future: Future[list[WriteResult]] = Future()
        future.set_result([*items.results, part])
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """On the coordinator, once every rank's part is durable: write ``.metadata`` and
        commit the version (fence re-checked under the store's lock), then prune."""
        if self._version is None:
            raise ConfigError("StoreWriter.finish before prepare_global_plan: not a DCP save")
        parts: dict[str, FileEntry] = {}
        storage: dict[MetadataIndex, Any] = {}
        for result in (r for rank in results for r in rank):
            if isinstance(result.storage_data, _PartWritten):
                parts[result.storage_data.part] = result.storage_data.entry
            else:
                storage[result.index] = result.storage_data
        metadata.storage_data = storage
        manifest_metadata = {**self.metadata, "layout": DCP_LAYOUT, "world_size": len(results)}
        try:
            parts[METADATA_PART] = self.store.write_part(
                self._version, METADATA_PART, pickle.dumps(metadata)
            )
            self.ref = self.store.commit_version(self._version, parts, manifest_metadata)
        except BaseException:
            _abandon(self.store, self._version)  # a fenced or failed save leaves no parts
            raise
        if self.keep is not None:
            self.store.prune(self.keep)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never chosen by DCP for a path: pass the writer explicitly


class StoreReader(StorageReader):
    """A DCP ``StorageReader`` for one version of ``store``: ``ref``, or the newest
    verified one (``store.latest()``, every part hashed) when ``ref`` is None.

    Every rank must load the same version: with no ``ref`` each rank resolves
    ``latest()`` itself, which agrees while nothing saves (a resume, before the new
    attempt's first save); otherwise pass the ref rank 0 chose. A rank's parts are read
    at once (large S3 parts in byte ranges, as ``store.load``) and each is verified
    against its digest before any tensor is taken from it."""

    def __init__(self, store: CheckpointStore, ref: CheckpointRef | None = None) -> None:
        super().__init__()
        if not isinstance(store, CheckpointStore):
            raise ConfigError(
                f"StoreReader needs a checkpoint store (open_store(uri)), got "
                f"{type(store).__name__}"
            )
        self.store, self.ref = store, ref
        self.storage_data: dict[MetadataIndex, Any] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        _no_checkpoint_id(checkpoint_id, "StoreReader(store, ref)")
        self.storage_data = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.ref is None:
            self.ref = self.store.latest()
        if self.ref is None:
            raise CheckpointNotFound(
                f"no checkpoint to load: {self.store.uri} has no verified version; "
                "start from scratch (check store.latest() for None first)"
            )
        if self.ref.metadata.get("layout") != DCP_LAYOUT:
            raise ConfigError(
                f"checkpoint {self.ref.checkpoint_id} was not saved with dcp.save through "
                "StoreWriter; load it with store.load(ref)"
            )
        metadata = pickle.loads(self.store.read_part(self.ref, METADATA_PART))
        if not isinstance(metadata, Metadata):
            raise ConfigError(f"{METADATA_PART} of {self.ref.checkpoint_id} is not DCP metadata")
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.storage_data = dict(metadata.storage_data or {})

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """The parts this rank's plan needs, read at once (large S3 parts in byte ranges)
        and each verified as it streams (``store.read_parts``, fetch.py), then sliced."""
        assert self.ref is not None  # read_metadata set it
        per_part: dict[str, list[Any]] = {}
        for request in plan.items:
            info = self.storage_data[request.storage_index]
            per_part.setdefault(info.relative_path, []).append(request)
        payload = self.store.read_parts(self.ref, per_part)
        for part, requests in per_part.items():
            data = memoryview(payload.pop(part))  # each part freed once sliced
            for request in requests:
                info = self.storage_data[request.storage_index]
                _load_item(planner, request, data[info.offset : info.offset + info.length])
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


class _ItemReader(io.RawIOBase):
    """A rank's items as one binary stream for ``write_part``: each serialised only when
    reached (one item in memory at a time), its offset and length recorded as DCP's
    ``_StorageInfo`` in ``results``."""

    def __init__(self, items: list[WriteItem], planner: SavePlanner, part: str) -> None:
        super().__init__()
        self.results: list[WriteResult] = []
        self._chunks = self._serialised(items, planner, part)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(target), len(self._pending))
        target[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def _serialised(
        self, items: list[WriteItem], planner: SavePlanner, part: str
    ) -> Iterator[bytes]:
        offset = 0
        for item in items:
            data = _item_bytes(item, planner.resolve_data(item))
            self.results.append(
                WriteResult(
                    index=item.index,
                    size_in_bytes=len(data),
                    storage_data=_StorageInfo(part, offset, len(data)),
                )
            )
            offset += len(data)
            yield data


def _item_bytes(item: WriteItem, data: Any) -> bytes:
    """One item as DCP's ``FileSystemWriter`` writes it: bytes as they are, a tensor by
    ``torch.save`` of a CPU copy holding no more storage than the tensor itself."""
    if item.type == WriteItemType.BYTE_IO:
        return bytes(data.getbuffer())
    tensor = data.detach().cpu()
    if tensor.untyped_storage().size() != tensor.nbytes:
        tensor = tensor.clone()  # a view: save its own elements, not its base's
    out = io.BytesIO()
    torch.save(tensor, out)
    return out.getvalue()


def _load_item(planner: LoadPlanner, request: Any, data: memoryview) -> None:
    """One requested item from its verified bytes, narrowed to what this rank holds."""
    if request.type == LoadItemType.BYTE_IO:
        planner.load_bytes(request, io.BytesIO(data))
        return
    tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    tensor = narrow_tensor_by_index(tensor, request.storage_offsets, request.lengths)
    target = planner.resolve_tensor(request).detach()
    if target.size() != tensor.size():
        raise ConfigError(
            f"{request.storage_index.fqn}: saved shard {tuple(tensor.size())} does not fit "
            f"the target {tuple(target.size())}; load into a model of the saved shape"
        )
    target.copy_(tensor)
    planner.commit_tensor(request, target)


def _abandon(store: CheckpointStore, version: str) -> None:
    try:
        store.abandon_version(version)
    except Exception as exc:  # noqa: BLE001 - the save's own error is the one to raise
        log.warning("could not remove the parts of uncommitted version %s: %s", version, exc)


def _no_checkpoint_id(checkpoint_id: object, instead: str) -> None:
    if checkpoint_id is not None:
        raise ConfigError(
            f"checkpoint_id={str(checkpoint_id)[:80]!r}: the store names its versions; "
            f"pass {instead} as the storage writer/reader and no checkpoint_id"
        )
