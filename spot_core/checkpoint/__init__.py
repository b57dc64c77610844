"""Durable, atomic, versioned checkpoint stores and the training-loop Checkpointer.

``open_store(uri)`` is the entry point::

    store = open_store("file:///mnt/ckpt/job-42")
    ref = store.save(step=10, payload={"model.bin": data}, metadata={"loss": 0.3}, attempt=2)
    payload = store.load(store.latest())

NumPy and PyTorch helpers live in ``state`` and ``torch_state`` and are imported
only when used, so this package stays cheap to import on any worker.
"""

from __future__ import annotations

from spot_core.checkpoint.backend import ObjectBackend
from spot_core.checkpoint.checkpointer import Checkpointer
from spot_core.checkpoint.file_backend import FileBackend
from spot_core.checkpoint.opening import open_store
from spot_core.checkpoint.store import CheckpointStore
from spot_core.checkpoint.uri import StoreLocation, parse_store_uri
from spot_core.model import CheckpointRef

__all__ = [
    "CheckpointRef",
    "CheckpointStore",
    "Checkpointer",
    "FileBackend",
    "ObjectBackend",
    "StoreLocation",
    "open_store",
    "parse_store_uri",
]
