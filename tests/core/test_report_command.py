"""`spot-pipelines report RECORD.json [--html FILE]` on records a user has: a file, stdin,
`run --json`'s whole output; hostile labels stay text; bad input is one line and leaves
an existing page alone."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_charts import EVIL, three_attempts

pytestmark = pytest.mark.timeout(120)


def report(*args: str, stdin: str | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "report", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


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


def test_report_reads_what_a_real_run_json_writes(tmp_path):
    """The whole output of `run --json` (event lines, the table, the record), from a file
    and from stdin, and the page from it."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "run",
            "--json",
            "--job-id",
            "real-run",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "Infinity" not in run.stdout and "NaN" not in run.stdout
    (tmp_path / "run.out").write_text(run.stdout)
    for args, stdin in (
        ([str(tmp_path / "run.out"), "--html", str(tmp_path / "r.html")], None),
        (["-"], run.stdout),
    ):
        proc = report(*args, stdin=stdin)
        assert proc.returncode == 0, proc.stderr
        assert "job real-run (succeeded)" in proc.stdout
    assert "<svg" in (tmp_path / "r.html").read_text()


def test_reads_stdin_and_the_whole_output_of_run_json(tmp_path):
    record = three_attempts()
    run_output = "pipeline output\nsome table\n" + record.to_json() + "\n"
    proc = report("-", stdin=run_output)
    assert proc.returncode == 0, proc.stderr
    assert "job train-42 (succeeded)" in proc.stdout
    assert "saved $5.31 (60%)" in proc.stdout


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "no such file"),
        ("", "is empty"),
        ("not json at all", "not valid JSON"),
        (json.dumps({"engine": "none", "attempts": 3}), "not a JobRecord"),  # demo --json output
        (json.dumps({**three_attempts().to_dict(), "schema_version": 99}), "schema_version 99"),
        (json.dumps({**three_attempts().to_dict(), "attempts": "many"}), "malformed"),
    ],
)
def test_bad_records_are_one_line_naming_the_fix_and_leave_the_page_alone(tmp_path, content, says):
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


# -- outputs never destroy inputs (spot_core.safe_files) -----------------------------------
def _fifo(tmp_path: Path, source: Path) -> Path:
    path = tmp_path / "pipe.html"
    os.mkfifo(path)
    return path


def _socket(tmp_path: Path, source: Path) -> Path:
    path = tmp_path / "sock.html"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays
    return path


def _hard_link(tmp_path: Path, source: Path) -> Path:
    path = tmp_path / "also-record.json"
    os.link(source, path)
    return path


def _symlink_to_input(tmp_path: Path, source: Path) -> Path:
    path = tmp_path / "link.html"
    path.symlink_to(source)
    return path


def _symlink_elsewhere(tmp_path: Path, source: Path) -> Path:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "page.html").write_text("someone else's page")
    path = tmp_path / "out.html"
    path.symlink_to(elsewhere / "page.html")
    return path


def _device(tmp_path: Path, source: Path) -> Path:
    """A null device of our own: the test must never point at the machine's /dev/null
    (the code before this fix replaced the device with a file)."""
    path = tmp_path / "null.html"
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path


def _folder(tmp_path: Path, source: Path) -> Path:
    path = tmp_path / "pages"
    path.mkdir()
    (path / "keep.txt").write_text("mine")
    return path


TARGETS = {
    "the input itself": (lambda tmp_path, source: source, "same file as the input"),
    "the input by another spelling": (
        lambda tmp_path, source: tmp_path / "." / ".." / tmp_path.name / source.name,
        "same file as the input",
    ),
    "a hard link to the input": (_hard_link, "same file as the input"),
    "a symlink to the input": (_symlink_to_input, "symbolic link"),
    "a symlink to a file elsewhere": (_symlink_elsewhere, "symbolic link"),
    "a character device": (_device, "character device"),
    "a FIFO": (_fifo, "FIFO"),
    "a socket": (_socket, "socket"),
    "a folder": (_folder, "is a folder"),
}


def _state(path: Path):
    """What a path is and holds, without opening anything that could block."""
    info = os.lstat(path)
    content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
    return stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_ino, content


@pytest.mark.parametrize("case", sorted(TARGETS))
def test_html_onto_an_input_or_a_non_regular_file_is_one_line_and_damages_nothing(tmp_path, case):
    source = tmp_path / "record.json"
    source.write_text(three_attempts().to_json())
    make, words = TARGETS[case]
    target = make(tmp_path, source)
    watched = [p for p in (source, target) if os.path.lexists(p)] + sorted(tmp_path.rglob("*"))
    before = {str(p): _state(p) for p in watched}
    proc = report(str(source), "--html", str(target))
    assert proc.returncode == 2, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "--html" in lines[0] and words in lines[0]
    assert {str(p): _state(p) for p in watched} == before, "nothing was replaced or written"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".spot-tmp-")]


def test_html_onto_the_file_on_stdin_is_refused(tmp_path):
    source = tmp_path / "record.json"
    text = three_attempts().to_json()
    source.write_text(text)
    with open(source) as stdin:
        proc = subprocess.run(
            [sys.executable, "-m", "spot_core.cli", "report", "-", "--html", str(source)],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2 and "same file as the input standard input" in proc.stderr
    assert source.read_text() == text


def test_an_existing_page_keeps_its_mode_and_a_new_one_follows_the_umask(tmp_path):
    source = tmp_path / "record.json"
    source.write_text(three_attempts().to_json())
    private = tmp_path / "private.html"
    private.write_text("an older report")
    private.chmod(0o600)
    fresh = tmp_path / "fresh.html"
    for page in (private, fresh):
        proc = subprocess.run(
            [sys.executable, "-m", "spot_core.cli", "report", str(source), "--html", str(page)],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=lambda: os.umask(0o027),
        )
        assert proc.returncode == 0, proc.stderr
        assert "<svg" in page.read_text()
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640  # 0666 less the umask 027


@pytest.mark.parametrize("source", ["a FIFO", "/dev/zero", "stdin from /dev/zero"])
def test_a_record_that_is_no_regular_file_is_one_line_not_a_hang(tmp_path, source):
    stdin = None
    if source == "a FIFO":
        args = [str(tmp_path / "record.json")]
        os.mkfifo(args[0])
    elif source == "/dev/zero":
        args = ["/dev/zero"]
    else:
        args, stdin = ["-"], open("/dev/zero", "rb")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "spot_core.cli", "report", *args],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        if stdin is not None:
            stdin.close()
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert (
        "FIFO"
        if source == "a FIFO"
        else "character device"
        if source == "/dev/zero"
        else "more than 64 MiB"
    ) in proc.stderr
