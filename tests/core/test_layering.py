"""spot_core imports neither engine nor any cloud SDK at import time (they are optional extras)."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = {"airflow", "prefect", "boto3", "botocore", "kubernetes", "torch",
             "airflow_spot", "prefect_spot"}


def test_core_imports_no_engine_or_cloud_sdk():
    code = ("import spot_core.cli, spot_core.model, spot_core.checkpoint, spot_core.interruption\n"
            "import sys; print('\\n'.join(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded = {name.split(".")[0] for name in out.stdout.split()}
    assert not loaded & FORBIDDEN
