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

What could not be read back is refused when written (a spec over ``MAX_SPEC_BYTES``, an
output over ``MAX_OUTPUT_BYTES`` or not JSON: the unit's failure, one of its retries), and
every object is checked when read: a unit object no writer made is CORRUPT (warned once,
counted as failed, never claimed or written over), a spec no create made is one error.

    queue = WorkQueue.create("s3://bucket/batch-17", ItemRange(0, 10_000), unit_size=50)
    queue = WorkQueue.open("s3://bucket/batch-17")   # on every worker
    run_worker(queue, infer_one, worker_id="w3")     # spot_core.workloads.batch_worker

The queue in parts: ``batch_objects`` holds what it stores (items, spec, unit objects,
claims, progress, output keys) and the checks a read makes; this module, the queue's
life: create, open, claim, renew, complete, fail, release.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.checkpoint.backend import UnknownAge
from spot_core.errors import ConfigError, CorruptCheckpoint
from spot_core.workloads.batch_objects import (
    CLAIMED,
    CORRUPT,
    DONE,
    FAILED,
    FORMAT,
    MAX_COUNT,
    MAX_OUTPUT_BYTES,
    MAX_OWNER_CHARS,
    MAX_SPEC_BYTES,
    MAX_UNIT_BYTES,
    MAX_UNIT_SIZE,
    MAX_UNITS,
    OUTPUT_PREFIX,
    PENDING,
    PROGRESS_PREFIX,
    SPEC_KEY,
    STATE_PREFIX,
    STATES,
    TERMINAL,
    Claim,
    CorruptObject,
    Item,
    ItemRange,
    Items,
    LostClaim,
    Manifest,
    Progress,
    QueueSpec,
    UnitState,
    UnstorableOutput,
    check_spec,
    items_from_json,
    json_object,
    mib,
    output_key,
    outputs_json,
    outputs_sha256,
    unit_id,
    unit_index,
)

log = logging.getLogger(__name__)

# What the queue holds, importable from here as before it had a module of its own.
__all__ = [
    "CLAIMED",
    "CORRUPT",
    "DONE",
    "FAILED",
    "FORMAT",
    "MAX_COUNT",
    "MAX_OUTPUT_BYTES",
    "MAX_OWNER_CHARS",
    "MAX_SPEC_BYTES",
    "MAX_UNITS",
    "MAX_UNIT_BYTES",
    "MAX_UNIT_SIZE",
    "OUTPUT_PREFIX",
    "PENDING",
    "PROGRESS_PREFIX",
    "SPEC_KEY",
    "STATES",
    "STATE_PREFIX",
    "TERMINAL",
    "Claim",
    "CorruptObject",
    "Item",
    "ItemRange",
    "Items",
    "LostClaim",
    "Manifest",
    "Progress",
    "QueueSpec",
    "UnitState",
    "UnstorableOutput",
    "WorkQueue",
    "items_from_json",
    "output_key",
    "outputs_json",
    "outputs_sha256",
    "unit_id",
    "unit_index",
]


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
        self._warned: set[str] = set()  # corrupt units already named in the log
        # claimed unit -> (its object, since when this worker has seen it unchanged)
        self._seen: dict[str, tuple[bytes, float]] = {}

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
        check_spec(spec)
        data = _spec_bytes(spec)
        store = open_store(uri, session=session)
        if not store.put_object_if_absent(SPEC_KEY, data):  # never over an existing spec
            if _read_spec(store) != spec:
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
        spec = _read_spec(store)
        if spec is None:
            raise ConfigError(
                f"no work queue at {uri}; create it first (WorkQueue.create, or the "
                "DAG's/flow's queue task)"
            )
        return cls(store, spec, clock=clock, monotonic=monotonic)

    # -- reading -------------------------------------------------------------------------
    def state(self, unit: str) -> tuple[UnitState, bytes | None]:
        """The unit's state and its object's bytes; a corrupt object reads as a CORRUPT
        state (warned once), which nothing claims or writes over."""
        key = f"{STATE_PREFIX}/{unit}.json"
        try:
            raw = self.store.read_object(key, max_bytes=MAX_UNIT_BYTES)
            if raw is None:
                return UnitState(unit), None
            state = UnitState.from_bytes(raw)
            if state.unit != unit:
                raise CorruptObject(f"it names unit {state.unit!r}")
        except (CorruptCheckpoint, CorruptObject) as exc:
            return self._corrupt(unit, key, exc), None
        return state, raw

    def _corrupt(self, unit: str, key: str, problem: Exception) -> UnitState:
        if unit not in self._warned:
            self._warned.add(unit)
            log.warning(
                "%s of the work queue at %s is corrupt (%s: %s); counted as failed and never "
                "run: remove that object to run the unit again",
                unit,
                self.uri,
                key,
                problem,
            )
        return UnitState(unit, state=CORRUPT, errors=(str(problem)[:500],))

    def states(self) -> Iterator[UnitState]:
        for unit in self.spec.unit_ids():
            yield self.state(unit)[0]

    def progress(self) -> Progress:
        counts = dict.fromkeys((*STATES, CORRUPT), 0)
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
            counts[FAILED] + counts[CORRUPT],
            lapsed,
            reclaims,
            counts[CORRUPT],
        )

    def outputs(self) -> Iterator[tuple[str, list[Any]]]:
        """(unit, outputs) of every done unit, in unit order: the batch's result. Each
        unit's output is the one its ``done`` object names, checked against its digest."""
        for state in self.states():
            if state.state != DONE:
                continue
            yield state.unit, self._output(state)

    def _output(self, state: UnitState) -> list[Any]:
        where = f"the output of {state.unit} in {self.uri} ({state.output_key})"
        try:
            data = self.store.read_object(state.output_key, max_bytes=MAX_OUTPUT_BYTES)
        except CorruptCheckpoint as exc:  # over the limit, or no object: never "missing"
            raise ConfigError(
                f"{where} cannot be read ({exc}); a unit's output holds at most "
                f"{mib(MAX_OUTPUT_BYTES)}"
            ) from None
        if data is None or hashlib.sha256(data).hexdigest() != state.output_sha256:
            raise ConfigError(
                f"{where} is missing or altered; it was written by claim {state.claim}"
            )
        try:
            outputs = json_object(data)["outputs"]
        except (CorruptObject, KeyError) as exc:
            raise ConfigError(f"{where} is no unit output ({exc})") from None
        if not isinstance(outputs, list):
            raise ConfigError(f"{where} is no unit output (its outputs are no list)")
        return outputs

    # -- claiming ------------------------------------------------------------------------
    def claim(self, owner: str, *, start: int = 0) -> Claim | None:
        """Take one unit: a pending one, or one whose claim's heartbeat lapsed; None when
        there is nothing to take now. ``start``: where this worker begins looking (spread
        workers over the units so they rarely race for the same one)."""
        if len(owner) > MAX_OWNER_CHARS:
            raise ConfigError(
                f"a worker id may hold {MAX_OWNER_CHARS} characters, not {len(owner)}"
            )
        units = self.spec.unit_ids()
        for unit in units[start % max(1, len(units)) :] + units[: start % max(1, len(units))]:
            if unit in self._terminal:
                continue
            state, raw = self.state(unit)
            if state.state in TERMINAL:
                self._terminal.add(unit)
                continue
            if state.state == CORRUPT:
                continue  # never written over: the log names it, its owner removes it
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
        to done naming it. False, and the unit untouched, if the claim was lost;
        UnstorableOutput, and nothing written, for outputs that could not be read back
        (not JSON, or over MAX_OUTPUT_BYTES)."""
        key = output_key(claim.unit, claim.number)
        data = self._encode_output(claim, outputs)
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
    def _encode_output(self, claim: Claim, outputs: Sequence[Any]) -> bytes:
        doc = {"unit": claim.unit, "items": list(claim.items), "outputs": list(outputs)}
        data = outputs_json(claim.unit, doc)
        if len(data) > MAX_OUTPUT_BYTES:
            raise UnstorableOutput(
                f"the outputs of {claim.unit} are {mib(len(data))} as JSON, over the "
                f"{mib(MAX_OUTPUT_BYTES)} one unit's output may hold; write large outputs "
                "under your own keys and return their URIs, or lower unit_size "
                f"(now {self.spec.unit_size})"
            )
        return data

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


def _read_spec(store: CheckpointStore) -> QueueSpec | None:
    """The queue's spec, None when there is none; one ConfigError line for one that
    cannot be read (too big, garbage, out of range): never "no queue here"."""
    try:
        data = store.read_object(SPEC_KEY, max_bytes=MAX_SPEC_BYTES)
        return None if data is None else QueueSpec.from_bytes(data)
    except (CorruptCheckpoint, ValueError) as exc:
        raise ConfigError(
            f"the work queue spec at {store.uri} ({SPEC_KEY}) cannot be read ({exc}); "
            f"WorkQueue.create writes only valid specs of at most {mib(MAX_SPEC_BYTES)}: "
            "give the batch another queue URI (or remove that object and create the queue "
            "again)"
        ) from None


def _spec_bytes(spec: QueueSpec) -> bytes:
    """The spec as stored; ConfigError, before anything is written, when it is more
    than a reader of the queue reads back."""
    data = spec.to_bytes()
    if len(data) > MAX_SPEC_BYTES:
        raise ConfigError(
            f"the batch's spec is {mib(len(data))} ({len(spec.items):,} items), over the "
            f"{mib(MAX_SPEC_BYTES)} a work queue's spec may hold; nothing was written: split "
            "the batch into several queues, or keep the URIs in a file of your own and "
            f"queue ItemRange(0, {len(spec.items)}) of their line numbers"
        )
    return data
