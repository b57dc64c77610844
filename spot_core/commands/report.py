"""`spot-pipelines report RECORD.json [--html FILE]`: a JobRecord as tables and charts.

RECORD.json is the JobRecord JSON that `spot-pipelines run --json` ends with (its whole
output works too: the last line is the record), the demo's `record.json`, or a record
read out of Airflow's XCom or a Prefect artifact; `-` reads standard input. The tables go
to the terminal; ``--html FILE`` also writes one self-contained page with the SVG charts.
The page replaces a regular file only, never RECORD.json itself (``spot_core.safe_files``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spot_core.errors import ConfigError
from spot_core.model import JobRecord
from spot_core.safe_files import check_target, read_stream, read_text, write_bytes

# A record of 100 attempts is 50 KB; `run --json`'s whole output with its event lines
# stays far below this. More is not a record, and is never read into memory.
MAX_RECORD_BYTES = 64 << 20


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="show a JobRecord (from `run --json`) as tables, and as an HTML page with SVG charts",
    )
    parser.add_argument(
        "record",
        metavar="RECORD.json",
        help="the JobRecord JSON (`run --json` output), or - for stdin",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write a self-contained HTML page (tables and charts)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from spot_core.report import html_page, print_record

    inputs = [0] if args.record == "-" else [args.record]
    if args.html is not None:  # before reading: a page that may not be written is one line
        check_target(args.html, inputs=inputs, what="--html")
    record = read_record(args.record)
    page = html_page(record) if args.html is not None else None
    print_record(record)
    if page is not None:
        write_bytes(args.html, page, inputs=inputs, what="--html")
        print(f"wrote {args.html}", flush=True)
    return 0


def read_record(source: str) -> JobRecord:
    """The record in ``source`` (a path or ``-``): a JSON object, or text whose last
    non-empty line is one (`run --json`'s whole output)."""
    text = _read_stdin() if source == "-" else _read_file(source)
    where = "standard input" if source == "-" else source
    if not text.strip():
        raise ConfigError(
            f"{where} is empty; pass the JobRecord JSON that `spot-pipelines run --json` prints"
        )
    try:
        return _record(text)
    except ConfigError as whole:
        last = text.strip().splitlines()[-1]
        if last == text.strip():
            raise ConfigError(f"{where}: {whole}") from None
        try:
            return _record(last)
        except ConfigError:
            raise ConfigError(f"{where}: {whole}") from None


def _record(text: str) -> JobRecord:
    """The record in ``text``; JSON that is no record at all (the demo's ``--json``
    summary, say) is named as such rather than as a bad schema version."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return JobRecord.from_json(text)  # its one-line "not valid JSON" error
    if isinstance(data, dict) and "schema_version" not in data and "job_id" not in data:
        raise ConfigError(
            "this JSON is not a JobRecord (no job_id or schema_version; `demo "
            "--json` prints a summary): pass `run --json` output or the "
            "demo's WORKDIR/record.json"
        )
    return JobRecord.from_dict(data)


def _read_stdin() -> str:
    try:
        return read_stream(sys.stdin.buffer, limit=MAX_RECORD_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("standard input is not UTF-8 text; pass a JobRecord JSON") from None


def _read_file(source: str) -> str:
    """The file's text: a regular file of at most MAX_RECORD_BYTES (a FIFO, a device such
    as /dev/zero or a socket is one line, never a read that blocks or does not end)."""
    try:
        return read_text(source, limit=MAX_RECORD_BYTES, what="RECORD.json")
    except FileNotFoundError:
        raise ConfigError(
            f"{source}: no such file; pass the path of a JobRecord JSON file "
            "(`spot-pipelines run --json ... > record.json`) or - for stdin"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{source} is a folder; pass a JobRecord JSON file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source} is not UTF-8 text; pass a JobRecord JSON file") from None
    except OSError as exc:
        raise ConfigError(
            f"{source}: cannot read it ({exc.strerror}); pass a readable JobRecord JSON file"
        ) from None
