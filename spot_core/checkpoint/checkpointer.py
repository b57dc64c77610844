"""Checkpointing for training loops: scheduled saves, emergency save on notice, restore.

Convention: ``step`` is the number of completed steps the saved state reflects, so
after ``restore()`` the loop continues at ``start_step``::

    ckpt = Checkpointer.from_env(every_seconds=600)
    restored = ckpt.restore()
    for step in range(ckpt.start_step, total):
        train_one(step)
        ckpt.maybe_save(step + 1, lambda: make_payload())   # may raise Preempted

Steps never go back: a save below the newest saved or restored step is refused with
one ConfigError naming the fix (a loop whose counter restarts each epoch passes a global
step, ``epoch * steps_per_epoch + step``), so pruning can never delete the checkpoint
just committed and ``restore()`` always returns the newest state (docs/checkpoints.md).

A notice (SIGTERM forwarded by ``spot-pipelines watch``, the notice file, or a
watcher thread calling ``request_emergency_save``) makes the next ``maybe_save``
save at once and raise ``Preempted``, so the loop stops at a step boundary with
its state durable.

With ``background=True`` a scheduled save stalls the loop only while the state is staged
(``spot_core.checkpoint.background``): one save in flight at most, a save due meanwhile is
skipped, an emergency save waits for the one in flight and then saves the newest state,
and a background save that failed is raised at the next ``maybe_save``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from spot_core.attempt_env import CHECKPOINT_URI, AttemptEnv, install_step_excepthook
from spot_core.bounds import MAX_WAIT_SECONDS
from spot_core.checkpoint.background import BackgroundSave, failed, serialised, stage
from spot_core.checkpoint.handover import Handover, await_handover
from spot_core.checkpoint.resumed import ResumeReport, write_resumed
from spot_core.checkpoint.store import CheckpointStore, step_went_back
from spot_core.errors import CheckpointError, ConfigError, Preempted, ReplacementNotNeeded
from spot_core.model import CheckpointRef
from spot_core.safe_files import read_bytes

log = logging.getLogger(__name__)

PayloadFactory = Callable[[], Mapping[str, Any]]


class Checkpointer:
    """Decides when a training loop saves, and measures what saving costs."""

    def __init__(
        self,
        store: CheckpointStore,
        *,
        attempt: int = 1,
        every_seconds: float | None = None,
        every_steps: int | None = None,
        keep: int = 3,
        clock: Callable[[], float] = time.monotonic,
        notice_file: str | None = None,
        background: bool = False,
    ) -> None:
        _check_interval("every_seconds", every_seconds)
        if not isinstance(background, bool):
            raise ConfigError(f"background must be True or False, got {background!r}")
        _check_interval("every_steps", every_steps)
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"keep must be an int >= 1, got {keep!r}")
        self.store, self.attempt, self.keep = store, attempt, keep
        self.every_seconds, self.every_steps = every_seconds, every_steps
        self.notice_file = notice_file
        self.background = background
        self._inflight: BackgroundSave | None = None
        self._staging: dict[str, Any] = {}  # staging buffers, reused save after save
        self.skipped_saves = 0  # due while one was in flight (background only)
        self.last_stall_seconds = 0.0  # what the last save cost the loop
        self.last_upload_seconds = 0.0  # the last background save, hand-over to commit
        self._clock = clock
        self._last_save_time = clock()
        self._last_saved_step: int | None = None
        self._emergency_reason: str | None = None  # plain attribute: safe in signal handlers
        self._old_handlers: dict[int, Any] = {}
        self.restored: CheckpointRef | None = None
        self.last_ref: CheckpointRef | None = None
        self.last_save_seconds = 0.0
        self.total_save_seconds = 0.0
        self.saves = 0
        self.restore_seconds = 0.0
        self.resumed_at: float | None = None  # wall time of the first step (resumed.py)
        # Set by ``from_env`` for a replacement launched on a notice: what it prefetched.
        self.handover: Handover | None = None
        self._rebalance_seen: int | None = None  # the notice file's mtime last answered
        self._notice_read: tuple[int, str | None] | None = None  # (mtime, event) last read

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs: Any) -> Checkpointer:
        """Build from SPOT_CHECKPOINT_URI / SPOT_ATTEMPT and fence out older attempts.

        Without ``every_seconds``, saves follow ``SPOT_CHECKPOINT_INTERVAL``: the interval
        the controller chose for the attempt's pool (Young/Daly from its interruption rate
        and the job's measured save cost), the safety net for a notice that never comes."""
        from spot_core.checkpoint.opening import open_store

        # An uncaught Preempted or store failure ends the step with its own exit code and
        # one line (143, 74), not as the step's failure (exit 1 and a traceback).
        install_step_excepthook()
        env = AttemptEnv.from_environ(environ)
        if not env.checkpoint_uri:
            raise ConfigError(
                f"{CHECKPOINT_URI} is not set; run the step under spot-pipelines "
                "or set it to file:///absolute/path"
            )
        store = open_store(env.checkpoint_uri)
        handover = None
        if env.handover_from is not None and env.handover_from < env.attempt:
            # launched on its predecessor's notice: prefetch and wait for its emergency
            # checkpoint before fencing it out (spot_core.checkpoint.handover)
            handover = await_handover(
                store, old_attempt=env.handover_from, deadline=env.handover_deadline
            )
            if not handover.needed:  # launched on a rebalance that no reclaim followed
                raise ReplacementNotNeeded(
                    f"attempt {env.attempt} stands down: {handover.reason} (the controller "
                    "ends this replacement's capacity)"
                )
        store.fence(env.attempt)
        kwargs.setdefault("notice_file", env.notice_file)
        if env.checkpoint_interval is not None:
            # the controller's interval for this attempt's pool, unless the step chose one
            kwargs.setdefault("every_seconds", env.checkpoint_interval)
        checkpointer = cls(store, attempt=env.attempt, **kwargs)
        checkpointer.handover = handover
        return checkpointer

    # -- restore ---------------------------------------------------------------------
    def restore(self) -> tuple[int, dict[str, bytes]] | None:
        """(step, payload) of the newest valid checkpoint, or None on a fresh start."""
        started = time.perf_counter()
        # a handover's read of what was committed after its prefetch is part of the restore
        fetched = 0.0 if self.handover is None else self.handover.fetched_after_wait_seconds
        found = self._prefetched()
        if found is None:
            ref = self.store.latest()
            if ref is None:
                return None
            payload = self.store.load(ref)
        else:
            ref, payload = found
        self.restore_seconds = time.perf_counter() - started + fetched
        self.restored = ref
        self._last_saved_step = ref.step
        self._last_save_time = self._clock()
        log.info("restored checkpoint %s at step %d", ref.checkpoint_id, ref.step)
        return ref.step, payload

    def _prefetched(self) -> tuple[CheckpointRef, dict[str, bytes]] | None:
        """A handover's prefetched checkpoint, if it is still the newest now that the store
        is fenced (anything committed after the wait is read here, concurrently)."""
        handover, self.handover = self.handover, None
        if handover is None or handover.prefetched is None:
            return None
        newest = self.store.newest()
        ready = handover.prefetched
        if newest is not None and newest.checkpoint_id != ready.ref.checkpoint_id:
            return newest, self.store.load_concurrently(newest)
        return ready.ref, ready.payload

    @property
    def start_step(self) -> int:
        """The step to continue from: the restored step, or 0."""
        return 0 if self.restored is None else self.restored.step

    # -- saving ----------------------------------------------------------------------
    def maybe_save(
        self, step: int, make_payload: PayloadFactory, metadata: Mapping[str, Any] | None = None
    ) -> CheckpointRef | None:
        """Save if a schedule is due; on a pending notice save now and raise Preempted; on a
        rebalance recommendation save now (once) and go on: cheap insurance, since the
        capacity is at risk but not yet going.

        With ``background``: a save returns None at once (``last_ref`` is set when it has
        committed); a due save while one is in flight is skipped (``skipped_saves``); a
        background save that failed is raised here, once, as the store's error class."""
        self._report_resumed()
        reason = self._pending_notice()
        if reason is not None:
            self._emergency_save(step, make_payload, metadata, reason)
        self._collect()
        if self._rebalance_due() and self._last_saved_step != step:
            meta = {**(metadata or {}), "rebalance": True}  # answered once: never skipped
            return self._save(step, make_payload, meta, background=self.background)
        if not self._due(step):
            return None
        if self._inflight is not None:
            self.skipped_saves += 1
            return None
        return self._save(step, make_payload, metadata, background=self.background)

    def save_now(
        self, step: int, make_payload: PayloadFactory, metadata: Mapping[str, Any] | None = None
    ) -> CheckpointRef:
        """Serialise and save right away; the measured time includes serialisation.

        The metadata carries ``checkpoint_seconds_total`` and ``checkpoint_saves`` so the
        controller can charge checkpoint overhead to the attempt from the store alone;
        the total covers earlier saves plus this one's serialisation (its own write
        time cannot be known before its manifest is written).
        """
        ref = self._save(step, make_payload, metadata, background=False)
        assert ref is not None  # saved in the foreground
        return ref

    def _save(
        self,
        step: int,
        make_payload: PayloadFactory,
        metadata: Mapping[str, Any] | None,
        *,
        background: bool,
    ) -> CheckpointRef | None:
        """Stage and save (None: handed to the background, not yet committed)."""
        self._report_resumed()
        self.wait_for_save()  # one in flight at most; its failure is raised here
        if self._last_saved_step is not None and step < self._last_saved_step:
            # before serialising: the store refuses it too (docs/checkpoints.md)
            raise step_went_back(step, self._last_saved_step, self.store.uri)
        started = time.perf_counter()
        staged = stage(make_payload(), self._staging)
        if background:
            self._hand_over(step, staged, metadata, started)
            return None
        payload = serialised(staged)
        ledger = self._ledger(time.perf_counter() - started)  # with the serialisation
        ref = self.store.save(step, payload, {**(metadata or {}), **ledger}, attempt=self.attempt)
        self.last_stall_seconds = time.perf_counter() - started
        self._record(ref, self.last_stall_seconds)
        self._prune()
        return ref

    def _ledger(self, seconds: float) -> dict[str, Any]:
        return {
            "checkpoint_seconds_total": self.total_save_seconds + seconds,
            "checkpoint_saves": self.saves + 1,
        }

    def _hand_over(
        self,
        step: int,
        staged: Mapping[str, Any],
        metadata: Mapping[str, Any] | None,
        started: float,
    ) -> None:
        """Start the upload of ``staged`` on its own thread; the loop's stall ends here.
        The overhead charged to the attempt is this stall, not the upload beside it."""
        stall = time.perf_counter() - started
        meta = {**(metadata or {}), **self._ledger(stall)}

        def save() -> CheckpointRef:
            ref = self.store.save(step, serialised(staged), meta, attempt=self.attempt)
            self._prune()
            return ref

        self._inflight = BackgroundSave(step, save)
        self.last_stall_seconds = stall
        self._last_save_time = self._clock()  # the schedule runs from the hand-over
        self.total_save_seconds += stall

    def wait_for_save(self, timeout_seconds: float = MAX_WAIT_SECONDS) -> CheckpointRef | None:
        """Wait for the background save in flight, if any (bounded: the store's own calls
        are; ``timeout_seconds`` besides). Its ref once committed; its failure is raised
        (once) as ``maybe_save`` would raise it. None when none was in flight."""
        save = self._inflight
        if save is None:
            return None
        if not save.join(timeout_seconds):
            raise CheckpointError(
                f"the background checkpoint save of step {save.step} to {self.store.uri} "
                f"is still running after {timeout_seconds:g} s; the store is stalled "
                "(check its endpoint and disk)",
                retryable=True,
            )
        return self._collect()

    def _collect(self) -> CheckpointRef | None:
        """Record the background save if it has ended: its ref, or raise its failure."""
        save = self._inflight
        if save is None or not save.done:
            return None
        self._inflight = None
        if save.error is not None:
            raise failed(save, self.store.uri, self._last_saved_step) from save.error
        assert save.ref is not None
        self._record(save.ref, self.last_stall_seconds, counted=True)
        self.last_upload_seconds = save.seconds
        return save.ref

    def _emergency_save(
        self,
        step: int,
        make_payload: PayloadFactory,
        metadata: Mapping[str, Any] | None,
        reason: str,
    ) -> None:
        log.warning("emergency checkpoint at step %d: %s", step, reason)
        self._settle_inflight()
        try:
            if self._last_saved_step != step:
                self.save_now(step, make_payload, {**(metadata or {}), "emergency": reason})
        except Exception as exc:
            raise Preempted(
                f"preempted ({reason}); the emergency checkpoint at step {step} failed: {exc}"
            ) from exc
        raise Preempted(f"preempted ({reason}); state saved at step {step}")

    def _settle_inflight(self) -> None:
        """Before an emergency save: let the save in flight end (it may commit an older
        step; the emergency save then commits the newest). Its failure is logged, not
        raised: the newest state is what must land now."""
        try:
            self.wait_for_save()
        except Exception as exc:  # noqa: BLE001 - superseded by the emergency save
            log.warning("the background save before the notice failed: %s", exc)

    def _report_resumed(self) -> None:
        """Once per attempt, at its first step: tell the store when the work resumed (the
        controller records it; the JobRecord derives what the reclaim cost in wall time).
        Never fatal: a missed report costs a measurement, not progress."""
        if self.resumed_at is not None:
            return
        self.resumed_at = time.time()
        report = ResumeReport(
            attempt=self.attempt,
            resumed_at=self.resumed_at,
            step=None if self.restored is None else self.restored.step,
            restore_seconds=self.restore_seconds,
        )
        try:
            write_resumed(self.store, report)
        except Exception as exc:  # noqa: BLE001 - a measurement, never the step's progress
            log.warning("could not report the resume to %s: %s", self.store.uri, exc)

    def _due(self, step: int) -> bool:
        last = 0 if self._last_saved_step is None else self._last_saved_step
        if self.every_steps is not None and step - last >= self.every_steps:
            return True
        if self.every_seconds is not None:
            return self._clock() - self._last_save_time >= self.every_seconds
        return False

    def _record(self, ref: CheckpointRef, seconds: float, *, counted: bool = False) -> None:
        """A committed save; ``counted``: its seconds are already in the total (a
        background save's stall, charged at the hand-over)."""
        self.last_ref = ref
        self._last_saved_step = ref.step
        if not counted:
            self._last_save_time = self._clock()
            self.total_save_seconds += seconds
        self.last_save_seconds = seconds
        self.saves += 1

    def _prune(self) -> None:
        try:
            self.store.prune(keep=self.keep)
        except Exception as exc:  # noqa: BLE001 - a failed prune costs disk, never progress
            log.warning("could not prune %s: %s", self.store.uri, exc)

    # -- notices ---------------------------------------------------------------------
    def request_emergency_save(self, reason: str = "interruption notice") -> None:
        """Ask the next ``maybe_save`` to save and stop. Safe from signal handlers and threads."""
        self._emergency_reason = reason

    @property
    def emergency_requested(self) -> bool:
        return self._pending_notice() is not None

    def _pending_notice(self) -> str | None:
        if self._emergency_reason is None and self.notice_file and os.path.exists(self.notice_file):
            if self._notice_event() == "rebalance":
                return None  # at risk, not going: ``_rebalance_due`` saves once
            self._emergency_reason = f"notice file {self.notice_file}"
        return self._emergency_reason

    def _rebalance_due(self) -> bool:
        """A rebalance recommendation in the notice file not yet answered with a save."""
        if self.notice_file is None:
            return False
        try:
            changed = os.stat(self.notice_file).st_mtime_ns
        except OSError:
            return False
        if changed == self._rebalance_seen:
            return False
        self._rebalance_seen = changed
        return self._notice_event() == "rebalance"

    def _notice_event(self) -> str | None:
        """The notice file's event, read again only when the file changed."""
        assert self.notice_file is not None
        try:
            changed = os.stat(self.notice_file).st_mtime_ns
        except OSError:
            return None
        if self._notice_read is None or self._notice_read[0] != changed:
            self._notice_read = (changed, _notice_event(self.notice_file))
        return self._notice_read[1]

    def attach_signals(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> Checkpointer:
        """Turn ``signals`` into emergency-save requests until ``close()``; main thread only."""
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError(
                "attach_signals() must be called from the main thread; from "
                "other threads call request_emergency_save() instead"
            )
        for signum in signals:
            self._old_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request_emergency_save(f"received {signal.Signals(signum).name}")

    def close(self) -> None:
        """Restore the signal handlers that ``attach_signals`` replaced, after the
        background save in flight (if any) has ended: its failure is raised here."""
        try:
            self.wait_for_save()
        finally:
            for signum, handler in self._old_handlers.items():
                signal.signal(signum, handler)
            self._old_handlers.clear()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
            return
        try:  # the loop's own error is the one to raise
            self.close()
        except Exception as error:  # noqa: BLE001 - logged; the original propagates
            log.warning("while closing the checkpointer: %s", error)


def _notice_event(path: str) -> str | None:
    """The ``event`` of the notice file the watcher wrote (``interruption``, ``rebalance``);
    None when it cannot be read as one (then it counts as an interruption, as before)."""
    try:
        doc = json.loads(read_bytes(path, limit=64 << 10, what="notice file"))
    except (OSError, ValueError, RecursionError):
        return None
    event = doc.get("event") if isinstance(doc, dict) else None
    return event if isinstance(event, str) else None


def _check_interval(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number or None, got {value!r}")
