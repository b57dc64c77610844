"""What `spot-pipelines run` says, read as a user (issue 50): a deadline miss named as one,
a warning when a trace-time deadline leaves the step seconds of wall time, a duration
without a unit refused, reasons in sentences, `--json` alone on stdout, and the step's own
output kept where the record points."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.spot_helpers import train_command

pytestmark = pytest.mark.timeout(150)

README = Path(__file__).resolve().parents[2] / "README.md"
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def _is_sentence(text: str) -> bool:
    return not text.lstrip().startswith("{") and not LOG_RECORD.match(text)


def test_run_json_is_the_record_alone_and_the_step_output_is_kept(tmp_path):
    """`run --json > record.json` is JSON; the table and events go to stderr; a preempted
    attempt's reason is a sentence; each attempt's log outlives the run, where the record
    points."""
    proc = _run(
        "--start-tick", "450", "--max-preemptions", "1", "--pools", "us-east-2a", "--json",
        "--", *train_command(steps=600, step_seconds=0.01),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)  # the whole of stdout
    assert record["preemptions"] == 1
    assert "preempted" in proc.stderr and "┃ outcome" in proc.stderr
    for attempt in record["attempts"]:
        assert _is_sentence(attempt["message"]), attempt["message"]
        log = Path(attempt["lease"]["details"]["log"])
        assert log.is_file() and tmp_path in log.parents, log
    preempted = next(a for a in record["attempts"] if a["outcome"] == "preempted")
    assert preempted["message"], "a preemption says why"
    assert "step output:" in proc.stderr


def test_a_deadline_miss_is_deadline_missed_and_a_short_deadline_warns_once(tmp_path):
    """3 trace hours at the default scale are 3 wall seconds: one warning line naming the
    fix, and the stopped attempt is `deadline_missed`, not an infrastructure failure."""
    proc = _run(
        "--deadline", "3h", "--pools", "us-west-2b", "--json",
        "--", sys.executable, "-c", "import time; time.sleep(60)",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    record = json.loads(proc.stdout)
    assert record["status"] == "deadline_missed"
    assert record["attempts"][-1]["outcome"] == "deadline_missed"
    assert record["infrastructure_failures"] == 0
    warnings = [line for line in proc.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "--time-scale" in warnings[0], proc.stderr


@pytest.mark.parametrize("flag", ["--deadline", "--work", "--restart-overhead"])
def test_a_duration_without_a_unit_is_refused_in_one_line(tmp_path, flag):
    proc = _run(flag, "12", "--", "true", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"{flag} 12s" in lines[0] and "12h" in lines[0] and "unit" in lines[0]
    assert not (tmp_path / ".spot-runs").exists()


def test_the_readmes_run_command_runs_as_written(tmp_path):
    """The headline command, with a train.py of a few seconds: it finishes, unwarned."""
    block = README.read_text().split("## From the command line", 1)[1]
    line = next(w for w in block.splitlines() if w.startswith("spot-pipelines run "))
    words = line.split()[2:]
    assert words[-2:] == ["python", "train.py"], line
    step = "import time\nprint('training', flush=True)\ntime.sleep(2)\n"
    (tmp_path / "train.py").write_text(step)
    words[-2] = sys.executable
    proc = _run("--json", *words, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "succeeded"
    assert "warning" not in proc.stderr
    log = Path(json.loads(proc.stdout)["attempts"][-1]["lease"]["details"]["log"])
    assert "training" in log.read_text()


REASONS = [
    # the step's own JSON line, then the watcher's forwarded log record of the SIGKILL
    (
        '{"preempted": true, "reason": "preempted (received SIGTERM); state saved at step 344"}\n'
        "2026-12-07 15:55:46,050 WARNING spot_core.interruption.forward: child 32763 "
        "outlived its notice deadline: SIGKILL",
        "preempted (received SIGTERM); state saved at step 344",
    ),
    (
        'step 3\n{"event": "interruption", "action": "terminate", "deadline": '
        '"2026-12-08T00:52:23Z", "detected_at": "2026-12-08T00:52:21Z", "cloud": "aws"}',
        "the aws spot interruption notice (terminate, capacity gone at 2026-12-08T00:52:23Z)",
    ),
    (
        "Traceback (most recent call last):\n  File 'x'\nValueError: bad row 7",
        "ValueError: bad row 7",
    ),  # noqa: E501
    (
        "2026-12-07 15:55:46,050 WARNING spot_core.interruption.forward: child 1 outlived its "
        "notice deadline: SIGKILL",
        "child 1 outlived its notice deadline: SIGKILL",
    ),
    ("stopped: the job's deadline passed", "stopped: the job's deadline passed"),
]


@pytest.mark.parametrize("tail, reason", REASONS)
def test_a_reason_is_a_sentence_never_json_or_a_log_record(tail, reason):
    from spot_core.attempt_env import readable_reason

    assert readable_reason(tail) == reason


def test_a_long_reason_is_cut_with_an_ellipsis_never_silently():
    from spot_core.attempt_env import clip

    text = "the store at s3://bucket/" + "very-long-prefix/" * 40 + "ckpt is unreachable"
    shown = clip(text, 120)
    assert len(shown) <= 120 and shown.endswith("…")
    assert clip("short and whole") == "short and whole"
