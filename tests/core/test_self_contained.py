"""A fresh clone is enough: the traces live in the repository, nothing points outside it,
and under CI=true a test that would skip fails instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from spot_core.market.trace import load_trace
from tests.support.spot_helpers import REPO, TRACES

# Spelled in parts so that this file passes its own check.
OUTSIDE = ("../" + "shared", "parents[2]" + ".parent", "parents[1]" + ".parent")


def _repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [REPO / name for name in listed.stdout.splitlines() if (REPO / name).is_file()]


def test_nothing_refers_to_a_folder_beside_the_clone():
    offenders = []
    for path in _repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if any(pattern in text for pattern in OUTSIDE):
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"these read outside the repository: {offenders}"


def test_the_traces_carry_their_licence_and_every_set_loads():
    for name in ("README.md", "LICENSE-skynomad-artifact", "NOTICE-skynomad-artifact"):
        assert (TRACES / name).stat().st_size > 500, name
    assert "Apache License" in (TRACES / "LICENSE-skynomad-artifact").read_text()
    counts = {"aws-v100-2023-02": 9, "aws-v100-4node-600s": 3, "gcp-h100-2025-10": 13}
    for folder, zones in counts.items():
        files = sorted(
            p
            for p in (TRACES / folder).iterdir()
            if p.name.endswith(("_1.csv", "_1.json", "_16.json"))
        )
        assert len(files) == zones, folder
        assert load_trace(files[0]).n_ticks > 100
    assert (TRACES / "aws-spot-advisor" / "spot-advisor-data.json").stat().st_size > 100_000


SKIPPING = """
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("no frobnicator on PATH")

@pytest.fixture
def needs_tool():
    pytest.skip("tool absent")

def test_fixture_skips(needs_tool):
    pass

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
"""


def _run_pytest(folder: Path, name: str, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=folder,
    )


def test_under_ci_a_skip_is_a_failure_and_elsewhere_a_skip(tmp_path):
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    (tmp_path / "test_module_skip.py").write_text(
        'import pytest\npytest.importorskip("no_such_module_for_spot_tests")\n'
        "def test_never():\n    pass\n"
    )

    local = _run_pytest(tmp_path, "test_skipping.py", None)
    assert local.returncode == 0, local.stdout
    assert "1 passed, 2 skipped, 1 xfailed" in local.stdout, local.stdout
    assert "1 skipped" in _run_pytest(tmp_path, "test_module_skip.py", None).stdout

    ci = _run_pytest(tmp_path, "test_skipping.py", "true")
    assert ci.returncode == 1, ci.stdout
    assert "1 failed, 1 passed, 1 xfailed, 1 error" in ci.stdout, ci.stdout  # error: in setup
    assert "skipped under CI=true (Skipped: no frobnicator on PATH)" in ci.stdout
    module = _run_pytest(tmp_path, "test_module_skip.py", "true")
    assert module.returncode != 0 and "no_such_module_for_spot_tests" in module.stdout
