"""The replacement's side of a handover: prefetch, wait for the old attempt, then go.

With the ``handover`` setting the controller launches attempt N+1 on attempt N's
interruption notice, while N still runs and saves. N+1 must not fence the store at once
(N's emergency checkpoint would be refused), and must not restore what is newest now
(N is about to save a newer one). So, before ``Checkpointer.from_env`` fences, it:

1. prefetches the newest checkpoint (payload files read concurrently, each digest checked
   as it streams), so the download overlaps N's save;
2. waits, polling the store, until N's emergency checkpoint is committed, or N has ended
   (the controller marks it when it closes N; the node's status report says so too), or the
   notice's deadline passed (N's capacity is gone by then), whichever comes first;
3. fetches again only if something newer than the prefetch was committed meanwhile.

Then it fences N out (a zombie of N can no longer save) and restores. The fence, not this
wait, is what guarantees one writer; the wait only decides *what* is restored, and N is
never cut short by it.

Launched on a rebalance recommendation, the wait can also end with N's node reporting that
N's step exited 0 with no notice at all: it finished the work, nothing is to be taken over,
so the replacement stands down (``Handover.needed`` is False) without fencing or
restoring, and the controller ends its lease.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spot_core.bounds import MAX_WAIT_SECONDS
from spot_core.checkpoint.status import parse_report, status_key
from spot_core.checkpoint.store import CheckpointStore
from spot_core.errors import CorruptCheckpoint
from spot_core.model import CheckpointRef, Lease

log = logging.getLogger(__name__)

HANDOVER_PREFIX = "handover"
DEFAULT_NOTICE_SECONDS = 120.0  # AWS's two minutes: the longest notice a cloud documents
POLL_SECONDS = 0.1
# After this long a wait is a rebalance's (a notice's save is done well within it): each
# poll is a listing and three reads, 40 requests a second at POLL_SECONDS, about $0.2 an
# hour of S3 requests for a wait that may last hours, so it slows to SLOW_POLL_SECONDS.
FAST_POLL_WINDOW_SECONDS = 30.0
SLOW_POLL_SECONDS = 0.5
UNINTERRUPTED = "(exit 0, no notice): no handover needed"


def ended_key(attempt: int) -> str:
    return f"{HANDOVER_PREFIX}/attempt-{attempt:06d}-ended.json"


def mark_ended(store: CheckpointStore, attempt: int, ended_at: float) -> None:
    """Say that ``attempt`` has ended (the controller, when it closes it): a replacement
    waiting for it goes on at once instead of at the notice's deadline."""
    doc = {"attempt": attempt, "ended_at": ended_at}
    store.put_object(ended_key(attempt), json.dumps(doc, allow_nan=False).encode())


def launched_key(attempt: int) -> str:
    return f"{HANDOVER_PREFIX}/attempt-{attempt:06d}-replacement.json"


def mark_launched(store: CheckpointStore, attempt: int, replacement: Mapping[str, Any]) -> None:
    """Say, in the job's store, that ``attempt``'s replacement was launched (the record's
    ``Attempt.replacement``): a driver whose record is not persisted as it goes (a
    trigger: its kwargs hold the Next it was deferred with) finds it there after a
    restart and records it, instead of launching a second one."""
    store.put_object(launched_key(attempt), json.dumps(dict(replacement), allow_nan=False).encode())


def forget_launched(store: CheckpointStore, attempt: int) -> None:
    """Drop ``mark_launched``'s object (its lease was ended unrecorded); best effort: the
    driver is already failing, and a stale one only names a lease that has ended."""
    try:
        store.delete_object(launched_key(attempt))
    except Exception:  # noqa: BLE001 - the original error is the one to raise
        log.warning("attempt %d: could not drop its replacement record", attempt, exc_info=True)


def read_launched(store: CheckpointStore, attempt: int) -> dict[str, Any] | None:
    """``mark_launched``'s replacement of ``attempt``, or None (none, or unreadable: a
    torn or forged object is read as none, and the usual path relaunches after the end)."""
    data = store.get_object(launched_key(attempt))
    if data is None:
        return None
    try:
        doc = json.loads(data)
        Lease.from_dict(doc["lease"])
        if isinstance(doc["attempt"], bool) or int(doc["attempt"]) <= attempt:
            raise ValueError(f"attempt {doc['attempt']!r} does not follow {attempt}")
        return dict(doc)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("attempt %d: unreadable replacement record (%s); ignored", attempt, exc)
        return None


def go_key(attempt: int) -> str:
    return f"{HANDOVER_PREFIX}/attempt-{attempt:06d}-go.json"


def mark_go(store: CheckpointStore, old_attempt: int, attempt: int, at: float) -> bool:
    """Tell ``attempt``, ``old_attempt``'s replacement, that it may start now (a driver
    whose replacement must not start its step before the driver says so: the Prefect
    worker's, whose step is the flow run's engine, which may start only once the old
    engine is gone and the flow run is back in a state a fresh engine starts from).

    Written once (a compare-and-swap from nothing): a restarted driver's second go
    changes nothing. True if this call wrote it."""
    doc = {"attempt": attempt, "from": old_attempt, "go_at": at}
    data = json.dumps(doc, allow_nan=False).encode()
    return store.swap_object(go_key(old_attempt), None, data)


def read_go(store: CheckpointStore, old_attempt: int, attempt: int) -> dict[str, Any] | None:
    """``mark_go``'s go for ``attempt``, or None: none yet, or one addressed to another
    attempt, torn or forged (read as none: the replacement waits on, bounded)."""
    data = store.get_object(go_key(old_attempt))
    if data is None:
        return None
    try:
        doc = json.loads(data)
        if isinstance(doc["attempt"], bool) or int(doc["attempt"]) != attempt:
            raise ValueError(f"a go for attempt {doc['attempt']!r}, not {attempt}")
        return dict(doc)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("attempt %d: unreadable go from the driver (%s); ignored", attempt, exc)
        return None


@dataclass(frozen=True)
class Prefetched:
    """A checkpoint read and verified ahead of the restore; ``seconds`` it took."""

    ref: CheckpointRef
    payload: dict[str, bytes]
    seconds: float


@dataclass(frozen=True)
class Handover:
    """What the wait ended with: the checkpoint to restore (None: nothing saved yet), why
    the wait ended, how long it lasted, and the read after it (the restore's own share)."""

    prefetched: Prefetched | None
    reason: str
    waited_seconds: float
    fetched_after_wait_seconds: float
    needed: bool = True  # False: the old attempt finished the work unnoticed; stand down


def await_handover(
    store: CheckpointStore,
    *,
    old_attempt: int,
    deadline: float | None,
    poll_seconds: float = POLL_SECONDS,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Handover:
    """Prefetch, wait for ``old_attempt`` (its emergency checkpoint, its end, or
    ``deadline``), and return the newest checkpoint, read. Bounded: without a deadline,
    ``DEFAULT_NOTICE_SECONDS`` from now; never more than a day. Polls every
    ``poll_seconds``, and every ``SLOW_POLL_SECONDS`` once it has waited
    ``FAST_POLL_WINDOW_SECONDS``."""
    started = clock()
    limit = min(
        started + DEFAULT_NOTICE_SECONDS if deadline is None else deadline,
        started + MAX_WAIT_SECONDS,
    )
    newest = _newest(store)
    prefetched = _fetch(store, newest)
    reason = _ready(store, old_attempt, newest, limit, clock())
    while reason is None:
        slow = clock() - started >= FAST_POLL_WINDOW_SECONDS
        sleep(max(poll_seconds, SLOW_POLL_SECONDS) if slow else poll_seconds)
        newest = _newest(store)
        reason = _ready(store, old_attempt, newest, limit, clock())
    waited = clock() - started
    log.info("handover from attempt %d: %s after %.2f s", old_attempt, reason, waited)
    if reason.endswith(UNINTERRUPTED):
        return Handover(None, reason, waited, 0.0, needed=False)
    before = clock()
    # ``newest`` is the last poll's: anything a zombie commits after it is found by the
    # restore, which looks again once the store is fenced (``Checkpointer._prefetched``)
    if newest is not None and (
        prefetched is None or newest.checkpoint_id != prefetched.ref.checkpoint_id
    ):
        prefetched = _fetch(store, newest)
    return Handover(prefetched, reason, waited, clock() - before)


def _ready(
    store: CheckpointStore, old: int, newest: CheckpointRef | None, limit: float, now: float
) -> str | None:
    """Why the wait is over, or None while it is not (``newest``: the store's newest)."""
    if newest is not None and newest.attempt == old and "emergency" in newest.metadata:
        return f"the emergency checkpoint of attempt {old} (step {newest.step}) is committed"
    if store.get_object(ended_key(old)) is not None:
        return f"attempt {old} has ended"
    report = parse_report(store.get_object(status_key(old)))
    if "ended_at" in report and report.get("exit_code") == 0 and "notice_at" not in report:
        # it finished the work. Any other end goes on: a node whose watcher missed the
        # notice still reports a reclaim as a failed exit, and the controller judges it
        return f"attempt {old}'s node reported its end {UNINTERRUPTED}"
    if "ended_at" in report:
        return f"attempt {old}'s node reported its end"
    if now >= limit:
        return f"the notice's deadline passed without a word from attempt {old}"
    return None


def _newest(store: CheckpointStore) -> CheckpointRef | None:
    """The newest committed checkpoint by its manifest (cheap: one listing, one manifest;
    no payload is hashed here, every byte is verified when it is read)."""
    return store.newest()


def _fetch(store: CheckpointStore, ref: CheckpointRef | None) -> Prefetched | None:
    """``ref`` read concurrently and verified; a corrupt one falls back to the newest
    checkpoint that verifies (as ``restore`` would)."""
    if ref is None:
        return None
    started = time.perf_counter()
    try:
        payload = store.load_concurrently(ref)
    except CorruptCheckpoint as exc:
        log.warning("prefetch of %s failed (%s); reading the newest valid one", ref, exc)
        fallback = store.latest()
        if fallback is None:
            return None
        ref, payload = fallback, store.load_concurrently(fallback)
    return Prefetched(ref, payload, time.perf_counter() - started)
