"""The Airflow environment holds Airflow 3.3 and our packages, and the layers stay apart."""

from __future__ import annotations

import subprocess
import sys


def _loaded_modules(statement: str) -> set[str]:
    code = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return {name.split(".")[0] for name in out.stdout.split()}


def test_airflow_3_3_is_the_engine():
    import airflow

    assert airflow.__version__.startswith("3.3.")


def test_core_and_adapter_do_not_pull_in_prefect():
    loaded = _loaded_modules("import spot_core.cli, spot_core.model, airflow_spot")
    assert "prefect" not in loaded and "prefect_spot" not in loaded


def test_prefect_is_not_installed_beside_airflow():
    proc = subprocess.run([sys.executable, "-c", "import prefect"], capture_output=True)
    assert proc.returncode != 0
