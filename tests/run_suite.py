"""Run one test suite the way `make test` does: spread over processes, then the serial part.

Usage (from the Makefile; the environment's own Python runs it)::

    python tests/run_suite.py NAME WORKERS PATH... [-- PYTEST_ARG...]

Most tests wait on processes (steps, watchers, engine servers) rather than on the CPU:
tests/core used 16 CPU-minutes in 30 wall-minutes run one by one. With WORKERS > 1 the
suite runs in two parts:

1. every test not marked ``serial``, spread over WORKERS processes by pytest-xdist, each
   test file on one process (``--dist loadfile``: a file's module fixtures are set up
   once, its tests keep their order);
2. the tests marked ``serial`` (tests/conftest.py names them: they time real processes
   against windows of a few wall seconds), one at a time, after the first part.

Each part writes its JUnit report, ``.ci/reports/NAME.xml`` and ``NAME-serial.xml``
(`.ci/slowest.py` reads them), and prints its 30 slowest tests. The exit status is the
first failing part's, so a red first part still runs the second. With WORKERS 1 the
suite runs as one plain pytest run, every test in file order.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

REPORTS = Path(__file__).resolve().parent.parent / ".ci" / "reports"
NO_TESTS_COLLECTED = 5  # pytest's exit status when a selection is empty


def _pytest(name: str, selection: str, extra: list[str], args: list[str]) -> int:
    command = [
        sys.executable,
        "-m",
        "pytest",
        *args,
        "-m",
        selection,
        f"--junitxml={REPORTS / name}.xml",
        "--durations=30",
        *extra,
    ]
    print("+", shlex.join(command[1:]), flush=True)
    status = subprocess.call(command)
    return 0 if status == NO_TESTS_COLLECTED else status


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[1].isdigit():
        print("usage: run_suite.py NAME WORKERS PATH... [-- PYTEST_ARG...]", file=sys.stderr)
        return 2
    name, workers = argv[0], int(argv[1])
    rest = argv[2:]
    paths, extra = (
        (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
    )
    if workers <= 1:
        return _pytest(name, "not slow", extra, paths)
    spread = _pytest(
        name, "not slow and not serial", [*extra, "-n", str(workers), "--dist", "loadfile"], paths
    )
    serial = _pytest(f"{name}-serial", "serial and not slow", extra, paths)
    return spread or serial


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
