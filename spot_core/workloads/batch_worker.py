"""One batch worker: take units from a ``WorkQueue`` until none is left, run the user's
function on each item, and keep each claim alive with a heartbeat while it works.

A worker is one spot job's step (``python -m spot_core.workloads.batch_worker --queue URI
--function pkg.mod:infer``); any number of them share a queue. What each exit path does:

- a unit's items all processed: its output is written and the unit swapped to done;
- the user's function raised: that unit spends one of its own retries (pending again,
  or failed when they are spent) and the worker goes on with the next unit;
- a notice (SIGTERM from ``spot-pipelines watch``): the unit's progress is checkpointed
  (when the unit checkpoints), the claim released, and the step exits 143 (preempted);
- the lease vanished (SIGKILL): nothing runs; the claim's heartbeat lapses and another
  worker (or this job's next attempt) takes the unit over, from its checkpoint if any;
- the claim was taken over while this worker still ran (it stalled past the claim
  timeout): the worker drops the unit; its output, if written, is never the unit's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from spot_core.attempt_env import exit_ignoring_notices, report_step_exit, step_exit_code
from spot_core.checkpoint import Checkpointer, open_store
from spot_core.errors import ConfigError, FencedOut, Preempted, SpotError
from spot_core.workloads.batch import (
    Claim,
    Item,
    LostClaim,
    UnstorableOutput,
    WorkQueue,
    outputs_json,
)

log = logging.getLogger(__name__)

Process = Callable[[Item], Any]
PARTIAL = "outputs.json"


@dataclass
class WorkerStats:
    """What one worker did, for its log line and the tests."""

    units_done: int = 0
    units_failed: int = 0  # user failures (each spent a retry of its unit)
    units_lost: int = 0  # claims taken over while this worker held them
    items_processed: int = 0  # items run by this worker, resumed ones not counted twice
    resumed_units: int = 0  # units started from another claim's checkpoint


class Stop:
    """Set from a signal handler or a test, or seen through ``notice`` (a spot task's
    ``Checkpointer`` after SIGTERM): finish the current item, then stop."""

    def __init__(self, notice: Callable[[], bool] | None = None) -> None:
        self._reason: str | None = None
        self._notice = notice

    def set(self, reason: str) -> None:
        self._reason = reason

    @property
    def reason(self) -> str | None:
        if self._reason is None and self._notice is not None and self._notice():
            self._reason = "interruption notice"
        return self._reason

    @classmethod
    def on_notice_of(cls, checkpointer: Checkpointer) -> Stop:
        """Stop when ``checkpointer`` was asked for an emergency save."""
        return cls(lambda: checkpointer.emergency_requested)


class _Held:
    """The claim being worked on, renewed by the heartbeat thread; one lock orders the
    heartbeat's swaps and the worker's own (complete, fail, release)."""

    def __init__(self, queue: WorkQueue, claim: Claim) -> None:
        self.queue, self.claim, self.lock = queue, claim, threading.Lock()
        self.lost = False

    def renew(self) -> None:
        with self.lock:
            if self.lost:
                return
            try:
                self.claim = self.queue.renew(self.claim)
            except LostClaim:
                self.lost = True

    def check(self) -> None:
        if self.lost:
            raise LostClaim(f"{self.claim.unit} was taken over from claim {self.claim.number}")


def run_worker(
    queue: WorkQueue,
    process: Process,
    *,
    worker_id: str,
    stop: Stop | None = None,
    checkpoint_every_items: int | None = None,
    idle_timeout_seconds: float = 600.0,
    poll_seconds: float = 0.2,
) -> WorkerStats:
    """Work until every unit is done or failed (or nothing changed for
    ``idle_timeout_seconds`` while other workers held the rest). Raises Preempted after
    releasing its claim when ``stop`` is set."""
    stop = stop or Stop()
    stats = WorkerStats()
    start = zlib.crc32(worker_id.encode()) % max(1, queue.spec.units)
    idle_since = time.monotonic()
    while stop.reason is None:
        claim = queue.claim(worker_id, start=start)
        if claim is None:
            if queue.progress().complete:
                return stats
            if time.monotonic() - idle_since > idle_timeout_seconds:
                log.warning("worker %s: nothing to take for %.0fs", worker_id, idle_timeout_seconds)
                return stats
            time.sleep(poll_seconds)
            continue
        _work_unit(queue, claim, process, stop, stats, checkpoint_every_items)
        idle_since = time.monotonic()
    raise Preempted(f"worker {worker_id} stopped: {stop.reason}")


def _work_unit(
    queue: WorkQueue,
    claim: Claim,
    process: Process,
    stop: Stop,
    stats: WorkerStats,
    every: int | None,
) -> None:
    held = _Held(queue, claim)
    with _heartbeat(held, queue.spec.claim_timeout_seconds / 3):
        try:
            checkpointer = _unit_checkpointer(queue, claim, every)
            outputs: list[Any] = _restored(checkpointer, stats)
            for item in claim.items[len(outputs) :]:
                held.check()
                if stop.reason is not None:
                    _save(checkpointer, claim.unit, outputs)
                    with held.lock:
                        queue.release(held.claim)
                    return
                outputs.append(process(item))
                stats.items_processed += 1
                if checkpointer is not None and len(outputs) % (every or 1) == 0:
                    _save(checkpointer, claim.unit, outputs)
            held.check()
        except (LostClaim, FencedOut):
            # FencedOut: a newer claim of this unit fenced its progress store, so this
            # claim lapsed and was taken over (this worker stalled); drop the unit.
            stats.units_lost += 1
            return
        except Exception as exc:  # noqa: BLE001 - the user's code: this unit's retry, not ours
            if isinstance(exc, SpotError) and step_exit_code(exc) is not None:
                raise  # a store outage or a preemption is not the unit's fault
            _fail(queue, held, exc, stats)
            return
        try:
            with held.lock:
                done = queue.complete(held.claim, outputs)
        except UnstorableOutput as exc:  # what the function returned: this unit's retry
            _fail(queue, held, exc, stats)
            return
    if done:
        stats.units_done += 1
    else:
        stats.units_lost += 1


def _fail(queue: WorkQueue, held: _Held, exc: Exception, stats: WorkerStats) -> None:
    """The user's code (or what it returned) failed the unit: one of its retries spent."""
    with held.lock:
        after = queue.fail(held.claim, f"{type(exc).__name__}: {exc}")
    stats.units_failed += after is not None
    log.warning("unit %s failed (%s): %s", held.claim.unit, type(exc).__name__, exc)


def _unit_checkpointer(queue: WorkQueue, claim: Claim, every: int | None) -> Checkpointer | None:
    if every is None:
        return None
    store = open_store(queue.unit_store_uri(claim.unit))
    store.fence(claim.number)  # an older claim still running cannot save over this one
    return Checkpointer(store, attempt=claim.number, every_steps=every, keep=1)


def _restored(checkpointer: Checkpointer | None, stats: WorkerStats) -> list[Any]:
    if checkpointer is None:
        return []
    found = checkpointer.restore()
    if found is None:
        return []
    stats.resumed_units += 1
    outputs: list[Any] = json.loads(found[1][PARTIAL])
    return outputs


def _save(checkpointer: Checkpointer | None, unit: str, outputs: list[Any]) -> None:
    """Checkpoint the unit's outputs so far, unless nothing is new since the last save;
    UnstorableOutput for outputs its ``done`` could never store (NaN, a set)."""
    if checkpointer is None or not outputs:
        return
    last = checkpointer.last_ref or checkpointer.restored
    if last is not None and last.step >= len(outputs):
        return
    checkpointer.save_now(len(outputs), lambda: {PARTIAL: outputs_json(unit, outputs)})


@contextmanager
def _heartbeat(held: _Held, every_seconds: float) -> Iterator[None]:
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_seconds):
            try:
                held.renew()
            except Exception as exc:  # noqa: BLE001 - a missed beat; the next one retries
                log.warning("heartbeat of %s failed: %s", held.claim.unit, exc)

    thread = threading.Thread(target=beat, name=f"claim-{held.claim.unit}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=every_seconds + 5)


def load_function(spec: str) -> Process:
    """``package.module:function`` -> the function (one ConfigError line otherwise)."""
    module, _, name = spec.partition(":")
    try:
        found: Process = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"--function {spec!r} is not importable here ({exc}); give package.module:function"
        ) from exc
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", required=True, help="the queue's store URI")
    parser.add_argument("--function", required=True, help="package.module:function per item")
    parser.add_argument("--worker-id", default=None, help="default: the job id and attempt")
    parser.add_argument("--checkpoint-every-items", type=int, default=None)
    parser.add_argument("--idle-timeout-seconds", type=float, default=600.0)
    args = parser.parse_args(argv)
    from spot_core.attempt_env import AttemptEnv

    env = AttemptEnv.from_environ()
    worker_id = args.worker_id or f"{env.job_id or 'worker'}.a{env.attempt}"
    stop = Stop()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        stats = run_worker(
            WorkQueue.open(args.queue),
            load_function(args.function),
            worker_id=worker_id,
            stop=stop,
            checkpoint_every_items=args.checkpoint_every_items,
            idle_timeout_seconds=args.idle_timeout_seconds,
        )
    except ConfigError as exc:  # a queue or function that cannot be used: one line
        print(f"batch_worker: {exc}", file=sys.stderr, flush=True)
        return 2
    except SpotError as exc:
        return report_step_exit(exc)
    print(json.dumps({"worker": worker_id, **stats.__dict__}), flush=True)
    return 0


if __name__ == "__main__":
    exit_ignoring_notices(main())
