"""docs/ui-quickstart.md runs as written: every ``bash`` block in order, each in its own
shell from the repository's root, a block marked ``keeps running`` in the background (a
terminal of its own), every other one to its end within a bound, exit status 0.

Only what two runs on one machine cannot share is rewritten: the ports (8080, 8790, 4200
become free ones) and the folder (/tmp/spot-ui becomes the test's own). Then the run the
runbook started has succeeded, the Spot tab it fetched says its clock, the Spot jobs page
answered, and the deployment's flow run on the ``spot`` worker completed. Every process a
block started is stopped afterwards (its process group, by the id the test holds).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.process_helpers import free_port

pytestmark = pytest.mark.timeout(3000)

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "ui-quickstart.md"
BLOCK = re.compile(r"^```bash( keeps running)?\n(.*?)^```$", re.S | re.M)
BLOCK_TIMEOUT = 1200  # the slowest block waits for a DAG run or a flow run


def blocks(text: str) -> list[tuple[bool, str]]:
    """(keeps running?, script) of every bash block, in order."""
    return [(bool(m.group(1)), m.group(2)) for m in BLOCK.finditer(text)]


def test_the_runbook_has_the_commands_a_user_needs():
    text = RUNBOOK.read_text()
    scripts = "\n".join(script for _, script in blocks(text))
    for needed in (
        "spot_core.localcloud.server",
        "--start-on-first-client",
        "SPOT_LOCAL_CLOUD_URL",
        "SPOT_LOCAL_CLOUD_TOKEN",
        "airflow standalone",
        "simple_auth_manager_passwords.json.generated",
        "prefect work-pool create training-spot --type spot",
        "worker start --pool training-spot --type spot",
        "deployment run spot-ml-pipeline-on-worker/spot-training",
    ):
        assert needed in scripts, needed
    assert "/plugin/spot-jobs" in text and "/tasks/train/plugin/spot" in text


def test_the_runbook_runs_as_written(tmp_path):
    folder = tmp_path / "spot-ui"
    ports = {"8080": str(free_port()), "8790": str(free_port()), "4200": str(free_port())}
    text = RUNBOOK.read_text().replace("/tmp/spot-ui", str(folder))
    for old, new in ports.items():
        text = text.replace(f":{old}", f":{new}").replace(f"--port {old}", f"--port {new}")
        text = text.replace(f"PORT={old}", f"PORT={new}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPOT_", "PREFECT"))}
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    background: list[subprocess.Popen] = []
    outputs: list[str] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        for i, (keeps_running, script) in enumerate(blocks(text)):
            if keeps_running:
                background.append(
                    subprocess.Popen(
                        ["bash", "-e", "-c", script],
                        cwd=ROOT,
                        env=env,
                        stdout=open(logs / f"block-{i}.log", "wb"),
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
                continue
            done = subprocess.run(
                ["bash", "-e", "-c", script],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT,
            )
            assert done.returncode == 0, (
                f"block {i} failed ({done.returncode}):\n{script}\n{done.stdout[-3000:]}"
                f"\n{done.stderr[-3000:]}\n{_tails(logs)}"
            )
            outputs.append(done.stdout + done.stderr)
            for p in background:
                assert p.poll() is None, f"a background block ended:\n{_tails(logs)}"
        said = "\n".join(outputs)
        assert "run quickstart: success" in said, said[-3000:]
        assert "Costs and durations are in capacity time" in said
        jobs = (folder / "spot-jobs.html").read_text()
        assert "spot_ml_pipeline" in jobs and "capacity hours on spot" in jobs
        assert "Flow run finished successfully in 'Completed'" in said, said[-3000:]
    finally:
        for p in reversed(background):
            _stop(p)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the block's process group (what Ctrl-C in its terminal stops), then
    SIGKILL if it outlives 60 s."""
    for signum, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tails(logs: Path) -> str:
    return "\n".join(
        f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}"
        for log in sorted(logs.glob("*.log"))
    )
