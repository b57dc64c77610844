"""A durable work queue for batch inference: units that are neither lost nor repeated.

The items (a manifest of input URIs, or a range of integers) are split into small units
of consecutive items. Any number of workers, each a spot job on its own lease, take units
from the queue; the queue lives in a checkpoint store (``file://`` or ``s3://``) as one
small object per unit, and every change of a unit's state is the store's compare-and-swap
(``CheckpointStore.swap_object``), so of two workers taking the same unit exactly one wins.

A unit's life, each arrow one swap::

    (no object) -> claimed(claim 1) -> done
                   claimed(claim n) -> claimed(claim n+1)   its heartbeat lapsed: the
                                                            worker (or its lease) is gone
                   claimed(claim n) -> pending(failures+1)  the user's code raised: this
                                                            unit's retries, not the job's
                   claimed(claim n) -> pending              released on a notice
                   claimed(claim n) -> failed               its retries are spent

A worker writes a unit's output under a key derived from the unit and its claim
(``outputs/unit-000042/claim-000003.json``, written whole and atomically), then swaps the
unit to ``done`` naming that claim. A worker whose claim lapsed while it still ran (a
stall, a partition) loses the swap, so its output is never the unit's: the final output is
exactly the set of units, each once, whatever the reclaims did.

    queue = WorkQueue.create("s3://bucket/batch-17", ItemRange(0, 10_000), unit_size=50)
    queue = WorkQueue.open("s3://bucket/batch-17")   # on every worker
    run_worker(queue, infer_one, worker_id="w3")     # spot_core.workloads.batch_worker
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.checkpoint.backend import UnknownAge
from spot_core.errors import ConfigError

SPEC_KEY = "queue/spec.json"
STATE_PREFIX = "queue/units"
OUTPUT_PREFIX = "queue/outputs"
PROGRESS_PREFIX = "progress"  # each unit's own checkpoint store, below the queue's
FORMAT = 1
MAX_UNITS = 1_000_000
MAX_UNIT_SIZE = 1_000_000
MAX_OUTPUT_BYTES = 64 << 20

PENDING, CLAIMED, DONE, FAILED = "pending", "claimed", "done", "failed"
STATES = (PENDING, CLAIMED, DONE, FAILED)
TERMINAL = (DONE, FAILED)

Item = str | int


# -- what the queue holds ------------------------------------------------------------------------
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


def items_from_json(doc: dict[str, Any]) -> Items:
    if "range" in doc:
        start, stop = (int(x) for x in doc["range"])
        return ItemRange(start, stop)
    return Manifest(tuple(str(u) for u in doc["manifest"]))


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
        doc = json.loads(data)
        return cls(
            items_from_json(doc["items"]),
            int(doc["unit_size"]),
            float(doc["claim_timeout_seconds"]),
            int(doc["max_unit_retries"]),
        )


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
        doc = json.loads(data)
        doc["errors"] = tuple(doc.get("errors", ()))
        return cls(**doc)


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
    failed: int
    lapsed: int  # claimed, but its heartbeat is older than the claim timeout
    reclaims: int  # claims beyond each unit's first: takeovers and retries

    @property
    def complete(self) -> bool:
        return self.done + self.failed == self.total

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}


class LostClaim(Exception):
    """This worker's claim was taken over (its heartbeat lapsed): drop the unit."""


# -- the queue -----------------------------------------------------------------------------------
class WorkQueue:
    """A queue of units in one store; every state change is a compare-and-swap."""

    def __init__(
        self,
        store: CheckpointStore,
        spec: QueueSpec,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.spec, self.clock, self.monotonic = store, spec, clock, monotonic
        self._terminal: set[str] = set()  # units seen done or failed: never change again
        self._seen: dict[str, tuple[bytes, float]] = {}  # claimed unit -> (object, unchanged since)

    @property
    def uri(self) -> str:
        return self.store.uri

    @classmethod
    def create(
        cls,
        uri: str,
        items: Items,
        *,
        unit_size: int,
        claim_timeout_seconds: float = 60.0,
        max_unit_retries: int = 2,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        session: Any = None,
    ) -> WorkQueue:
        """The queue at ``uri``, made if it is not there; the same spec again is the same
        queue (a re-run of the DAG that made it), another spec is one ConfigError line."""
        spec = QueueSpec(items, unit_size, claim_timeout_seconds, max_unit_retries)
        _check_spec(spec)
        store = open_store(uri, session=session)
        if not store.swap_object(SPEC_KEY, None, spec.to_bytes()):
            existing = store.get_object(SPEC_KEY)
            if existing != spec.to_bytes():
                raise ConfigError(
                    f"{uri} already holds another queue (other items or unit size); "
                    "give this batch its own queue URI"
                )
        return cls(store, spec, clock=clock, monotonic=monotonic)

    @classmethod
    def open(
        cls,
        uri: str,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        session: Any = None,
    ) -> WorkQueue:
        store = open_store(uri, session=session)
        data = store.get_object(SPEC_KEY)
        if data is None:
            raise ConfigError(
                f"no work queue at {uri}; create it first (WorkQueue.create, or the "
                "DAG's/flow's queue task)"
            )
        return cls(store, QueueSpec.from_bytes(data), clock=clock, monotonic=monotonic)

    # -- reading -------------------------------------------------------------------------
    def state(self, unit: str) -> tuple[UnitState, bytes | None]:
        raw = self.store.get_object(f"{STATE_PREFIX}/{unit}.json")
        return (UnitState(unit) if raw is None else UnitState.from_bytes(raw)), raw

    def states(self) -> Iterator[UnitState]:
        for unit in self.spec.unit_ids():
            yield self.state(unit)[0]

    def progress(self) -> Progress:
        counts = dict.fromkeys(STATES, 0)
        lapsed = reclaims = 0
        for unit in self.spec.unit_ids():
            state, raw = self.state(unit)
            counts[state.state] += 1
            lapsed += self._lapsed(unit, state, raw)
            reclaims += max(0, state.claim - 1)
        return Progress(
            self.spec.units,
            counts[PENDING],
            counts[CLAIMED],
            counts[DONE],
            counts[FAILED],
            lapsed,
            reclaims,
        )

    def outputs(self) -> Iterator[tuple[str, list[Any]]]:
        """(unit, outputs) of every done unit, in unit order: the batch's result. Each
        unit's output is the one its ``done`` object names, checked against its digest."""
        for state in self.states():
            if state.state != DONE:
                continue
            data = self.store.get_object(state.output_key, max_bytes=MAX_OUTPUT_BYTES)
            if data is None or hashlib.sha256(data).hexdigest() != state.output_sha256:
                raise ConfigError(
                    f"the output of {state.unit} in {self.uri} is missing or altered "
                    f"({state.output_key}); it was written by claim {state.claim}"
                )
            yield state.unit, json.loads(data)["outputs"]

    # -- claiming ------------------------------------------------------------------------
    def claim(self, owner: str, *, start: int = 0) -> Claim | None:
        """Take one unit: a pending one, or one whose claim's heartbeat lapsed; None when
        there is nothing to take now. ``start``: where this worker begins looking (spread
        workers over the units so they rarely race for the same one)."""
        units = self.spec.unit_ids()
        for unit in units[start % max(1, len(units)) :] + units[: start % max(1, len(units))]:
            if unit in self._terminal:
                continue
            state, raw = self.state(unit)
            if state.state in TERMINAL:
                self._terminal.add(unit)
                continue
            if state.state == CLAIMED and not self._lapsed(unit, state, raw):
                continue
            taken = replace(
                state,
                state=CLAIMED,
                claim=state.claim + 1,
                owner=owner,
                token=secrets.token_hex(8),
                heartbeat_at=self.clock(),
            )
            if self._swap(unit, raw, taken):
                return Claim(
                    unit,
                    taken.claim,
                    taken.token,
                    owner,
                    tuple(self.spec.unit_items(unit)),
                    taken.to_bytes(),
                )
        return None

    def renew(self, claim: Claim) -> Claim:
        """The claim's heartbeat, now; LostClaim if another worker took the unit over."""
        state = self._held(claim)
        renewed = replace(state, heartbeat_at=self.clock())
        if not self._swap(claim.unit, claim.raw, renewed):
            raise LostClaim(f"{claim.unit} was taken over from claim {claim.number}")
        return replace(claim, raw=renewed.to_bytes())

    def complete(self, claim: Claim, outputs: Sequence[Any]) -> bool:
        """Write the unit's output (atomic, under the claim's own key), then swap the unit
        to done naming it. False, and the unit untouched, if the claim was lost."""
        key = output_key(claim.unit, claim.number)
        doc = {"unit": claim.unit, "items": list(claim.items), "outputs": list(outputs)}
        data = json.dumps(doc, sort_keys=True, allow_nan=False).encode()
        self.store.put_object(key, data)
        try:
            state = self._held(claim)
        except LostClaim:
            return False
        done = replace(
            state,
            state=DONE,
            heartbeat_at=self.clock(),
            output_key=key,
            output_sha256=hashlib.sha256(data).hexdigest(),
        )
        return self._swap(claim.unit, claim.raw, done)

    def fail(self, claim: Claim, error: str) -> UnitState | None:
        """The user's code failed on this unit: one of its retries spent (pending again),
        or failed for good when they are; None if the claim was lost meanwhile."""
        try:
            state = self._held(claim)
        except LostClaim:
            return None
        failures = state.failures + 1
        after = replace(
            state,
            state=FAILED if failures > self.spec.max_unit_retries else PENDING,
            failures=failures,
            errors=(*state.errors, error[:500])[-5:],
            owner="",
            token="",
        )
        return after if self._swap(claim.unit, claim.raw, after) else None

    def release(self, claim: Claim) -> bool:
        """Give the unit back without spending a retry (a notice: the lease is going)."""
        try:
            state = self._held(claim)
        except LostClaim:
            return False
        return self._swap(claim.unit, claim.raw, replace(state, state=PENDING, token=""))

    def unit_store_uri(self, unit: str) -> str:
        """Where a large unit checkpoints its progress (its own Checkpointer store)."""
        return f"{self.uri.rstrip('/')}/{PROGRESS_PREFIX}/{unit}"

    # -- helpers -------------------------------------------------------------------------
    def _held(self, claim: Claim) -> UnitState:
        state = UnitState.from_bytes(claim.raw)
        if state.token != claim.token:
            raise LostClaim(f"{claim.unit}: not this claim's object")
        return state

    def _swap(self, unit: str, expected: bytes | None, state: UnitState) -> bool:
        data = state.to_bytes()
        if not self.store.swap_object(f"{STATE_PREFIX}/{unit}.json", expected, data):
            return False
        self._observe(unit, state, data, written=True)
        return True

    def _lapsed(self, unit: str, state: UnitState, raw: bytes | None) -> bool:
        """Whether a claim's heartbeat lapsed, judged on one clock at a time, never this
        worker's clock against the ``heartbeat_at`` another worker wrote (a worker 60 s
        ahead took over every live claim and ran its items twice; a claim stamped NaN or
        far ahead never lapsed and the queue never completed). Lapsed when the object is
        older than the claim timeout on the store's clock (``object_age``), or when this
        worker has seen it unchanged for that long on its own monotonic clock: each a
        lower bound of the time since its holder last renewed. An age the store's clock
        cannot tell is the monotonic clock's alone: such a claim still lapses once this
        worker has seen it unchanged for a timeout."""
        if state.state != CLAIMED or raw is None:
            self._seen.pop(unit, None)
            return False
        timeout = self.spec.claim_timeout_seconds
        if self.monotonic() - self._observe(unit, state, raw) > timeout:
            return True
        try:  # read after the object, so never older than the object read
            age = self.store.object_age(f"{STATE_PREFIX}/{unit}.json")
        except UnknownAge:
            return False
        return age is not None and age > timeout

    def _observe(self, unit: str, state: UnitState, raw: bytes, written: bool = False) -> float:
        """Since when (this worker's monotonic clock) the unit's object has read as ``raw``
        (``written``: this worker wrote it just now)."""
        if state.state != CLAIMED:
            self._seen.pop(unit, None)
            return self.monotonic()
        seen = self._seen.get(unit)
        if written or seen is None or seen[0] != raw:
            seen = self._seen[unit] = (raw, self.monotonic())
        return seen[1]


def output_key(unit: str, claim: int) -> str:
    return f"{OUTPUT_PREFIX}/{unit}/claim-{claim:06d}.json"


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


def _check_spec(spec: QueueSpec) -> None:
    if not 1 <= spec.unit_size <= MAX_UNIT_SIZE:
        raise ConfigError(f"unit_size must be 1..{MAX_UNIT_SIZE} items (got {spec.unit_size})")
    if len(spec.items) == 0:
        raise ConfigError("the batch has no items; give a non-empty manifest or range")
    if spec.units > MAX_UNITS:
        raise ConfigError(
            f"{spec.units} units is more than {MAX_UNITS:,}; raise unit_size "
            f"(now {spec.unit_size}) so units hold more items"
        )
    if not spec.claim_timeout_seconds > 0:
        raise ConfigError(
            f"claim_timeout_seconds must be > 0 (got {spec.claim_timeout_seconds}); "
            "a claim whose heartbeat is older is taken over"
        )
    if spec.max_unit_retries < 0:
        raise ConfigError(f"max_unit_retries must be >= 0 (got {spec.max_unit_retries})")
