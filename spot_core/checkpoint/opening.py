"""``open_store``: a checkpoint store from its URI (the one entry point for every caller)."""

from __future__ import annotations

from typing import Any

from spot_core.checkpoint.file_backend import FileBackend
from spot_core.checkpoint.store import CheckpointStore
from spot_core.checkpoint.uri import parse_store_uri
from spot_core.errors import ConfigError


def open_store(uri: str, *, session: Any = None, **options: Any) -> CheckpointStore:
    """Open (creating if needed) the checkpoint store at ``uri``.

    Accepts ``file:///absolute/path`` and ``s3://bucket/prefix``. For S3, ``options`` go
    to ``S3Backend`` (``endpoint_url``, ``region``, ``sse``, ``sse_kms_key_id``,
    ``part_size``, ...); the endpoint also comes from ``SPOT_S3_ENDPOINT_URL`` or boto3's
    own ``AWS_ENDPOINT_URL_S3``. Anything else raises ConfigError naming the forms.
    ``session``: how this process reaches the store's cloud (for S3 a boto3 ``Session``
    or ``spot_core.adaptors.aws.AwsAccess`` from the engine's connection or block; None:
    boto3's default chain); a file store needs none and ignores it.
    """
    location = parse_store_uri(uri)
    if location.scheme == "s3":
        from spot_core.checkpoint.s3_backend import S3Backend  # boto3 only when used

        return CheckpointStore(
            S3Backend(location.bucket, location.prefix, session=session, **options), location.uri
        )
    if options:
        raise ConfigError(
            f"options {sorted(options)} apply to s3:// stores only; {location.uri} is a file store"
        )
    return CheckpointStore(FileBackend(location.path), location.uri)
