"""`spot-pipelines watch` end to end: a real watcher process, a real child process and
the metadata emulator over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spot_core.localcloud.metadata import MetadataEmulator

POLL = "0.05"
BOUND = 20  # seconds: every process wait in this file is bounded by this

CHILD = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    mode = sys.argv[2]

    def on_term(signum, frame):
        notice = Path(os.environ["SPOT_NOTICE_FILE"]).read_text()
        out.with_suffix(".notice").write_text(notice)
        sys.exit(7)

    if mode == "graceful":
        signal.signal(signal.SIGTERM, on_term)
    elif mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif mode == "exit3":
        sys.exit(3)
    elif mode == "die-by-signal":
        os.kill(os.getpid(), signal.SIGUSR1)
    out.write_text(json.dumps({"notice_file": os.environ.get("SPOT_NOTICE_FILE")}))
    try:
        for _ in range(300):
            if mode == "wait-file" and Path(os.environ["SPOT_NOTICE_FILE"]).exists():
                out.with_suffix(".notice").write_text(
                    Path(os.environ["SPOT_NOTICE_FILE"]).read_text())
                sys.exit(0)
            time.sleep(0.05)
    except KeyboardInterrupt:
        sys.exit(9)
    sys.exit(0)
""")


@pytest.fixture
def emulator():
    with MetadataEmulator() as emu:
        yield emu


@pytest.fixture
def child(tmp_path: Path) -> Path:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return script


def watch_cmd(emulator, *extra: str, cloud: str = "aws") -> list[str]:
    return [
        sys.executable,
        "-m",
        "spot_core.cli",
        "watch",
        "--cloud",
        cloud,
        "--endpoint",
        emulator.url,
        "--poll-interval",
        POLL,
        *extra,
    ]


def start(cmd: list[str], **kwargs) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOT_")}
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, **kwargs.pop("env", {})},
        **kwargs,
    )


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = BOUND) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"child never got ready: {proc.poll()} {proc.stderr.read()}"


def finish(proc: subprocess.Popen) -> tuple[int, list[dict], str]:
    try:
        out, err = proc.communicate(timeout=BOUND)
    finally:
        proc.kill()
    events = [json.loads(line) for line in out.splitlines() if line.startswith('{"event"')]
    return proc.returncode, events, err


def test_child_gets_sigterm_and_the_notice_file_and_its_code_is_returned(emulator, child, tmp_path):
    ready = tmp_path / "out"
    proc = start([*watch_cmd(emulator), "--", sys.executable, str(child), str(ready), "graceful"])
    wait_for_file(ready, proc)
    deadline = emulator.schedule_interruption(notice_seconds=60)
    code, events, err = finish(proc)
    assert code == 7, err
    (event,) = events
    assert (event["event"], event["action"], event["cloud"]) == ("interruption", "terminate", "aws")
    assert event["deadline"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
    assert json.loads(ready.with_suffix(".notice").read_text()) == event
    notice_file = json.loads(ready.read_text())["notice_file"]
    assert not Path(notice_file).exists(), "the temp notice file is cleaned up"


def test_child_ignoring_sigterm_is_killed_after_the_grace(emulator, child, tmp_path):
    ready = tmp_path / "out"
    proc = start(
        [
            *watch_cmd(emulator, "--grace-seconds", "0.5"),
            "--",
            sys.executable,
            str(child),
            str(ready),
            "stubborn",
        ]
    )
    wait_for_file(ready, proc)
    emulator.schedule_interruption(notice_seconds=120)
    started = time.monotonic()
    code, events, _ = finish(proc)
    assert code == 128 + signal.SIGKILL
    assert 0.4 < time.monotonic() - started < 5
    assert [e["event"] for e in events] == ["interruption"]


def test_child_outliving_the_notice_deadline_is_killed(emulator, child, tmp_path):
    ready = tmp_path / "out"
    proc = start(
        [
            *watch_cmd(emulator, cloud="azure"),
            "--",
            sys.executable,
            str(child),
            str(ready),
            "stubborn",
        ]
    )
    wait_for_file(ready, proc)
    emulator.schedule_interruption(notice_seconds=1)
    code, events, _ = finish(proc)
    assert code == 128 + signal.SIGKILL
    assert events[0]["action"] == "Preempt"


def test_exit_code_passes_through_without_a_notice(emulator, child, tmp_path):
    proc = start(
        [*watch_cmd(emulator), "--", sys.executable, str(child), str(tmp_path / "o"), "exit3"]
    )
    code, events, err = finish(proc)
    assert (code, events) == (3, [])
    assert err == ""


def test_child_killed_by_a_signal_exits_like_a_shell_reports_it(emulator, child, tmp_path):
    proc = start(
        [
            *watch_cmd(emulator),
            "--",
            sys.executable,
            str(child),
            str(tmp_path / "o"),
            "die-by-signal",
        ]
    )
    assert finish(proc)[0] == 128 + signal.SIGUSR1


def test_given_notice_file_and_rebalance_does_not_sigterm(emulator, child, tmp_path):
    ready, notice_file = tmp_path / "out", tmp_path / "notice.json"
    notice_file.write_text(
        '{"event": "interruption", "action": "terminate", "deadline": null, '
        '"detected_at": "2026-01-01T00:00:00Z", "cloud": "aws"}'
    )  # stale
    proc = start(
        [*watch_cmd(emulator), "--", sys.executable, str(child), str(ready), "wait-file"],
        env={"SPOT_NOTICE_FILE": str(notice_file)},
    )
    wait_for_file(ready, proc)
    emulator.schedule_rebalance()
    code, events, err = finish(proc)
    assert code == 0, err
    assert json.loads(ready.read_text())["notice_file"] == str(notice_file)
    assert [e["event"] for e in events] == ["rebalance"]
    assert json.loads(ready.with_suffix(".notice").read_text())["event"] == "rebalance"


def test_sigterm_to_the_watcher_is_forwarded_as_a_notice(emulator, child, tmp_path):
    ready = tmp_path / "out"
    proc = start([*watch_cmd(emulator), "--", sys.executable, str(child), str(ready), "graceful"])
    wait_for_file(ready, proc)
    proc.send_signal(signal.SIGTERM)
    code, events, _ = finish(proc)
    assert code == 7
    assert [(e["event"], e["cloud"]) for e in events] == [("interruption", "signal")]


def test_report_writes_the_attempts_status_at_the_notice_and_the_end(emulator, child, tmp_path):
    """``--report`` (a kubernetes pod's watcher): the status object the controller reads
    when the pod is gone holds when the notice came and how the step ended."""
    ready, store = tmp_path / "out", tmp_path / "store"
    proc = start(
        [
            *watch_cmd(emulator, "--report"),
            "--",
            sys.executable,
            str(child),
            str(ready),
            "graceful",
        ],
        env={"SPOT_CHECKPOINT_URI": store.as_uri(), "SPOT_ATTEMPT": "4", "SPOT_JOB_ID": "job-r"},
    )
    wait_for_file(ready, proc)
    emulator.schedule_interruption(notice_seconds=60)
    code, events, err = finish(proc)
    assert code == 7, err
    report = json.loads((store / "status" / "attempt-000004.json").read_text())
    assert report["exit_code"] == 7 and report["job_id"] == "job-r"
    assert report["notice_at"] is not None and report["notice_at"] <= report["ended_at"]


def test_sigint_to_the_watcher_is_forwarded_to_the_child(emulator, child, tmp_path):
    ready = tmp_path / "out"
    proc = start([*watch_cmd(emulator), "--", sys.executable, str(child), str(ready), "plain"])
    wait_for_file(ready, proc)
    proc.send_signal(signal.SIGINT)
    assert finish(proc)[0] == 9


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure", "auto"])
def test_without_a_command_prints_the_event_and_exits_zero(emulator, cloud, tmp_path):
    notice_file = tmp_path / "notice.json"
    emulator.schedule_interruption(notice_seconds=60)
    proc = start(watch_cmd(emulator, "--notice-file", str(notice_file), cloud=cloud))
    code, events, err = finish(proc)
    assert code == 0, err
    (event,) = events
    assert set(event) == {"event", "action", "deadline", "detected_at", "cloud"}
    assert event["cloud"] == ("aws" if cloud == "auto" else cloud)
    assert json.loads(notice_file.read_text()) == event


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--poll-interval", "0"], "--poll-interval"),
        (["--poll-interval", "-1"], "--poll-interval"),
        (["--poll-interval", "soon"], "--poll-interval"),
        (["--grace-seconds", "-2"], "--grace-seconds"),
        (["--cloud", "mars"], "aws, gcp, azure"),
        (["--endpoint", "169.254.169.254"], "http://HOST"),
        (
            ["--cloud", "aws", "--endpoint", "http://127.0.0.1:9", "--", "/no/such/cmd"],
            "/no/such/cmd",
        ),
        (["--heartbeat-timeout", "soon", "--", "true"], "--heartbeat-timeout"),
        (["--heartbeat-timeout", "0", "--", "true"], "--heartbeat-timeout"),
        (["--heartbeat-timeout", "5m"], "put it after --"),
        (["--heartbeat-timeout", "5", "--", "true"], "SPOT_CHECKPOINT_URI"),
        (["--report", "--", "true"], "--report needs"),
        (["--cloud", "kubernetes", "--", "true"], "SPOT_NODE_NAME"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    proc = start([sys.executable, "-m", "spot_core.cli", "watch", *args])
    code, _, err = finish(proc)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert needle in err and err.startswith("spot-pipelines watch: error:")
