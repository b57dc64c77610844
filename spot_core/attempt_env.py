"""Environment variables through which a launched step learns about its attempt.

A provider sets these on the step's process; the step's Checkpointer and the
interruption watcher read them. Nothing the next attempt needs lives on the node.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

from spot_core.bounds import MAX_ATTEMPT, MAX_WAIT_SECONDS
from spot_core.errors import CheckpointError, ConfigError, Preempted, SpotError

CHECKPOINT_URI = "SPOT_CHECKPOINT_URI"
JOB_ID = "SPOT_JOB_ID"
ATTEMPT = "SPOT_ATTEMPT"
METADATA_ENDPOINT = "SPOT_METADATA_ENDPOINT"
CLOUD = "SPOT_CLOUD"
NOTICE_FILE = "SPOT_NOTICE_FILE"
# Seconds the node's watcher lets the step run without a renewed driver heartbeat.
HEARTBEAT_TIMEOUT = "SPOT_HEARTBEAT_TIMEOUT"
# Where the driver keeps one heartbeat for all the jobs it watches (the heartbeat_uri
# setting): the node's watcher follows the job's pointer there. Unset: the job's own store.
HEARTBEAT_URI = "SPOT_HEARTBEAT_URI"
# Wall seconds between the step's time-based checkpoints, chosen by the controller for the
# attempt's pool; ``Checkpointer.from_env`` uses it unless the step asks for another.
CHECKPOINT_INTERVAL = "SPOT_CHECKPOINT_INTERVAL"
# A replacement launched on its predecessor's notice (the handover setting): the attempt it
# replaces, and the POSIX time by which that attempt's capacity is gone. The replacement
# prefetches, waits for that attempt's emergency checkpoint (or its end, or this time),
# and only then fences the store and restores (``spot_core.checkpoint.handover``).
HANDOVER_FROM = "SPOT_HANDOVER_FROM"
HANDOVER_DEADLINE = "SPOT_HANDOVER_DEADLINE"


@dataclass(frozen=True)
class AttemptEnv:
    checkpoint_uri: str | None
    job_id: str | None
    attempt: int
    metadata_endpoint: str | None
    cloud: str | None
    notice_file: str | None
    heartbeat_timeout: float | None = None
    checkpoint_interval: float | None = None
    heartbeat_uri: str | None = None
    handover_from: int | None = None
    handover_deadline: float | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> AttemptEnv:
        env = os.environ if environ is None else environ
        return cls(
            checkpoint_uri=env.get(CHECKPOINT_URI) or None,
            job_id=env.get(JOB_ID) or None,
            attempt=attempt_number(env.get(ATTEMPT)),
            metadata_endpoint=env.get(METADATA_ENDPOINT) or None,
            cloud=env.get(CLOUD) or None,
            notice_file=env.get(NOTICE_FILE) or None,
            heartbeat_timeout=heartbeat_seconds(env.get(HEARTBEAT_TIMEOUT)),
            checkpoint_interval=positive_seconds(
                env.get(CHECKPOINT_INTERVAL), CHECKPOINT_INTERVAL, example="600"
            ),
            heartbeat_uri=env.get(HEARTBEAT_URI) or None,
            handover_from=None
            if not env.get(HANDOVER_FROM)
            else attempt_number(env.get(HANDOVER_FROM)),
            handover_deadline=posix_time(env.get(HANDOVER_DEADLINE), HANDOVER_DEADLINE),
        )

    def to_environ(self) -> dict[str, str]:
        pairs = {
            CHECKPOINT_URI: self.checkpoint_uri,
            JOB_ID: self.job_id,
            ATTEMPT: str(self.attempt),
            METADATA_ENDPOINT: self.metadata_endpoint,
            CLOUD: self.cloud,
            NOTICE_FILE: self.notice_file,
            HEARTBEAT_TIMEOUT: None
            if self.heartbeat_timeout is None
            else f"{self.heartbeat_timeout:g}",
            CHECKPOINT_INTERVAL: None
            if self.checkpoint_interval is None
            else f"{self.checkpoint_interval:.6g}",
            HEARTBEAT_URI: self.heartbeat_uri,
            HANDOVER_FROM: None if self.handover_from is None else str(self.handover_from),
            HANDOVER_DEADLINE: None
            if self.handover_deadline is None
            else f"{self.handover_deadline:.3f}",
        }
        return {k: v for k, v in pairs.items() if v is not None}


# A step that saved its emergency checkpoint and stopped on a notice exits like a process
# ended by SIGTERM (128 + 15), which is what a shell or an engine would report anyway.
PREEMPTED_EXIT_CODE = 143

# `spot-pipelines watch` stopped the step because the driver's heartbeat went stale (the
# process that watched the lease is gone): EX_TEMPFAIL from sysexits.h, "try again later",
# which is what a re-run of the job does. No other exit path of the project uses it.
DRIVER_LOST_EXIT_CODE = 75


# The step could not reach what the node depends on (its checkpoint store stayed down
# through the client's own retries): EX_IOERR from sysexits.h. The controller classifies it
# as ``infrastructure_failed``, so a store outage spends the infrastructure budget, never
# the user's retries. A step's own code should not exit 74 for its own errors.
INFRASTRUCTURE_EXIT_CODE = 74


def step_exit_code(exc: BaseException) -> int | None:
    """The exit code a step ends with for ``exc``, when it is not the step's own fault:
    143 for a preemption, 74 for a failure of the infrastructure (an error whose outcome
    is ``infrastructure_failed``: a full, read-only or unreachable store, retryable or
    not; or any retryable store error); None for anything else (the step's own error)."""
    if isinstance(exc, Preempted):
        return PREEMPTED_EXIT_CODE
    if isinstance(exc, SpotError) and (
        exc.outcome == "infrastructure_failed"
        or (exc.retryable and isinstance(exc, CheckpointError))
    ):
        return INFRASTRUCTURE_EXIT_CODE
    return None


def report_step_exit(exc: SpotError) -> int:
    """The exit code for ``exc`` (``step_exit_code``), after one JSON line on stdout saying
    why (``{"preempted": true, ...}`` or ``{"infrastructure_failed": true, ...}``), the
    line the step's driver and logs show, and for an infrastructure failure one line on
    stderr too (``error: ...``: where a user looks first, never a traceback); re-raises
    ``exc`` when it is the step's own error, so its traceback reaches the user."""
    code = step_exit_code(exc)
    if code is None:
        raise exc
    kind = "preempted" if code == PREEMPTED_EXIT_CODE else "infrastructure_failed"
    print(json.dumps({kind: True, "reason": str(exc)}), flush=True)
    if code == INFRASTRUCTURE_EXIT_CODE:
        reason = " ".join(str(exc).split())
        print(
            f"error: infrastructure failure, not the step's (exit {code}): {reason}",
            file=sys.stderr,
            flush=True,
        )
    return code


def install_step_excepthook() -> None:
    """Make an uncaught preemption or infrastructure failure end this step as
    ``report_step_exit`` would: its exit code (143, 74) and its one line, never a
    traceback and exit 1 (which the controller reads as the step's own failure, spending
    a user retry). For a user's own loop around the ``Checkpointer``, which need not catch
    ``Preempted`` or a store gone read-only itself; ``Checkpointer.from_env`` installs it.
    Anything else goes to the hook that was there. Installed once per process."""
    previous = sys.excepthook
    if getattr(previous, "spot_step_hook", False):
        return

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(exc, SpotError) or step_exit_code(exc) is None:
            previous(kind, exc, tb)
            return
        code = report_step_exit(exc)
        logging.shutdown()  # os._exit skips atexit: flush the step's own log handlers
        sys.stdout.flush()
        sys.stderr.flush()
        # sys.exit is ignored inside an excepthook (Python prints it and exits 1)
        os._exit(code)

    hook.spot_step_hook = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def exit_ignoring_notices(code: int) -> None:
    """Exit with ``code``, ignoring a notice from here on: Python resets its handlers to
    the default during finalization, and a SIGTERM then would turn a finished step into
    a killed one (the work is done and recorded; there is nothing left to save)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(code)


def attempt_number(text: str | None) -> int:
    """``$SPOT_ATTEMPT`` as a whole number from 1 to ``MAX_ATTEMPT``; unset or empty: 1
    (a step run by hand)."""
    if text is None or not str(text).strip():
        return 1
    value = str(text).strip()
    if value.isascii() and value.isdigit() and len(value) <= 7 and 1 <= int(value) <= MAX_ATTEMPT:
        return int(value)
    raise ConfigError(
        f"{ATTEMPT}={str(text)[:40]!r} is not an attempt number from 1 to "
        f"{MAX_ATTEMPT:,}; spot-pipelines sets it for each attempt (unset it "
        "to run a step by hand as attempt 1)"
    )


def heartbeat_seconds(text: str | None) -> float | None:
    """``$SPOT_HEARTBEAT_TIMEOUT`` as seconds > 0; empty means no heartbeat check."""
    return positive_seconds(text, HEARTBEAT_TIMEOUT, example="300")


def positive_seconds(text: str | None, variable: str, *, example: str) -> float | None:
    """An environment variable holding seconds > 0 and at most a day (what the settings
    allow: a thread cannot wait 1e300 s); empty or unset means None."""
    if text is None or not str(text).strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= MAX_WAIT_SECONDS:
        raise ConfigError(
            f"{variable}={str(text)[:40]!r} is not a number of seconds > 0 "
            f"and at most {MAX_WAIT_SECONDS:g} (1d); set it like "
            f"{variable}={example} or unset it"
        )
    return value


def posix_time(text: str | None, variable: str) -> float | None:
    """An environment variable holding a POSIX time (seconds, finite, >= 0); empty or unset
    means None."""
    if text is None or not str(text).strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"{variable}={str(text)[:40]!r} is not a POSIX time in seconds; spot-pipelines "
            "sets it for a handover (unset it to run a step by hand)"
        )
    return value


# -- why an attempt ended, in words ---------------------------------------------------------
# A lease's log tail is what a provider has to say why an attempt ended, but its lines are
# written for machines (the watcher's JSON events, the step's ``{"preempted": true, ...}``
# line) or are forwarded log records. An attempt's reason is read by a person (the run's
# table, the Airflow and Prefect pages), so it is put in words here, once for every
# provider.
_LOG_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?\s+"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+[\w.]+:\s*(?P<message>.*)$"
)
_EVENT_WORDS = {
    "interruption": "the {cloud} spot interruption notice ({action}, capacity gone at {deadline})",
    "rebalance": "the {cloud} rebalance recommendation (capacity at risk)",
    "driver_lost": "the driver's heartbeat went stale, so the node's watcher stopped the step",
}
REASON_MAX_CHARS = 300


def readable_reason(text: str) -> str:
    """Why an attempt ended, as a sentence, from a provider's message or a log's tail.

    In order of preference: the ``reason`` of the step's own JSON line; the watcher's
    newest event in words; the newest plain line (a traceback's last line); the message
    of a forwarded log record, without its time, level and logger. Text that is none of
    these is returned whole, on one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [_said(line) for line in reversed(lines)]
    for kind in ("reason", "event", "plain", "log"):
        found = next((words for how, words in said if how == kind and words), None)
        if found:
            return clip(found)
    return clip(" ".join(text.split()))


def _said(line: str) -> tuple[str, str]:
    """(what kind of line, its words) for one line of a log tail."""
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except ValueError:
            return "plain", line
        if isinstance(obj, dict):
            return _said_json(obj)
    record = _LOG_RECORD.match(line)
    if record:
        return "log", record["message"]
    return "plain", line


def _said_json(obj: dict[str, object]) -> tuple[str, str]:
    if isinstance(obj.get("reason"), str) and obj["reason"]:
        return "reason", " ".join(str(obj["reason"]).split())
    template = _EVENT_WORDS.get(str(obj.get("event")))
    if template is not None:
        values = {k: obj.get(k) or "unknown" for k in ("cloud", "action", "deadline")}
        return "event", template.format(**values)
    return "log", ""  # some other JSON: not words for a person


def clip(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """``text`` on one line, cut at ``limit`` characters with an ellipsis that says so
    (never silently, never mid-word where a space is near)."""
    one = " ".join(text.split())
    if len(one) <= limit:
        return one
    cut = one[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit * 0.8 else cut).rstrip() + "…"
