"""`make bench-policies` shows its progress on stderr (a rich bar on a terminal, a line
per row otherwise) and leaves stdout, the table, alone."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROWS = """
from concurrent.futures import ProcessPoolExecutor
from bench.progress import run_rows
from bench.policies import _row_name

def case(i):
    return {"zones": f"zone {i}", "deadline": 52.0, "overhead": 0.05}

if __name__ == "__main__":
    with ProcessPoolExecutor(2) as pool:
        rows = run_rows(pool, case, range(5), label="rows", name=_row_name)
    print(sorted(r["zones"] for r in rows))
"""


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "rows.py"
    script.write_text(ROWS)
    return script


def test_rows_report_progress_on_stderr_off_a_terminal(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(_script(tmp_path))],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([f"zone {i}" for i in range(5)])
    lines = proc.stderr.strip().splitlines()
    assert [line.split(" (")[0] for line in lines] == [f"rows {i}/5" for i in range(1, 6)]
    assert all("D=52 h R=0.05 h" in line for line in lines)


def test_rows_show_a_progress_bar_on_a_terminal(tmp_path):
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(_script(tmp_path))],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm"},
        stdin=child,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.wait(timeout=60) == 0
    text = seen.decode(errors="replace")
    assert "5/5" in text and "━" in text  # rich's bar and its M/N column
