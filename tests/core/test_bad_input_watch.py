"""`spot-pipelines watch --notice-file PATH`: a user's file at PATH is never damaged.

The watcher replaces the notice file on a notice and removes a stale one at start, so a
path that holds anything but a notice it wrote is refused in one line (exit 2) before
anything runs, and the file is left exactly as it was. A real watcher process and a real
child; the metadata emulator supplies the notice in the end-to-end case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_core.localcloud.metadata import MetadataEmulator

pytestmark = pytest.mark.timeout(60)
BOUND = 30  # seconds: every process wait here is bounded by this
OLD_NOTICE = (
    json.dumps(
        {
            "event": "interruption",
            "action": "terminate",
            "deadline": None,
            "detected_at": "2026-01-01T00:00:00Z",
            "cloud": "aws",
        }
    )
    + "\n"
)


def _watch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPOT_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "watch",
            "--cloud",
            "aws",
            "--endpoint",
            "http://127.0.0.1:9",
            "--poll-interval",
            "0.05",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env={**base, **(env or {})},
    )


def _user_file(tmp_path: Path) -> Path:
    path = tmp_path / "results.json"
    path.write_text('{"accuracy": 0.93}\n')
    return path


def _dir(tmp_path: Path) -> Path:
    path = tmp_path / "notices"
    path.mkdir()
    (path / "keep.txt").write_text("mine")
    return path


def _under_a_file(tmp_path: Path) -> Path:
    _user_file(tmp_path)
    return tmp_path / "results.json" / "notice.json"


def _symlink_to_user_file(tmp_path: Path) -> Path:
    link = tmp_path / "link.json"
    link.symlink_to(_user_file(tmp_path))
    return link


def _big_notice_lookalike(tmp_path: Path) -> Path:
    path = tmp_path / "big.json"
    path.write_text(
        json.dumps({"event": "interruption", "detected_at": "x", "data": "y" * 100_000})
    )
    return path


CASES = {
    "a user's file": (_user_file, "already exists and is not a notice file"),
    "a directory": (_dir, "is a directory"),
    "a path under a file": (_under_a_file, "is not a directory"),
    "a symlink to a user's file": (_symlink_to_user_file, "is not a notice file"),
    "a large file that looks like a notice": (_big_notice_lookalike, "is not a notice file"),
}


def _snapshot(root: Path) -> dict[str, bytes | str]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else "dir")
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("via", ["flag", "env"])
@pytest.mark.parametrize("with_command", [True, False], ids=["command", "no-command"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_notice_path_holding_something_else_is_one_line_and_untouched(
    tmp_path, case, via, with_command
):
    make, words = CASES[case]
    path = make(tmp_path)
    before = _snapshot(tmp_path)
    marker = tmp_path / "child-ran"
    command = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"] if with_command else []
    if via == "flag":
        done = _watch("--notice-file", str(path), *command)
    else:
        done = _watch(*command, env={"SPOT_NOTICE_FILE": str(path)})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert words in lines[0] and lines[0].startswith("spot-pipelines watch: error:")
    assert ("--notice-file" if via == "flag" else "$SPOT_NOTICE_FILE") in lines[0]
    assert _snapshot(tmp_path) == before, "nothing at or around PATH changed"
    assert not marker.exists(), "the command never started"


def test_a_stale_notice_the_watcher_wrote_is_replaced_and_the_step_is_told(tmp_path):
    path = tmp_path / "notice.json"
    path.write_text(OLD_NOTICE)
    seen = tmp_path / "seen"
    child = (
        "import os, pathlib, signal, time, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # read the notice, then exit\n"
        f"seen = pathlib.Path({str(seen)!r})\n"
        "p = pathlib.Path(os.environ['SPOT_NOTICE_FILE'])\n"
        "seen.write_text('stale' if p.exists() else 'clean')\n"
        "for _ in range(400):\n"
        "    if p.exists():\n"
        "        seen.write_text(p.read_text()); sys.exit(0)\n"
        "    time.sleep(0.05)\n"
        "sys.exit(4)\n"
    )
    with MetadataEmulator() as emulator:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spot_core.cli",
                "watch",
                "--cloud",
                "aws",
                "--endpoint",
                emulator.url,
                "--poll-interval",
                "0.05",
                "--notice-file",
                str(path),
                "--grace-seconds",
                "10",
                "--",
                sys.executable,
                "-c",
                child,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("SPOT_")},
        )
        try:
            deadline = time.monotonic() + BOUND
            while not seen.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert seen.read_text() == "clean", "the stale notice was removed before the step"
            emulator.schedule_interruption(notice_seconds=120)
            out, err = proc.communicate(timeout=BOUND)
        finally:
            proc.kill()
    event = json.loads(seen.read_text())
    assert event["event"] == "interruption" and event["detected_at"] != "2026-01-01T00:00:00Z"
    assert json.loads(path.read_text()) == event


@pytest.mark.timeout(30)
def test_a_notice_file_that_is_a_fifo_never_blocks_a_reader_and_is_refused(tmp_path):
    """A step reads its notice file (``read_notice``) and the watcher checks it at start:
    a FIFO there used to block the step's read for ever."""
    from spot_core.errors import ConfigError
    from spot_core.interruption.notice_file import is_notice_file, read_notice

    path = tmp_path / "notice.json"
    os.mkfifo(path)
    with pytest.raises(ConfigError, match="FIFO"):
        read_notice(str(path))
    assert not is_notice_file(path)
    done = _watch("--notice-file", str(path), "--", sys.executable, "-c", "pass")
    assert done.returncode == 2 and "is not a notice file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert path.is_fifo()
