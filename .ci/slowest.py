"""The slowest tests of a whole CI run, from the JUnit XML files the suites wrote.

Each `make test-*` target writes `.ci/reports/<target>.xml` (the Makefile's PYTEST_ADDOPTS);
`.ci/run` calls this after the suites. It prints each suite's tests and time, then the
``--top`` slowest tests of all suites together (a test's time is its setup, call and
teardown: a session fixture's start is charged to the first test that asks for it).

Standard library only, and it never fails the run: a missing, partial or unreadable file
(a suite that crashed mid-way) is named in one line and skipped; the exit code is 0.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple


class Timed(NamedTuple):
    seconds: float
    suite: str
    test: str
    outcome: str


def _outcome(case: ET.Element) -> str:
    for child in case:
        if child.tag in ("failure", "error"):
            return "FAILED"
        if child.tag == "skipped":
            return "skipped"
    return ""


def _test_id(case: ET.Element) -> str:
    """``path/to/test_x.py::Class::test`` (pytest's classname is dotted and has no .py)."""
    classname = case.get("classname", "")
    name = case.get("name", "?")
    file = case.get("file")
    if file:
        inner = classname.split(".")[len(Path(file).with_suffix("").parts) :]
        return "::".join([file, *inner, name])
    return f"{classname}::{name}" if classname else name


def read_suite(path: Path) -> tuple[list[Timed], float | None]:
    """The timed tests of one JUnit file and the suite's own time (None if absent)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    timed, total = [], 0.0
    for suite in suites:
        total += float(suite.get("time") or 0.0)
        for case in suite.iter("testcase"):
            timed.append(
                Timed(float(case.get("time") or 0.0), path.stem, _test_id(case), _outcome(case))
            )
    return timed, (total if suites else None)


def report(folder: Path, top: int) -> str:
    files = sorted(folder.glob("*.xml")) if folder.is_dir() else []
    if not files:
        return f"slowest tests: no JUnit reports in {folder}"
    lines, everything = ["", f"=== test time per suite ({folder}) ==="], []
    for path in files:
        try:
            timed, total = read_suite(path)
        except (OSError, ET.ParseError) as error:
            lines.append(f"{path.stem:<16} unreadable ({error}); skipped")
            continue
        everything += timed
        failed = sum(1 for t in timed if t.outcome == "FAILED")
        lines.append(
            f"{path.stem:<16} {len(timed):>5} tests {total or 0.0:>8.1f} s"
            + (f"  ({failed} failed)" if failed else "")
        )
    lines.append(f"=== the {top} slowest tests of the run (setup + call + teardown) ===")
    for item in sorted(everything, reverse=True)[:top]:
        mark = f" [{item.outcome}]" if item.outcome else ""
        lines.append(f"{item.seconds:>8.1f} s  {item.suite:<14} {item.test}{mark}")
    lines.append(_totals(everything))
    return "\n".join(lines)


def _totals(timed: list[Timed]) -> str:
    """The whole run's count in the plain form any reader of CI logs takes as the closing
    line ('N passed, N failed, N skipped'): this report comes after the suites' own."""
    failed = sum(1 for t in timed if t.outcome == "FAILED")
    skipped = sum(1 for t in timed if t.outcome == "skipped")
    return f"all: {len(timed) - failed - skipped} passed, {failed} failed, {skipped} skipped"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(Path(__file__).parent / "reports"))
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    try:
        print(report(Path(args.folder), args.top))
    except Exception as error:  # noqa: BLE001 - a report must never fail the CI run
        print(f"slowest tests: could not report ({error!r})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
