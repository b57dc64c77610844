"""`spot-pipelines watch`: print interruption notices, and pass them on to a command.

Without a command it prints one JSON line per notice until the first interruption
(exit 0). With ``-- CMD ...`` it runs CMD in its own process group, and on an
interruption writes the notice file, sends SIGTERM, and sends SIGKILL if the child
outlives the notice deadline (or ``--grace-seconds``); it exits with the child's code.
SIGTERM to the watcher itself counts as an interruption (that is how Kubernetes and
``spot-pipelines run`` announce one); SIGINT is forwarded, a second one kills.

With ``--heartbeat-timeout`` (default ``$SPOT_HEARTBEAT_TIMEOUT``, which every provider
sets from the job's setting) it also reads the driver's heartbeat from the job's store at
``$SPOT_CHECKPOINT_URI`` (following its pointer into ``$SPOT_HEARTBEAT_URI`` when the
driver keeps one beat for all its jobs); when the beat has not changed for that long (by
this machine's clock, counted from the watcher's start; unreadable counts as unchanged) it prints a
``driver_lost`` event, stops the command exactly as on an interruption, and exits 75
(``DRIVER_LOST_EXIT_CODE``), which ends the lease.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from spot_core import attempt_env
from spot_core.bounds import MAX_WAIT_SECONDS
from spot_core.durations import parse_duration
from spot_core.errors import ConfigError
from spot_core.interruption import InterruptionWatcher, Notice, SignalDetector
from spot_core.interruption.base import Detector
from spot_core.interruption.driver import DriverMonitor
from spot_core.interruption.forward import ChildForwarder, exit_code
from spot_core.interruption.notice_file import check_notice_path, is_notice_file, write_notice
from spot_core.interruption.selection import cloud_choices, detectors_for, normalize_cloud

logger = logging.getLogger(__name__)

TICK = 0.05  # s: the babysitter's step while a kill deadline is armed, or if it
# cannot be woken by the child's exit (no pidfd: not Linux 5.3+)
IDLE_TICK = 0.5  # s: its longest sleep otherwise; the child's exit, a Ctrl-C and a
# notice wake it at once (a watcher per local lease: 0.05 s ticks cost
# about 0.3 % of a core each, doing nothing)


@dataclass(frozen=True)
class WatchSettings:
    cloud: str
    endpoint: str | None
    poll_interval: float
    timeout: float
    notice_file: str | None
    grace_seconds: float | None
    command: tuple[str, ...]
    heartbeat_timeout: float | None = None
    checkpoint_uri: str | None = None
    attempt: int | None = None
    report: bool = False
    heartbeat_uri: str | None = None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="watch for spot interruption notices (and forward them to a command)",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument(
        "--cloud", help=f"{'|'.join(cloud_choices())} (default: ${attempt_env.CLOUD} or auto)"
    )
    parser.add_argument(
        "--endpoint",
        help=f"metadata service URL (default: ${attempt_env.METADATA_ENDPOINT} or the cloud's own)",
    )
    parser.add_argument(
        "--poll-interval", default="1.0", metavar="S", help="seconds between polls (default 1)"
    )
    parser.add_argument(
        "--timeout",
        default="1.0",
        metavar="S",
        help="seconds each metadata request may take (default 1)",
    )
    parser.add_argument(
        "--notice-file",
        metavar="PATH",
        help="where to write the notice "
        f"(default: ${attempt_env.NOTICE_FILE}, or a temp file for CMD)",
    )
    parser.add_argument(
        "--grace-seconds",
        metavar="S",
        help="SIGKILL the command this long "
        "after the notice if it is still running (default: the deadline)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        metavar="DURATION",
        help="with CMD: stop it "
        "(as on an interruption) and exit 75 when the driver's heartbeat in "
        f"${attempt_env.CHECKPOINT_URI} has not changed for this long, e.g. "
        f"300, 90s or 5m (default: ${attempt_env.HEARTBEAT_TIMEOUT}; unset: "
        "never)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="with CMD: write the attempt's "
        f"status object (notice time, exit code) to the store at "
        f"${attempt_env.CHECKPOINT_URI} at the first notice and at the end, "
        "for the controller (a pod's node may vanish with it)",
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    detectors = _detectors(settings)
    try:
        if settings.command:
            return _supervise(settings, detectors)
        return _watch(settings, detectors)
    finally:
        for detector in detectors:
            getattr(detector, "close", lambda: None)()


def settings_from_args(args: argparse.Namespace) -> WatchSettings:
    """Validate everything up front, so a typo is one line on stderr, not a traceback."""
    command = list(args.cmd or [])
    if command[:1] == ["--"]:
        command = command[1:]
    grace = args.grace_seconds
    timeout = _heartbeat_timeout(args.heartbeat_timeout, bool(command))
    uri = os.environ.get(attempt_env.CHECKPOINT_URI) or None
    if getattr(args, "report", False) and (uri is None or not command):
        raise ConfigError(
            f"--report needs a command after -- and the job's store in "
            f"${attempt_env.CHECKPOINT_URI}; set it, or drop --report"
        )
    if timeout is not None and uri is None:
        raise ConfigError(
            f"--heartbeat-timeout needs the job's store in "
            f"${attempt_env.CHECKPOINT_URI} (the driver's heartbeat lives "
            "there); set it, or drop the timeout"
        )
    attempt = os.environ.get(attempt_env.ATTEMPT)
    drivers = os.environ.get(attempt_env.HEARTBEAT_URI) or None
    if drivers is not None:
        from spot_core.checkpoint.uri import parse_store_uri

        parse_store_uri(drivers)  # a bad one is a line on stderr, not a silent lost driver
    return WatchSettings(
        cloud=normalize_cloud(args.cloud or os.environ.get(attempt_env.CLOUD) or "auto"),
        endpoint=args.endpoint,
        poll_interval=_seconds("--poll-interval", args.poll_interval, "e.g. 1"),
        timeout=_seconds("--timeout", args.timeout, "e.g. 1"),
        notice_file=_notice_file(args.notice_file),
        grace_seconds=None
        if grace is None
        else _seconds("--grace-seconds", grace, "e.g. 30", allow_zero=True),
        command=tuple(command),
        heartbeat_timeout=timeout,
        checkpoint_uri=uri,
        attempt=attempt_env.attempt_number(attempt) if attempt else None,
        report=bool(getattr(args, "report", False)),
        heartbeat_uri=drivers,
    )


def _notice_file(flag: str | None) -> str | None:
    """The flag's path, else the environment's; never one holding a user's file."""
    if flag:
        return check_notice_path(flag)
    env = os.environ.get(attempt_env.NOTICE_FILE)
    return check_notice_path(env, f"${attempt_env.NOTICE_FILE}") if env else None


def _heartbeat_timeout(text: str | None, has_command: bool) -> float | None:
    """The flag (seconds or 90s/5m/1h), else the environment's; only with a command."""
    if text is None:
        return (
            attempt_env.heartbeat_seconds(os.environ.get(attempt_env.HEARTBEAT_TIMEOUT))
            if has_command
            else None
        )
    try:
        value = parse_duration(text, name="--heartbeat-timeout")
    except ConfigError:
        value = 0.0
    if not 0 < value <= MAX_WAIT_SECONDS:
        raise ConfigError(
            f"--heartbeat-timeout {text[:40]!r} is not a duration > 0 and at "
            "most 1d; write it like 300, 90s or 5m"
        )
    if not has_command:
        raise ConfigError(
            "--heartbeat-timeout stops a command: put it after --, e.g. "
            "`spot-pipelines watch --heartbeat-timeout 5m -- python train.py`"
        )
    return value


def _seconds(option: str, text: str, example: str, allow_zero: bool = False) -> float:
    """Seconds from 0 (or above) to a day: every wait here is a thread's, and a thread
    cannot wait 1e300 s (its watcher thread died of it, and a later notice was lost)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if (
        not math.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
        or value > MAX_WAIT_SECONDS
    ):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(
            f"{option} must be a number of seconds {bound} and at most "
            f"{MAX_WAIT_SECONDS:g} (1d), got {str(text)[:40]!r}: "
            f"use {option} {example.removeprefix('e.g. ')}"
        )
    return value


def _detectors(settings: WatchSettings) -> list[Detector]:
    """The cloud's detectors (a pod's: its node and its cloud's metadata), plus SIGTERM."""
    return detectors_for(settings.cloud, settings.endpoint, timeout=settings.timeout)


def _print_event(notice: Notice) -> None:
    try:
        print(notice.to_json(), flush=True)
    except OSError as exc:  # stdout closed: the notice still reaches the child
        logger.warning("could not print event: %s", exc)


def _watch(settings: WatchSettings, detectors: list[Detector]) -> int:
    """No command: print events until the first interruption (bounded waits, Ctrl-C ends)."""
    watcher = InterruptionWatcher(detectors, settings.poll_interval)
    watcher.add_handler(_print_event)
    notice_file = settings.notice_file
    if notice_file:
        watcher.add_handler(lambda notice: write_notice(notice_file, notice))
    with watcher:
        while watcher.wait(timeout=1.0) is None:
            pass
    return 0


def _supervise(settings: WatchSettings, detectors: list[Detector]) -> int:
    notice_file, scratch = _notice_path(settings.notice_file)
    monitor = _driver_monitor(settings)  # its clock starts before the step does
    try:
        # SIGINT is collected from before the child exists: a Ctrl-C that arrives while
        # the watcher is still setting up is forwarded, never swallowed
        with _ForwardSigint() as sigint:
            child = _spawn(settings.command, notice_file)
            forwarder = ChildForwarder(child, notice_file, settings.grace_seconds)
            watcher = InterruptionWatcher(detectors, settings.poll_interval)
            reporter = _Reporter(detectors) if settings.report else None
            watcher.add_handler(_print_event)
            if reporter is not None:  # before the step hears of it: the node may not wait
                watcher.add_handler(reporter.on_notice)
            watcher.add_handler(forwarder.on_notice)
            wake = _Wake(child)
            watcher.add_handler(lambda notice: wake.set())  # the kill deadline is armed now
            with wake, watcher, sigint.waking(wake):
                returncode = _babysit(forwarder, sigint, wake, monitor)
            code = (
                attempt_env.DRIVER_LOST_EXIT_CODE
                if monitor is not None and monitor.lost is not None
                else exit_code(returncode)
            )
            if reporter is not None:  # before stopping the watcher: SIGKILL may be near
                reporter.finish(code)
        return code
    finally:
        if monitor is not None:
            monitor.stop()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _driver_monitor(settings: WatchSettings) -> DriverMonitor | None:
    """Started only with a heartbeat timeout: without one the store is never read."""
    if settings.heartbeat_timeout is None:
        return None
    if settings.checkpoint_uri is None:  # _settings refuses a timeout without a store
        raise ConfigError(
            f"--heartbeat-timeout needs the job's store in ${attempt_env.CHECKPOINT_URI}"
        )
    from spot_core.checkpoint.uri import parse_store_uri

    parse_store_uri(settings.checkpoint_uri)  # a bad one fails here, before the step starts
    return DriverMonitor(
        _heartbeat_reader(settings.checkpoint_uri, settings.heartbeat_uri),
        settings.heartbeat_timeout,
        attempt=settings.attempt,
        handover_from=attempt_env.AttemptEnv.from_environ().handover_from,
    ).start()


def _heartbeat_reader(checkpoint_uri: str, heartbeat_uri: str | None) -> Callable[[], Any]:
    """``Heartbeat.read`` with the stores opened at the first read, on the monitor's thread:
    opening an S3 store imports boto3 and builds a client (about 0.4 s on a small machine),
    which would otherwise delay the step's start, and with it a handover's resume."""
    opened: list[Any] = []

    def read() -> Any:
        if not opened:
            from spot_core.checkpoint import open_store
            from spot_core.checkpoint.heartbeat import Heartbeat

            drivers = None if heartbeat_uri is None else open_store(heartbeat_uri)
            opened.append(Heartbeat(open_store(checkpoint_uri), drivers))
        return opened[0].read()

    return read


def _notice_path(configured: str | None) -> tuple[str, str | None]:
    """(notice file, scratch dir to delete); a stale notice from a past run is removed."""
    if configured:
        if is_notice_file(configured):  # checked at start: a user's file never gets here
            Path(configured).unlink(missing_ok=True)
        return configured, None
    scratch = tempfile.mkdtemp(prefix="spot-notice-")
    return os.path.join(scratch, "notice.json"), scratch


def _spawn(command: tuple[str, ...], notice_file: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, attempt_env.NOTICE_FILE: notice_file}
    try:
        return subprocess.Popen(list(command), env=env, start_new_session=True)
    except (FileNotFoundError, PermissionError) as exc:
        raise ConfigError(
            f"cannot run {command[0]!r}: {exc.strerror}; check the command after --"
        ) from exc


def _babysit(
    forwarder: ChildForwarder,
    sigint: _ForwardSigint,
    wake: _Wake,
    monitor: DriverMonitor | None = None,
) -> int:
    """Until the child exits: forward Ctrl-C, stop it when the driver is lost, SIGKILL
    past the deadline. Then its code."""
    try:
        while (returncode := forwarder.poll()) is None:
            sigint.forward(forwarder)
            _check_driver(monitor, forwarder)
            forwarder.enforce()
            idle = wake.wakes_on_exit and forwarder.kill_at is None
            wake.wait(IDLE_TICK if idle else TICK)
        return returncode
    finally:
        if forwarder.poll() is None:  # we are leaving abnormally: leave no orphan
            forwarder.signal(signal.SIGKILL)
            forwarder.child.wait(timeout=5)


def _check_driver(monitor: DriverMonitor | None, forwarder: ChildForwarder) -> None:
    """On the first stale verdict: print the event and stop the step as a notice would."""
    if monitor is None or monitor.lost is not None:
        return
    notice = monitor.expired()
    if notice is not None:
        _print_event(notice)
        forwarder.on_notice(notice)


class _Reporter:
    """The attempt's status object (``spot_core.checkpoint.status``): the first interruption
    notice at once, the exit code at the end. Failures are logged, never fatal."""

    def __init__(self, detectors: list[Detector]) -> None:
        self.notice_at: float | None = None
        self.reclaim_at: float | None = None
        self._signals = [d for d in detectors if isinstance(d, SignalDetector)]

    def on_notice(self, notice: Notice) -> None:
        if not notice.is_interruption or self.notice_at is not None:
            return
        self.notice_at, self.reclaim_at = notice.detected_at, notice.deadline
        self._write(None, None)

    def finish(self, code: int) -> None:
        """The exit code; a SIGTERM that ended the step before the watcher's next poll
        still counts as its notice (the kubelet's, or a machine shutting down)."""
        now = time.time()
        for detector in self._signals:
            for notice in detector.poll(now):
                if self.notice_at is None:
                    self.notice_at = notice.detected_at
        self._write(code, now)

    def _write(self, code: int | None, ended_at: float | None) -> None:
        from spot_core.checkpoint.status import write_report

        try:
            write_report(
                exit_code=code,
                notice_at=self.notice_at,
                ended_at=ended_at,
                reclaim_at=self.reclaim_at,
            )
        except Exception as exc:  # noqa: BLE001 - the report only sharpens the outcome
            logger.warning("could not write the attempt's status report: %s", exc)


class _Wake:
    """What the babysitter sleeps on: the child's exit (a pidfd, where Linux has one) or
    ``set()`` (a Ctrl-C, a notice), whichever comes first; else the timeout."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(child.pid)
        except (AttributeError, OSError):  # not Linux 5.3+, or the child is already reaped
            pass
        self.wakes_on_exit = self._pidfd is not None
        self._poll = select.poll()  # not select(): no limit on the fds' numbers
        for fd in (self._read, self._pidfd):
            if fd is not None:
                self._poll.register(fd, select.POLLIN)

    def set(self) -> None:
        """Wake the sleeper (safe from a signal handler and from any thread)."""
        try:
            os.write(self._write, b"x")
        except (BlockingIOError, OSError):  # already pending, or closed on the way out
            pass

    def wait(self, timeout: float) -> None:
        ready = {fd for fd, _ in self._poll.poll(timeout * 1000)}
        if self._read in ready:
            os.read(self._read, 4096)

    def __enter__(self) -> _Wake:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in (self._read, self._write, self._pidfd):
            if fd is not None:
                os.close(fd)
        self._pidfd = None


class _ForwardSigint:
    """Collects SIGINTs (the handler only appends and wakes: no locks in signal context)."""

    def __init__(self) -> None:
        self._pending: collections.deque[int] = collections.deque()
        self._count = 0
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None
        self._wake: _Wake | None = None

    @contextlib.contextmanager
    def waking(self, wake: _Wake) -> Iterator[None]:
        """Wake ``wake`` on every SIGINT while inside (at once for one already collected);
        detached before ``wake`` closes its pipe."""
        self._wake = wake
        if self._pending:
            wake.set()
        try:
            yield
        finally:
            self._wake = None

    def __enter__(self) -> _ForwardSigint:
        self._previous = signal.signal(signal.SIGINT, self._collect)
        return self

    def _collect(self, signum: int, frame: object) -> None:
        self._pending.append(signum)
        wake = self._wake
        if wake is not None:
            wake.set()

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)

    def forward(self, forwarder: ChildForwarder) -> None:
        """First Ctrl-C goes to the child as SIGINT; any further one is SIGKILL."""
        while self._pending:
            self._pending.popleft()
            self._count += 1
            forwarder.signal(signal.SIGINT if self._count == 1 else signal.SIGKILL)


if __name__ == "__main__":
    from spot_core.cli import main

    sys.exit(main(["watch", *sys.argv[1:]]))
