"""Durable, atomic, versioned checkpoint stores and the training-loop Checkpointer.

``open_store(uri)`` is the entry point::

    store = open_store("file:///mnt/ckpt/job-42")
    ref = store.save(step=10, payload={"model.bin": data}, metadata={"loss": 0.3}, attempt=2)
    payload = store.load(store.latest())

NumPy and PyTorch helpers live in ``state`` and ``torch_state`` and are imported
only when used, so this package stays cheap to import on any worker.
"""

from __future__ import annotations

from typing import Any

from spot_core.checkpoint.backend import ObjectBackend
from spot_core.checkpoint.checkpointer import Checkpointer
from spot_core.checkpoint.file_backend import FileBackend
from spot_core.checkpoint.store import CheckpointStore
from spot_core.checkpoint.uri import StoreLocation, parse_store_uri
from spot_core.errors import ConfigError
from spot_core.model import CheckpointRef

__all__ = ["CheckpointRef", "CheckpointStore", "Checkpointer", "FileBackend", "ObjectBackend",
           "StoreLocation", "open_store", "parse_store_uri"]


def open_store(uri: str, **options: Any) -> CheckpointStore:
    """Open (creating if needed) the checkpoint store at ``uri``.

    Accepts ``file:///absolute/path`` and ``s3://bucket/prefix``. For S3, ``options`` go
    to ``S3Backend`` (``endpoint_url``, ``region``, ``sse``, ``sse_kms_key_id``,
    ``part_size``, ...); the endpoint also comes from ``SPOT_S3_ENDPOINT_URL`` or boto3's
    own ``AWS_ENDPOINT_URL_S3``. Anything else raises ConfigError naming the forms.
    """
    location = parse_store_uri(uri)
    if location.scheme == "s3":
        from spot_core.checkpoint.s3_backend import S3Backend  # boto3 only when used

        return CheckpointStore(S3Backend(location.bucket, location.prefix, **options),
                               location.uri)
    if options:
        raise ConfigError(f"options {sorted(options)} apply to s3:// stores only; "
                          f"{location.uri} is a file store")
    return CheckpointStore(FileBackend(location.path), location.uri)
