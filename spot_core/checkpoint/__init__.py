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
from spot_core.checkpoint.store import CheckpointStore
from spot_core.checkpoint.uri import StoreLocation, parse_store_uri
from spot_core.errors import ConfigError
from spot_core.model import CheckpointRef

__all__ = ["CheckpointRef", "CheckpointStore", "Checkpointer", "FileBackend", "ObjectBackend",
           "StoreLocation", "open_store", "parse_store_uri"]


def open_store(uri: str) -> CheckpointStore:
    """Open (creating if needed) the checkpoint store at ``uri``.

    Accepts ``file:///absolute/path``; ``s3://bucket/prefix`` is parsed but its
    backend is not available yet. Anything else raises ConfigError naming the forms.
    """
    location = parse_store_uri(uri)
    if location.scheme == "s3":
        raise ConfigError(f"cannot open {location.uri}: the S3 checkpoint backend is not "
                          "available yet (it will need the `aws` extra: pip install "
                          "'spot-pipelines[aws]'); use a file:///absolute/path store for now")
    return CheckpointStore(FileBackend(location.path), location.uri)
