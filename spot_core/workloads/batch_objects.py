"""What a work queue (``spot_core.workloads.batch``) holds: its items and spec, each
unit's object, a worker's claim, the queue's progress, and the errors of each; every
object's bytes and the checks a read makes of them (an object no writer of the queue made
is ``CorruptObject``, never trusted), and the keys and digest of the units' outputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from spot_core.errors import ConfigError

SPEC_KEY = "queue/spec.json"
STATE_PREFIX = "queue/units"
OUTPUT_PREFIX = "queue/outputs"
PROGRESS_PREFIX = "progress"  # each unit's own checkpoint store, below the queue's
FORMAT = 1
MAX_UNITS = 1_000_000
MAX_UNIT_SIZE = 1_000_000
MAX_OUTPUT_BYTES = 64 << 20  # one unit's output, as JSON: refused when written, not read
MAX_SPEC_BYTES = 16 << 20  # the spec (a manifest's URIs included): refused at create
MAX_UNIT_BYTES = 1 << 20  # one unit's object: a few hundred bytes
MAX_OWNER_CHARS = 256  # a worker id, kept in the unit's object
MAX_COUNT = 10**9  # claims and failures of one unit: far beyond any real queue

PENDING, CLAIMED, DONE, FAILED = "pending", "claimed", "done", "failed"
STATES = (PENDING, CLAIMED, DONE, FAILED)
TERMINAL = (DONE, FAILED)
# Never written: a unit whose object no writer of the queue made (garbage, an unknown
# field or state, a wrong type, a time that is not a finite number). It is never claimed
# or overwritten, counts as failed (so the queue completes) and is warned once; removing
# the object makes the unit pending again.
CORRUPT = "corrupt"

Item = str | int


@dataclass(frozen=True)
class ItemRange:
    """The integers ``start`` .. ``stop - 1``: items that are their own index."""

    start: int
    stop: int

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def items(self, begin: int, end: int) -> list[Item]:
        return list(range(self.start + begin, self.start + min(end, len(self))))

    def to_json(self) -> dict[str, Any]:
        return {"range": [self.start, self.stop]}


@dataclass(frozen=True)
class Manifest:
    """A list of input URIs (or any strings): the items, in order."""

    uris: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.uris)

    def items(self, begin: int, end: int) -> list[Item]:
        return list(self.uris[begin:end])

    def to_json(self) -> dict[str, Any]:
        return {"manifest": list(self.uris)}


Items = ItemRange | Manifest


def items_from_json(doc: object) -> Items:
    """The items as ``to_json`` wrote them; ValueError naming what is wrong otherwise."""
    if isinstance(doc, dict) and set(doc) == {"range"}:
        pair = doc["range"]
        if not (isinstance(pair, list) and len(pair) == 2 and all(map(_is_int, pair))):
            raise CorruptObject("items.range is not two integers")
        return ItemRange(pair[0], pair[1])
    if isinstance(doc, dict) and set(doc) == {"manifest"}:
        uris = doc["manifest"]
        if not (isinstance(uris, list) and all(isinstance(u, str) for u in uris)):
            raise CorruptObject("items.manifest is not a list of strings")
        return Manifest(tuple(uris))
    raise CorruptObject('items is neither {"range": [start, stop]} nor {"manifest": [...]}')


@dataclass(frozen=True)
class QueueSpec:
    """What a queue is: its items, how they are cut, and its claims' rules."""

    items: Items
    unit_size: int
    claim_timeout_seconds: float = 60.0  # a claim whose heartbeat is older is taken over
    max_unit_retries: int = 2  # failures of the user's code a unit may have, then failed

    @property
    def units(self) -> int:
        return -(-len(self.items) // self.unit_size)

    def unit_ids(self) -> list[str]:
        return [unit_id(i) for i in range(self.units)]

    def unit_items(self, unit: str) -> list[Item]:
        index = unit_index(unit)
        return self.items.items(index * self.unit_size, (index + 1) * self.unit_size)

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "items": self.items.to_json(),
            "unit_size": self.unit_size,
            "claim_timeout_seconds": self.claim_timeout_seconds,
            "max_unit_retries": self.max_unit_retries,
        }
        return json.dumps(doc, sort_keys=True, allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> QueueSpec:
        """The spec ``to_bytes`` wrote; ValueError naming what is wrong with anything else
        (garbage, an unknown field or format, a wrong type, a value out of range)."""
        doc = json_object(data)
        known = {"format", "items", "unit_size", "claim_timeout_seconds", "max_unit_retries"}
        if set(doc) != known:
            raise CorruptObject(f"fields {sorted(doc)}, expected {sorted(known)}")
        if doc["format"] != FORMAT:
            raise CorruptObject(f"format {doc['format']!r}; this version reads format {FORMAT}")
        counts = [doc["unit_size"], doc["max_unit_retries"]]
        if not all(map(_is_int, counts)) or not _is_number(doc["claim_timeout_seconds"]):
            raise CorruptObject("unit_size, max_unit_retries or claim_timeout_seconds is no number")
        spec = cls(
            items_from_json(doc["items"]),
            doc["unit_size"],
            float(doc["claim_timeout_seconds"]),
            doc["max_unit_retries"],
        )
        check_spec(spec)
        return spec


def unit_id(index: int) -> str:
    return f"unit-{index:06d}"


def unit_index(unit: str) -> int:
    return int(unit.removeprefix("unit-"))


@dataclass(frozen=True)
class UnitState:
    """One unit's object in the store (absent: pending, never claimed)."""

    unit: str
    state: str = PENDING
    claim: int = 0  # how many times the unit was claimed; the current claim's number
    owner: str = ""  # worker id of the current claim
    token: str = ""  # the current claim's secret: only its holder swaps it on
    heartbeat_at: float = 0.0
    failures: int = 0
    errors: tuple[str, ...] = ()
    output_key: str = ""  # done: the claim's output that is the unit's
    output_sha256: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> UnitState:
        """The object ``to_bytes`` wrote; CorruptObject naming what is wrong with anything
        else: garbage, an unknown field, a wrong type, a count out of range, a time that
        is not a finite number, an unknown state. A field it lacks takes its default (an
        object written before the field existed)."""
        doc = json_object(data)
        values: dict[str, Any] = {}
        for spec in dataclasses.fields(cls):
            if spec.name in doc:
                values[spec.name] = _field_value(spec, doc.pop(spec.name))
        if doc:
            raise CorruptObject(f"unknown field {sorted(doc)[0]!r}")
        if "unit" not in values:
            raise CorruptObject("no unit field")
        state = cls(**values)
        state.check()
        return state

    def check(self) -> None:
        """What every writer keeps true of a unit's object; CorruptObject otherwise."""
        if self.state not in STATES:
            raise CorruptObject(f"unknown state {self.state!r}")
        if self.failures > self.claim:
            raise CorruptObject(f"{self.failures} failures in {self.claim} claims")
        if self.state == CLAIMED and not (self.token and self.claim >= 1):
            raise CorruptObject("claimed without a claim token")
        if self.state == DONE and self.output_key != output_key(self.unit, self.claim):
            raise CorruptObject(f"done, naming the output {self.output_key!r} of no claim")
        if self.state == DONE and not _is_sha256(self.output_sha256):
            raise CorruptObject("done, without its output's SHA-256")


@dataclass(frozen=True)
class Claim:
    """A unit this worker holds: what it swaps from, and its unit's items."""

    unit: str
    number: int
    token: str
    owner: str
    items: tuple[Item, ...]
    raw: bytes = field(repr=False, default=b"")  # the object as this worker last wrote it


@dataclass(frozen=True)
class Progress:
    """Units per state, for the Spot tab, a Prefect artifact and a sensor."""

    total: int
    pending: int
    claimed: int
    done: int
    failed: int  # the corrupt ones included: the queue cannot run them
    lapsed: int  # claimed, but its heartbeat is older than the claim timeout
    reclaims: int  # claims beyond each unit's first: takeovers and retries
    corrupt: int = 0  # of failed: units whose object no writer made (warned; remove it)

    @property
    def complete(self) -> bool:
        return self.done + self.failed == self.total

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}


class LostClaim(Exception):
    """This worker's claim was taken over (its heartbeat lapsed): drop the unit."""


class CorruptObject(ValueError):
    """A queue object that no writer of the queue made; the message names what is wrong."""


class UnstorableOutput(ValueError):
    """The user's outputs of a unit cannot be stored (not JSON, or over the limit): the
    unit's failure, which spends one of its retries like an exception of the function."""


def output_key(unit: str, claim: int) -> str:
    return f"{OUTPUT_PREFIX}/{unit}/claim-{claim:06d}.json"


def outputs_json(unit: str, value: Any) -> bytes:
    """A unit's outputs (or a document holding them) as canonical JSON; UnstorableOutput
    naming the problem when the user's function returned what JSON cannot hold."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise UnstorableOutput(
            f"the outputs of {unit} cannot be stored as JSON ({exc}); return JSON values "
            "from your function (no NaN or infinity, sets, bytes or other objects)"
        ) from None


def outputs_sha256(
    outputs: Iterator[tuple[str, list[Any]]] | Sequence[tuple[str, list[Any]]],
) -> str:
    """One digest of a batch's result (units in order, each's outputs as canonical JSON):
    equal for a queue that survived reclaims and a plain loop over the same items."""
    digest = hashlib.sha256()
    for unit, values in outputs:
        digest.update(json.dumps([unit, values], sort_keys=True, allow_nan=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def json_object(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CorruptObject(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CorruptObject(f"a JSON {type(doc).__name__}, not an object")
    return doc


def _field_value(spec: dataclasses.Field[Any], value: Any) -> Any:
    """``value`` for a field whose default says its kind; CorruptObject otherwise."""
    kind = type(spec.default) if spec.default is not dataclasses.MISSING else str
    if kind is str and isinstance(value, str):
        return value
    if kind is int and _is_int(value) and 0 <= value <= MAX_COUNT:
        return value
    if kind is float and _is_number(value) and 0 <= value:  # a time: finite, not before 1970
        return float(value)
    if kind is tuple and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if kind not in (str, int, float, tuple):
        return value  # a kind this check does not know: its field's reader checks it
    raise CorruptObject(f"{spec.name} is {value!r:.60}, not a {_KINDS[kind]}")


_KINDS = {
    str: "string",
    int: f"whole number 0..{MAX_COUNT}",
    float: "finite time",
    tuple: "list of strings",
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def check_spec(spec: QueueSpec) -> None:
    if not 1 <= spec.unit_size <= MAX_UNIT_SIZE:
        raise ConfigError(f"unit_size must be 1..{MAX_UNIT_SIZE} items (got {spec.unit_size})")
    if len(spec.items) == 0:
        raise ConfigError("the batch has no items; give a non-empty manifest or range")
    if spec.units > MAX_UNITS:
        raise ConfigError(
            f"{spec.units} units is more than {MAX_UNITS:,}; raise unit_size "
            f"(now {spec.unit_size}) so units hold more items"
        )
    if isinstance(spec.items, Manifest) and not all(isinstance(u, str) for u in spec.items.uris):
        raise ConfigError("a Manifest holds strings (input URIs); give each item as a string")
    if not (spec.claim_timeout_seconds > 0 and math.isfinite(spec.claim_timeout_seconds)):
        raise ConfigError(
            "claim_timeout_seconds must be a finite number > 0 "
            f"(got {spec.claim_timeout_seconds}); a claim whose heartbeat is older is taken over"
        )
    if spec.max_unit_retries < 0:
        raise ConfigError(f"max_unit_retries must be >= 0 (got {spec.max_unit_retries})")
