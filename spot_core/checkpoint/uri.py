"""Parse checkpoint store URIs into a location a backend can open.

Kept apart from the backends so that a bad URI fails with a one-line message that
names the accepted forms before any backend (or cloud SDK) is touched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from spot_core.errors import ConfigError

ACCEPTED_FORMS = "file:///absolute/path or s3://bucket/prefix"


@dataclass(frozen=True)
class StoreLocation:
    """Where a store lives: ``scheme`` plus either a local ``path`` or ``bucket``/``prefix``."""

    uri: str
    scheme: str
    path: str = ""
    bucket: str = ""
    prefix: str = ""


def parse_store_uri(uri: object) -> StoreLocation:
    """Validate ``uri`` and return its normalised location; raise ConfigError otherwise."""
    if not isinstance(uri, (str, os.PathLike)) or not str(uri).strip():
        raise ConfigError(
            f"checkpoint store URI is empty or not a string ({uri!r}); "
            f"pass {ACCEPTED_FORMS} (or set SPOT_CHECKPOINT_URI)"
        )
    text = str(uri).strip()
    if "://" not in text:
        hint = f" (did you mean file://{os.path.abspath(text)}?)" if text.startswith("/") else ""
        raise ConfigError(
            f"checkpoint store URI {text!r} has no scheme{hint}; pass {ACCEPTED_FORMS}"
        )
    parts = urlsplit(text)
    if parts.query or parts.fragment:
        raise ConfigError(
            f"checkpoint store URI {text!r} has a query or fragment; "
            f"pass {ACCEPTED_FORMS} without '?' or '#'"
        )
    if parts.scheme == "file":
        return _parse_file(text, parts.netloc, parts.path)
    if parts.scheme == "s3":
        return _parse_s3(text, parts.netloc, parts.path)
    raise ConfigError(
        f"checkpoint store URI {text!r} has unsupported scheme "
        f"{parts.scheme!r}; pass {ACCEPTED_FORMS}"
    )


def _parse_file(text: str, host: str, raw_path: str) -> StoreLocation:
    if host.lower() not in ("", "localhost"):  # RFC 8089: localhost is this machine
        raise ConfigError(
            f"file URI {text!r} names host {host!r}: a file store needs an "
            f"absolute path with three slashes, e.g. file:///{host}{raw_path}"
        )
    path = unquote(raw_path)
    if not path.startswith("/") or path == "/":
        raise ConfigError(
            f"file URI {text!r} has no absolute directory; use file:///absolute/path/to/checkpoints"
        )
    if "\x00" in path:
        raise ConfigError(f"file URI {text!r} contains a NUL character; remove it")
    path = os.path.normpath(path)
    return StoreLocation(uri=f"file://{path}", scheme="file", path=path)


def _parse_s3(text: str, bucket: str, raw_path: str) -> StoreLocation:
    if not bucket:
        raise ConfigError(f"S3 URI {text!r} has no bucket; use s3://bucket/prefix")
    prefix = s3_prefix(raw_path, text)
    uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    return StoreLocation(uri=uri, scheme="s3", bucket=bucket, prefix=prefix)


def s3_prefix(raw: str, uri: str = "") -> str:
    """``raw`` with empty segments and outer slashes dropped, as ``file://`` paths are
    normalised: ``jobs//train/`` is ``jobs/train``, the same store. A ``.`` or ``..``
    segment is refused: S3 keeps it literally, a path resolves it, and guessing which one
    was meant could open another job's store."""
    segments = [s for s in raw.split("/") if s]
    if any(s in (".", "..") for s in segments) or "\x00" in raw:
        raise ConfigError(
            f"S3 prefix {raw!r}{f' in {uri!r}' if uri else ''} has a '.' or '..' segment "
            "(or a NUL); spell the prefix out, e.g. s3://bucket/jobs/train"
        )
    return "/".join(segments)
