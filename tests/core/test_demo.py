"""`spot-pipelines demo`: the main job end to end, as a user runs it; its record rendered
by `spot-pipelines report`; its live display on a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

CONTRACT = {
    "engine",
    "attempts",
    "preemptions",
    "fallbacks",
    "resumed_from_steps",
    "spot_cost",
    "on_demand_cost",
    "savings_fraction",
    "lost_work_seconds",
    "time_to_resume_seconds",
    "final_weights_sha256",
    "uninterrupted_weights_sha256",
    "accuracy",
}
ANSI = re.compile(r"\x1b\[")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One run of the demo with --json into a pipe (not a terminal), shared."""
    workdir = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "demo", "--json", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, workdir


@pytest.mark.timeout(200)
def test_demo_pipeline_survives_real_trace_preemptions(demo):
    proc, _ = demo
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["engine"] == "none"
    assert report["preemptions"] >= 2
    assert report["fallbacks"] >= 1
    assert len(report["resumed_from_steps"]) >= 2 and report["resumed_from_steps"][0] > 0
    assert report["final_weights_sha256"] == report["uninterrupted_weights_sha256"]
    assert 0 < report["spot_cost"] < report["on_demand_cost"]
    assert 0 < report["savings_fraction"] < 1
    assert report["lost_work_seconds"] >= 0
    # one per resumed attempt, each what a reclaim cost from its notice to the first step
    resumes = report["time_to_resume_seconds"]
    assert len(resumes) >= report["preemptions"] and all(t >= 0 for t in resumes)
    assert report["accuracy"] > 0.8
    assert "(equal)" in proc.stdout  # the human report shows the hashes side by side


@pytest.mark.timeout(200)
def test_demo_output_off_a_terminal_is_plain_lines_ending_in_the_json_contract(demo):
    proc, _ = demo
    lines = proc.stdout.strip().splitlines()
    assert set(json.loads(lines[-1])) == CONTRACT
    assert not ANSI.search(proc.stdout)  # no live display, no colour codes in a pipe
    assert "saved so far" not in proc.stdout
    assert lines[0].startswith("pipeline: prepare data -> train")
    assert any(" preempted " in line for line in lines)


@pytest.mark.timeout(200)
def test_report_renders_the_demos_record_as_tables_and_an_html_page(demo, tmp_path):
    proc, workdir = demo
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    record = json.loads((workdir / "record.json").read_text())
    page = tmp_path / "report.html"
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "report",
            str(workdir / "record.json"),
            "--html",
            str(page),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"job {record['job_id']} (succeeded)" in shown.stdout
    assert shown.stdout.count("preempted") == summary["preemptions"]
    assert (
        f"spot cost ${summary['spot_cost']:.2f} vs on-demand "
        f"${summary['on_demand_cost']:.2f}" in shown.stdout
    )
    html = page.read_text()
    assert html.count('class="attempt-row"') == summary["attempts"]
    svgs = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    assert len(svgs) == 3
    timeline = ET.fromstring(svgs[0])
    bars = [
        e
        for e in timeline.iter("{http://www.w3.org/2000/svg}rect")
        if "attempt" in e.get("class", "").split()
    ]
    assert [b.get("data-outcome") for b in bars] == ["preempted"] * summary["preemptions"] + [
        "succeeded"
    ]
    assert "<script" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )  # nothing loads from anywhere


@pytest.mark.timeout(200)
def test_demo_on_a_terminal_shows_a_live_display_of_the_attempt_and_saving(tmp_path):
    """Under a pseudo-terminal the demo redraws a panel with the running attempt and
    the saving so far, then prints the same report."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "spot_core.cli", "demo", "--workdir", str(tmp_path)],
        stdin=child,
        stdout=child,
        stderr=child,
        env={**os.environ, "COLUMNS": "140", "TERM": "xterm"},
    )
    os.close(child)
    seen = bytearray()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(main)
    assert proc.wait(timeout=30) == 0, seen[-2000:].decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "saved so far" in text and re.search(r"attempt \d running on us-", text)
    assert "checkpointed step" in text
    assert "(equal)" in text and f"record {tmp_path / 'record.json'}" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "folder", "symlink"])
def test_a_demo_record_path_that_is_no_regular_file_is_one_line_before_the_run(tmp_path, kind):
    """WORKDIR/record.json is written when the pipeline ends: a FIFO there used to hang
    the demo after its whole run, a folder to end it in a traceback."""
    record = tmp_path / "record.json"
    if kind == "fifo":
        os.mkfifo(record)
    elif kind == "folder":
        record.mkdir()
    else:
        (tmp_path / "mine.json").write_text("a user's file")
        record.symlink_to(tmp_path / "mine.json")
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "demo", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "demo record" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["record.json"] + (["mine.json"] if kind == "symlink" else [])
    ), "nothing ran"


@pytest.mark.timeout(30)
def test_the_data_set_step_never_blocks_on_a_fifo(tmp_path):
    """The pipeline's first step writes WORKDIR/data/dataset.npz and the training step reads
    it (``--data``): a FIFO there used to block either for ever."""
    from spot_core.errors import ConfigError
    from spot_core.workloads.softmax_regression import TrainConfig, load_dataset, prepare_dataset

    fifo = tmp_path / "dataset.npz"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        prepare_dataset(TrainConfig(), fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        load_dataset(fifo)
    assert fifo.is_fifo()
    data = prepare_dataset(TrainConfig(), tmp_path / "data" / "dataset.npz")
    assert [len(a) for a in load_dataset(data)][::2] == [3200, 800]  # the 80/20 split


def test_demo_rejects_unbuilt_engine_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "demo", "--engine", "airflow"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.timeout(200)
def test_demo_on_kubernetes_spot_node_pools(tmp_path):
    """The same contract with the training step as pods on the Kubernetes emulator: two
    preemptions by two flavours' reclaims, a fallback to the on-demand node group, one
    voluntary disruption there (a drain for an upgrade) that spends no preemption, and the
    uninterrupted run's weights."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spot_core.cli",
            "demo",
            "--provider",
            "kubernetes",
            "--json",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["preemptions"] >= 2 and report["fallbacks"] >= 1
    assert len(report["resumed_from_steps"]) >= 2 and report["resumed_from_steps"][0] > 0
    assert report["final_weights_sha256"] == report["uninterrupted_weights_sha256"]
    assert 0 < report["spot_cost"] < report["on_demand_cost"]
    # two different flavours took the node away: Karpenter's pool, then the EKS node group
    assert "us-east-1b m5.xlarge" in proc.stdout and "us-east-1a m5.xlarge" in proc.stdout
    record = json.loads((tmp_path / "record.json").read_text())
    outcomes = [a["outcome"] for a in record["attempts"]]
    assert outcomes.count("disrupted") == 1 and record["disruptions"] == 1
    assert report["preemptions"] == outcomes.count("preempted") == 2
    drained = outcomes.index("disrupted")
    assert record["attempts"][drained]["pool"]["market"] == "on-demand"
    assert record["attempts"][drained + 1]["outcome"] == "succeeded"
    assert record["attempts"][drained + 1]["checkpoint_step_start"] > 0  # resumed


def test_demo_on_kubernetes_without_the_emulators_names_the_extra_in_one_line(tmp_path):
    """The Kubernetes emulator is a separate distribution (not in the wheel every Airflow
    worker installs): without it the demo says which extra to install, before anything
    starts, and exits 2 with no traceback."""
    from tests.support.no_emulators import env_without_emulators

    env = env_without_emulators(tmp_path / "site")
    blocked = subprocess.run(
        [sys.executable, "-c", "import spot_emulators"], env=env, capture_output=True, timeout=60
    )
    assert blocked.returncode == 1, "the child could still import spot_emulators"
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "demo", "--provider", "kubernetes", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert 'pip install "spot-pipelines[emulators]"' in lines[0]
    assert "pipeline" not in proc.stdout  # refused before the demo started


@pytest.mark.timeout(120)
def test_a_sigterm_stops_the_demo_and_ends_its_leases(tmp_path):
    """A demo stopped by SIGTERM (a CI timeout, systemd, `kill`) ends its leases' steps
    at once and says so, instead of leaving them to run until their heartbeat lapses."""
    from tests.support.spot_helpers import marked_processes, wait_until

    proc = subprocess.Popen(
        [sys.executable, "-m", "spot_core.cli", "demo", "--workdir", str(tmp_path / "w")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:  # bounded by the test's timeout
        if "launched" in line:
            break
    assert wait_until(lambda: marked_processes(str(tmp_path)), timeout=30), "no lease ran"
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert wait_until(lambda: not marked_processes(str(tmp_path)), timeout=15), (
        "a lease's step outlived the stopped demo"
    )
