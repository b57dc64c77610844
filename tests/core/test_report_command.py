"""`spot-pipelines report RECORD.json [--html FILE]` on records a user has: a file, stdin,
`run --json`'s whole output; hostile labels stay text; bad input is one line and leaves
an existing page alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_charts import EVIL, three_attempts

pytestmark = pytest.mark.timeout(120)


def report(*args: str, stdin: str | None = None, cwd: Path | None = None):
    return subprocess.run([sys.executable, "-m", "spot_core.cli", "report", *args],
                          input=stdin, capture_output=True, text=True, timeout=60, cwd=cwd)


def test_html_page_has_a_row_and_a_bar_per_attempt_and_escapes_every_label(tmp_path):
    record = three_attempts(job_id=EVIL)
    source = tmp_path / "record.json"
    source.write_text(record.to_json())
    page = tmp_path / "out.html"
    proc = report(str(source), "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    assert html.count('class="attempt-row"') == 3
    assert html.count('class="attempt outcome-') == 3
    assert "<script" not in html and "&lt;script&gt;" in html
    assert "Content-Security-Policy" in html  # even a missed escape could not run
    assert "fallbacks to on-demand 1" in proc.stdout and "us-east-1a p3.2xlarge" in proc.stdout


def test_reads_stdin_and_the_whole_output_of_run_json(tmp_path):
    record = three_attempts()
    run_output = "pipeline output\nsome table\n" + record.to_json() + "\n"
    proc = report("-", stdin=run_output)
    assert proc.returncode == 0, proc.stderr
    assert "job train-42 (succeeded)" in proc.stdout
    assert "saved $5.31 (60%)" in proc.stdout


@pytest.mark.parametrize("content, says", [
    (None, "no such file"),
    ("", "is empty"),
    ("not json at all", "not valid JSON"),
    (json.dumps({"engine": "none", "attempts": 3}), "not a JobRecord"),  # demo --json output
    (json.dumps({**three_attempts().to_dict(), "schema_version": 99}), "schema_version 99"),
    (json.dumps({**three_attempts().to_dict(), "attempts": "many"}), "malformed"),
])
def test_bad_records_are_one_line_naming_the_fix_and_leave_the_page_alone(tmp_path, content,
                                                                         says):
    source = tmp_path / "record.json"
    if content is not None:
        source.write_text(content)
    page = tmp_path / "out.html"
    page.write_text("an older report")
    proc = report(str(source), "--html", str(page))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert says in proc.stderr
    assert page.read_text() == "an older report"


def test_html_into_a_missing_folder_is_one_line_and_creates_nothing(tmp_path):
    source = tmp_path / "record.json"
    source.write_text(three_attempts().to_json())
    proc = report(str(source), "--html", str(tmp_path / "nowhere" / "out.html"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "nowhere").exists()
