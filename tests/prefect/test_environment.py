"""The Prefect environment holds Prefect 3.9 and our packages, and the layers stay apart."""

from __future__ import annotations

import subprocess
import sys


def _loaded_modules(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return {name.split(".")[0] for name in out.stdout.split()}


def test_prefect_3_9_is_the_engine():
    import prefect

    assert prefect.__version__.startswith("3.9.")


def test_core_and_adapter_do_not_pull_in_airflow():
    loaded = _loaded_modules("import spot_core.cli, spot_core.model, prefect_spot")
    assert "airflow" not in loaded and "airflow_spot" not in loaded


def test_airflow_is_not_installed_beside_prefect():
    proc = subprocess.run([sys.executable, "-c", "import airflow"], capture_output=True)
    assert proc.returncode != 0
