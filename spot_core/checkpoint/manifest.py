"""The checkpoint manifest: the one object whose presence commits a checkpoint.

The manifest lists every payload file with its size and sha256, and carries a
sha256 of its own canonical body, so a torn, truncated or hand-edited manifest is
detected instead of trusted. Checkpoint ids sort by step and attempt and end in a
random suffix, so two saves of the same step never collide.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spot_core.checkpoint.digests import DIGESTS
from spot_core.checkpoint.names import MANIFEST_NAME, name_problem
from spot_core.errors import ConfigError, CorruptCheckpoint
from spot_core.model import CheckpointRef

FORMAT = "spot-pipelines/checkpoint"
FORMAT_VERSION = 2
"""Version 2 names each file's digest (``blake3`` for new saves); version 1 always held
``sha256``. Both are read."""
READABLE_VERSIONS = (1, 2)
CHECKPOINTS_PREFIX = "checkpoints"
_ID_RE = re.compile(r"^step-(\d{12,})-attempt-(\d{4,})-([0-9a-f]{8})$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_MANIFEST_BYTES = 64 << 20  # a million files' entries fit; more is not a manifest
MAX_DEPTH = 64  # metadata nesting a save accepts, so a reader can bound what it parses


def new_checkpoint_id(step: int, attempt: int) -> str:
    """A lexically sortable, collision-free id such as
    ``step-000000000010-attempt-0002-1a2b3c4d``."""
    return f"step-{step:012d}-attempt-{attempt:04d}-{secrets.token_hex(4)}"


def parse_checkpoint_id(checkpoint_id: str) -> tuple[int, int] | None:
    """(step, attempt) encoded in an id this module made, or None for foreign names."""
    match = _ID_RE.match(checkpoint_id)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def checkpoint_key(checkpoint_id: str, name: str = "") -> str:
    """Object key of a checkpoint's directory (``name`` empty) or of one of its files."""
    base = f"{CHECKPOINTS_PREFIX}/{checkpoint_id}"
    return f"{base}/{name}" if name else base


def encode_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Round-trip metadata through strict JSON, so what is saved is what loads back."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise ConfigError(f"checkpoint metadata must be a dict, got {type(metadata).__name__}")
    try:
        encoded: dict[str, Any] = json.loads(
            json.dumps(dict(metadata), allow_nan=False, sort_keys=True)
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(
            f"checkpoint metadata is not JSON-serialisable ({exc}); use only "
            "dicts with str keys, lists, str, int, finite float, bool and None"
        ) from exc
    if _deeper_than(encoded, MAX_DEPTH):
        raise ConfigError(f"checkpoint metadata nests deeper than {MAX_DEPTH} levels; flatten it")
    return encoded


@dataclass(frozen=True)
class FileEntry:
    """One payload file: its size and its digest, with the name of the digest's algorithm
    (one of ``spot_core.checkpoint.digests.DIGESTS``; older manifests hold ``sha256``)."""

    size: int
    digest: str
    algorithm: str = "sha256"


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to verify and load one checkpoint."""

    checkpoint_id: str
    step: int
    attempt: int
    created_at: float
    metadata: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, FileEntry] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "checkpoint_id": self.checkpoint_id,
            "step": self.step,
            "attempt": self.attempt,
            "created_at": self.created_at,
            "metadata": dict(self.metadata),
            "files": {n: {"size": e.size, e.algorithm: e.digest} for n, e in self.files.items()},
        }

    def encode(self) -> bytes:
        body = self.body()
        return json.dumps(
            {**body, "body_sha256": _body_digest(body)}, sort_keys=True, indent=1
        ).encode()

    def to_ref(self, store_uri: str) -> CheckpointRef:
        return CheckpointRef(
            store_uri=store_uri,
            checkpoint_id=self.checkpoint_id,
            step=self.step,
            attempt=self.attempt,
            created_at=self.created_at,
            metadata=dict(self.metadata),
        )

    @property
    def order_key(self) -> tuple[int, int, float, str]:
        """Newest-last ordering: step, then attempt, then creation time."""
        return (self.step, self.attempt, self.created_at, self.checkpoint_id)

    @classmethod
    def decode(cls, data: bytes, checkpoint_id: str) -> Manifest:
        """Parse and self-verify; raise CorruptCheckpoint naming what is wrong."""
        where = f"checkpoint {checkpoint_id}: {MANIFEST_NAME}"
        doc = _strict_json(data, where)
        if not isinstance(doc, dict) or "body_sha256" not in doc:
            raise CorruptCheckpoint(f"{where} has no body_sha256; not a spot-pipelines manifest")
        claimed = doc.pop("body_sha256")
        if claimed != _body_digest(doc):
            raise CorruptCheckpoint(f"{where} fails its own sha256; it was torn or edited")
        _check_header(doc, where, checkpoint_id)
        return _from_body(doc, where)


def _strict_json(data: bytes, where: str) -> Any:
    """Parse what a writer of this module could have produced: strict JSON, nothing deep.

    Manifests come from a store that other processes (a reclaimed node, another job, a
    hand) can write, so NaN, Infinity and nesting deep enough to exhaust the parser's
    recursion are corruption like any other, never an exception that escapes ``latest``.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise CorruptCheckpoint(
            f"{where} is {len(data)} bytes, over the {MAX_MANIFEST_BYTES} "
            "a manifest can have; not a spot-pipelines manifest"
        )
    try:
        doc = json.loads(data, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptCheckpoint(
            f"{where} is not strict JSON ({type(exc).__name__}: {str(exc)[:120]}); torn or edited"
        ) from exc
    if _deeper_than(doc, MAX_DEPTH + 1):  # the body holds metadata one level down
        raise CorruptCheckpoint(f"{where} nests deeper than {MAX_DEPTH} levels; torn or edited")
    return doc


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels (iterative: no recursion to exhaust)."""
    stack = [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth >= limit:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return False


def _body_digest(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_header(doc: Mapping[str, Any], where: str, checkpoint_id: str) -> None:
    if doc.get("format") != FORMAT:
        raise CorruptCheckpoint(f"{where} has format {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("version") not in READABLE_VERSIONS:
        raise CorruptCheckpoint(
            f"{where} has format version {doc.get('version')!r}; this "
            f"spot-pipelines reads versions {READABLE_VERSIONS} (upgrade it)"
        )
    if doc.get("checkpoint_id") != checkpoint_id:
        raise CorruptCheckpoint(
            f"{where} names checkpoint {doc.get('checkpoint_id')!r}; "
            "it was copied from another checkpoint"
        )


def _from_body(doc: Mapping[str, Any], where: str) -> Manifest:
    try:
        files = {_file_name(n, where): _file_entry(e) for n, e in doc["files"].items()}
        manifest = Manifest(
            checkpoint_id=doc["checkpoint_id"],
            step=_count(doc["step"]),
            attempt=_count(doc["attempt"]),
            created_at=_finite(doc["created_at"]),
            metadata=dict(doc["metadata"]),
            files=files,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptCheckpoint(f"{where} is missing or mistypes a field ({exc!r})") from exc
    if parse_checkpoint_id(manifest.checkpoint_id) != (manifest.step, manifest.attempt):
        raise CorruptCheckpoint(
            f"{where} claims step {manifest.step} attempt "
            f"{manifest.attempt}, which its id does not encode; edited"
        )
    return manifest


def _file_name(name: object, where: str) -> str:
    """A payload name a save could have written; anything else (``..``, absolute, control
    characters) would let a forged manifest reach outside the checkpoint on load."""
    problem = "is not a string" if not isinstance(name, str) else name_problem(name)
    if problem or not isinstance(name, str):
        raise CorruptCheckpoint(
            f"{where} lists payload file {str(name)[:80]!r}, which {problem}; forged or edited"
        )
    return name


def _file_entry(entry: Mapping[str, Any]) -> FileEntry:
    """size plus exactly one known digest, named by its key (``sha256``, ``blake3``)."""
    named = [name for name in DIGESTS if name in entry]
    if len(named) != 1 or set(entry) != {"size", named[0]}:
        raise ValueError(
            f"file entry keys {sorted(entry)[:5]} are not 'size' and one digest "
            f"of {sorted(DIGESTS)}"
        )
    value = entry[named[0]]
    if not isinstance(value, str) or not _HEX64_RE.match(value):
        raise ValueError(f"{named[0]} {str(value)[:80]!r} is not 64 hex digits")
    return FileEntry(size=_count(entry["size"]), digest=value, algorithm=named[0])


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{str(value)[:40]!r} is not an int >= 0")
    return value


def _finite(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{str(value)[:40]!r} is not a finite number")
    return float(value)
