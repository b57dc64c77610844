"""The command line's flags, read as a user (issue 50): no abbreviations, a "did you mean"
for a typo, and `simulate` printing a table unless asked for JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

TRACE = Path(__file__).resolve().parents[2] / "traces/aws-v100-2023-02/us-east-1c_v100_1.csv"
SIMULATE = [
    "simulate", "--trace", str(TRACE), "--task-hours", "48", "--deadline-hours", "52",
    "--restart-overhead-hours", "0.05", "--policy", "uniform-progress", "--windows", "3",
]  # fmt: skip


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spot_core.cli", *args],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "args, hint",
    [
        (["run", "--max-preemption", "2", "--", "true"], "did you mean --max-preemptions?"),
        (["run", "--deadlin", "2h", "--", "true"], "did you mean --deadline?"),
        (["rn", "--", "true"], "did you mean 'run'?"),
        (["simulate", "--jsn", *SIMULATE[1:]], "did you mean --json?"),
        (["demo", "--engine", "prefekt"], "did you mean 'prefect'?"),
    ],
)
def test_a_typo_is_one_line_with_a_did_you_mean_and_never_an_abbreviation(tmp_path, args, hint):
    proc = _cli(*args, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert hint in lines[0], lines[0]
    assert not (tmp_path / ".spot-runs").exists()  # the abbreviation ran no job


def test_simulate_prints_a_table_and_json_only_when_asked(tmp_path):
    table = _cli(*SIMULATE, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert table.stdout.lstrip()[:1] != "{" and "mean cost $" in table.stdout
    assert "deadlines missed 0 of 3" in table.stdout
    costs = [line.split()[1] for line in table.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(costs) == 3 and all(len(c.split(".")[1]) == 2 for c in costs), table.stdout
    data = json.loads(_cli(*SIMULATE, "--json", cwd=tmp_path).stdout)
    assert [f"{c:.2f}" for c in data["costs"]] == costs
    help_text = " ".join(_cli("simulate", "--help", cwd=tmp_path).stdout.split())
    assert "instead of the table" in help_text and "always printed" not in help_text
