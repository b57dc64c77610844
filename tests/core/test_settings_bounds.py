"""Every number in the settings model has a documented maximum, and the command line
refuses a value past it with the model's own line (the engines' surfaces: the same test
in tests/airflow and tests/prefect)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spot_core.commands.flags import cli_flag
from spot_core.settings import CLI, KNOBS
from tests.support.bounds_cases import bounded, model_line, over

pytestmark = pytest.mark.timeout(120)
CLI_KNOBS = bounded(CLI)


def test_every_number_has_a_maximum():
    numbers = [k for k in KNOBS if k.kind in ("int", "number", "duration")]
    assert [k.name for k in numbers if k.maximum is None] == []


@pytest.mark.parametrize("k", CLI_KNOBS, ids=[k.name for k in CLI_KNOBS])
def test_the_cli_refuses_past_the_maximum_with_the_models_line(tmp_path, k):
    value = over(k)
    proc = subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "run", cli_flag(k), str(value), "--", "true"],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == (
        f"spot-pipelines run: error: {cli_flag(k)}: {model_line(k, value)}"
    ), proc.stderr[-2000:]
    assert not list(tmp_path.iterdir())
