"""`spot-pipelines run`: one job under the controller, from the command line.

Like ``sky jobs launch`` for any command that uses the Checkpointer: the command runs on
spot capacity, is relaunched from its latest checkpoint after each preemption, moves to
on-demand when the preemption budget is spent or spot capacity runs out, and the
JobRecord summary is printed at the end. Every lease is terminated on every exit path.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from spot_core import jobs
from spot_core.commands.flags import add_cli_arguments, in_flags, settings_from_cli
from spot_core.commands.text import event_line
from spot_core.errors import ConfigError
from spot_core.settings import SpotSettings

if TYPE_CHECKING:
    from rich.console import Console

    from spot_core.model import JobRecord


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("run", help="run one command as a spot job under the controller")
    parser.add_argument(
        "--pools",
        default=None,
        help="comma-separated zones or trace names to "
        "run in (default: every pool the provider knows)",
    )
    # Budgets, waits, timeouts and the deadline policy: flags, defaults and help come
    # from the settings model (spot_core.settings), like every other surface's.
    add_cli_arguments(parser)
    parser.add_argument(
        "--no-fallback",
        dest="on_demand_fallback",
        action="store_false",
        default=None,
        help="the same as --no-on-demand-fallback",
    )
    parser.add_argument(
        "--checkpoint-uri",
        default=None,
        help="where the job checkpoints (default: file://./.spot-runs/JOB_ID/checkpoints)",
    )
    parser.add_argument("--job-id", default=None, help="job id (default: generated)")
    parser.add_argument("--json", action="store_true", help="end with the JobRecord as JSON")
    # Each installed provider's own flags (--trace, --subnets, --kubeconfig, ...), declared
    # by its plugin: one group per plugin class, whatever names it is registered under.
    added: set[type] = set()
    for name in jobs.provider_names():
        found = jobs.provider_plugin(name)
        if type(found) not in added:
            added.add(type(found))
            found.add_cli_arguments(parser)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from spot_core.observer import observer_of
    from spot_core.report import print_record
    from spot_core.stopping import stop_on_signals

    settings = _settings(args)
    plugin = jobs.provider_plugin(settings.provider)
    # A provider whose leases run the command in an image (kubernetes) need not find it here.
    command = _command(
        args.cmd,
        in_image=settings.image is not None
        or jobs.Capability.COMMAND_IN_IMAGE in plugin.capabilities,
    )
    # Given but empty is a mistake (a script's unset variable), never "no job id".
    job_id = f"job-{uuid.uuid4().hex[:8]}" if args.job_id is None else args.job_id
    _check_job_id(job_id)
    wanted = _pool_names(args.pools)
    options = plugin.cli_options(args)
    problem = plugin.store_problem(args.checkpoint_uri, options, what="--checkpoint-uri")
    if problem is not None:
        raise ConfigError(problem)
    # With --json, stdout carries the record alone (`run --json > record.json`): the
    # events and the table go to stderr.
    human = sys.stderr if args.json else sys.stdout
    # SIGINT, SIGTERM and SIGHUP stop the job at the driver's next wait, never inside a
    # client call (spot_core.stopping); a second one stops it at once.
    # closing(): every provider's context exit is its close() (the Provider protocol's)
    with stop_on_signals(), contextlib.closing(plugin.open_for_cli(args, options)) as provider:
        _warn_short_deadline(args.deadline, settings, provider.market.time_scale)
        pools = jobs.select_pools(provider, names=wanted, aliases=plugin.pool_aliases(provider))
        try:  # the settings' time convention: --deadline, --work and --restart-overhead
            # count in the provider's capacity time; the checkpoint folder is made last,
            # after every check, so a bad flag leaves none
            controller = jobs.assemble(
                settings, provider, listener=functools.partial(_print_event, human)
            )
            spec = jobs.job_spec(
                settings,
                provider,
                job_id=job_id,
                command=command,
                checkpoint_uri=lambda: _checkpoint_uri(args.checkpoint_uri, job_id),
                pools=pools,
                image=settings.image,
            )
        except ConfigError as exc:
            raise ConfigError(in_flags(str(exc))) from None
        record = controller.run(spec, observer=observer_of(provider))
        # before the provider closes: a local lease's log goes with the cloud's temp folder
        record, kept = keep_step_output(record, Path.cwd() / ".spot-runs" / job_id / "logs")
    print_record(record, provider.market.time_scale, console=_console(human))
    if kept is not None:
        print(f"step output: {kept}/ (one log per attempt)", file=human, flush=True)
    if args.json:
        print(record.to_json(), flush=True)
    return 0 if str(record.status) == "succeeded" else 1


def _console(stream: TextIO) -> Console:
    from rich.console import Console

    return Console(file=stream, highlight=False, width=120)


WALL_SECONDS_WARNED = 60.0


def _warn_short_deadline(text: str | None, settings: SpotSettings, time_scale: float) -> None:
    """One line on stderr when a --deadline duration gives the step under a minute of wall
    time: on the local cloud (1 trace hour per wall second) `--deadline 12h` is 12 s, which
    ends any real step as deadline_missed. A warning, not a refusal: a test or a demo
    replaying a trace fast means it."""
    capacity = settings.deadline_capacity_seconds
    if capacity is None or settings.deadline_at is not None or time_scale <= 1:
        return
    wall = capacity / time_scale
    if wall >= WALL_SECONDS_WARNED:
        return
    slower = max(1.0, time_scale * wall / (15 * 60))  # the same deadline as ~15 wall minutes
    print(
        f"spot-pipelines run: warning: --deadline {text} is {wall:.3g} s of wall time here "
        f"(this provider replays {time_scale:g} s of capacity time per wall second); for a "
        f"real step pass --time-scale {_round_scale(time_scale / slower)} or a longer --deadline",
        file=sys.stderr,
        flush=True,
    )


def _round_scale(scale: float) -> str:
    """A time scale a person would type (60, not 57.6)."""
    for nice in (3600, 600, 60, 10, 1):
        if scale >= nice:
            return str(nice)
    return "1"


def keep_step_output(record: JobRecord, folder: Path) -> tuple[JobRecord, Path | None]:
    """The record with each attempt's step log copied to ``folder/attempt-N.log`` and
    pointed at there, and the folder (None when no attempt had a local log): a provider's
    lease log may live in a folder it removes when it closes (the local cloud's), and a
    record that points at a deleted file keeps nothing of the step's own output."""
    attempts, kept = [], None
    for attempt in record.attempts:
        details = dict((attempt.lease or {}).get("details") or {})
        source = Path(str(details.get("log", "")))
        if not details.get("log") or not source.is_file():
            attempts.append(attempt)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"attempt-{attempt.number}.log"
        shutil.copyfile(source, target)
        lease = {**(attempt.lease or {}), "details": {**details, "log": str(target)}}
        attempts.append(dataclasses.replace(attempt, lease=lease))
        kept = folder
    return dataclasses.replace(record, attempts=tuple(attempts)), kept


def _settings(args: argparse.Namespace) -> SpotSettings:
    """The flags checked by the settings model; an ISO ``--deadline`` already past is
    refused here, before anything is created."""
    settings = settings_from_cli(args)
    if settings.deadline_at is not None and settings.deadline_at.timestamp() <= time.time():
        raise ConfigError(
            f"--deadline {args.deadline} has already passed; give a later time "
            "or a duration such as 12h"
        )
    return settings


def _print_event(stream: TextIO, kind: str, record: JobRecord, detail: str) -> None:
    attempt = record.attempts[-1] if record.attempts else None
    where = "" if attempt is None else f"attempt {attempt.number} {attempt.pool.key}"
    heading = f"{dt.datetime.now():%H:%M:%S} {kind:<20} {where}"
    print(event_line(heading, detail), file=stream, flush=True)


def _command(words: list[str], in_image: bool = False) -> tuple[str, ...]:
    command = words[1:] if words[:1] == ["--"] else words
    if not command:
        raise ConfigError(
            "no command to run: put it after --, e.g. `spot-pipelines run -- python train.py`"
        )
    if in_image:  # the command lives in the image, not on this machine
        return tuple(command)
    if shutil.which(command[0]) is None and not os.access(command[0], os.X_OK):
        raise ConfigError(
            f"command {command[0]!r} was not found on PATH and is not an "
            "executable file; check the command after --"
        )
    return tuple(command)


def _checkpoint_uri(uri: str | None, job_id: str) -> str:
    from spot_core.checkpoint import open_store, parse_store_uri

    _check_job_id(job_id)
    if uri is None:
        uri = (Path.cwd() / ".spot-runs" / job_id / "checkpoints").as_uri()
    location = parse_store_uri(uri)  # validates the form; raises ConfigError naming the fix
    if location.scheme == "file":  # the decoded path: file://localhost/x and %20 included
        _check_writable(Path(location.path))
    open_store(uri)
    return uri


JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+=@-]{0,127}")


def _check_job_id(job_id: str) -> None:
    """The id names a folder under .spot-runs/ (and tags leases): a plain name, nothing
    that could climb out of that folder or break a path."""
    if not JOB_ID_RE.fullmatch(job_id):
        raise ConfigError(
            f"--job-id {job_id[:80]!r} is not a plain name; use 1-128 letters, "
            "digits and . _ : + = @ - starting with a letter or digit (no '/', "
            "'..' or control characters)"
        )


def _check_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"checkpoint folder {path} is not writable ({exc.strerror}); pass "
            "--checkpoint-uri with a folder you can write to"
        ) from exc


def _pool_names(text: str | None) -> list[str] | None:
    """``--pools`` as names; None when not given. Given but naming nothing is an error,
    never "no pools" (which would only wait, bounded but pointlessly, for capacity)."""
    if text is None:
        return None
    wanted = [w.strip() for w in text.split(",") if w.strip()]
    if not wanted:
        raise ConfigError(
            f"--pools {text!r} names no pool; give comma-separated zones such "
            "as us-east-2a,us-west-2b, or drop --pools to use every pool"
        )
    return wanted


def record_json(record: JobRecord) -> str:
    return json.dumps(record.summary(), allow_nan=False)
