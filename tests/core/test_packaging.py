"""The built package, as a user installs it: sdist and wheel contents, and the wheel
installed (not editable) into clean environments for each engine.

`spot-pipelines[airflow]`: Airflow lists the provider and parses the example DAG the wheel
carries; `spot-pipelines[prefect]`: Prefect finds the `spot` worker type (what
`prefect worker start --type spot` looks up) and loads the example flow, without a server.
Environments resolve against uv.lock's versions (constraints from `uv export`), so they
are reproducible and come from uv's cache in seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.dist_helpers import REPO, run

pytestmark = pytest.mark.timeout(300)


def _isolated_env(home: Path) -> dict[str, str]:
    """No trace of the checkout or of this test's environment in the child."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT")
    }
    return {
        **env,
        "AIRFLOW_HOME": str(home / "airflow"),
        "PREFECT_HOME": str(home / "prefect"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # A fresh environment's first import of Airflow, on a loaded machine, passed
        # DagBag's default 30 s once; the DAG itself is what this test checks.
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
    }


def _python_json(python: Path, code: str, home: Path) -> dict:
    done = subprocess.run(
        [str(python), "-c", code],
        cwd=home,
        env=_isolated_env(home),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_sdist_carries_the_traces_the_licence_and_the_examples(built_dist):
    sdist, _ = built_dist
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        licence = (
            tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/LICENSE")))
            .read()
            .decode()
        )
    traces = {str(p.relative_to(REPO)) for p in (REPO / "traces").rglob("*") if p.is_file()}
    assert traces and traces <= names, sorted(traces - names)[:5]
    assert {
        "LICENSE",
        "NOTICE",
        "pyproject.toml",
        "uv.lock",
        "README.md",
        "dags/spot_ml_pipeline.py",
        "flows/spot_ml_pipeline.py",
        # the workspace's second member (uv.lock names it): the tests need it
        "emulators/pyproject.toml",
        "emulators/spot_emulators/kubernetes/__init__.py",
    } <= names
    assert "Apache License" in licence and "END OF TERMS AND CONDITIONS" in licence


def test_the_wheel_declares_open_engine_bounds_and_carries_its_data(built_dist):
    _, wheel = built_dist
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        meta = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert any(r.startswith("Requires-Dist: apache-airflow>=3.3;") for r in requires), requires
    assert any(r.startswith("Requires-Dist: prefect>=3.9;") for r in requires), requires
    assert not any("<" in r for r in requires if "airflow>" in r or "prefect>" in r)
    assert "License-Expression: Apache-2.0" in meta
    assert {"License-File: LICENSE", "License-File: NOTICE"} <= set(meta.splitlines())
    assert {
        "airflow_spot/example_dags/spot_ml_pipeline.py",
        "prefect_spot/example_flows/spot_ml_pipeline.py",
        "spot_core/market/data/aws-v100-2023-02-excerpt/spot_prices.json",
        "spot_core/market/data/NOTICE",
        # the local cloud's own parts, product code
        "spot_core/localcloud/metadata.py",
        "spot_core/localcloud/lease_processes.py",
    } <= names
    # The emulators are the separate distribution spot-pipelines-emulators, an extra:
    # never in the wheel every Airflow worker installs.
    assert not [n for n in names if "emulators" in n.split("/")[0] or "/emulators/" in n]
    assert "Requires-Dist: spot-pipelines-emulators; extra == 'emulators'" in requires


def test_the_demo_runs_from_the_installed_wheel_alone(clean_installs, tmp_path):
    """The main job with nothing but the wheel: its trace excerpt is package data. The
    Kubernetes demo needs the [emulators] extra, and says so in one line."""
    python = clean_installs.python("aws")
    refused = subprocess.run(
        [str(python.parent / "spot-pipelines"), "demo", "--provider", "kubernetes"],
        cwd=tmp_path,
        env=_isolated_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "spot-pipelines demo: error: --provider kubernetes runs on the Kubernetes emulator, "
        'which is not installed: pip install "spot-pipelines[emulators]"'
    ]
    out = run(
        python.parent / "spot-pipelines",
        "demo",
        "--json",
        cwd=tmp_path,
        env=_isolated_env(tmp_path),
        timeout=240,
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert result["preemptions"] >= 1 and result["attempts"] >= 2
    assert result["final_weights_sha256"] == result["uninterrupted_weights_sha256"]


def test_the_airflow_extra_installs_clean_lists_the_provider_and_parses_the_dag(
    clean_installs, tmp_path
):
    python = clean_installs.python("airflow")
    listed = run(
        python.parent / "airflow",
        "providers",
        "list",
        "--output",
        "json",
        cwd=tmp_path,
        env=_isolated_env(tmp_path),
    )
    providers = json.loads(listed[listed.index("[") :])
    assert any(p["package_name"] == "spot-pipelines" for p in providers)
    parsed = _python_json(
        python,
        (
            "import json; from airflow_spot.demo import DAGS_FOLDER as folder\n"
            "from airflow.dag_processing.dagbag import DagBag\n"
            "bag = DagBag(dag_folder=str(folder))\n"
            "print(json.dumps({'folder': str(folder), 'dags': sorted(bag.dag_ids),\n"
            "                  'errors': {k: str(v) for k, v in bag.import_errors.items()}}))"
        ),
        tmp_path,
    )
    assert parsed["errors"] == {}
    assert "spot_ml_pipeline" in parsed["dags"]
    assert parsed["folder"].startswith(str(python.parent.parent)), "the wheel's copy"


def test_the_prefect_extra_installs_clean_and_knows_the_spot_worker_type(clean_installs, tmp_path):
    python = clean_installs.python("prefect")
    found = _python_json(
        python,
        (
            "import json; from prefect.workers.base import BaseWorker\n"
            "worker = BaseWorker.get_worker_class_from_type('spot')\n"
            "from prefect_spot.demo import FLOW_FILE, load_example_flows\n"
            "flow = load_example_flows().spot_ml_pipeline\n"
            "print(json.dumps({'worker': worker and f'{worker.__module__}.{worker.__name__}',\n"
            "                  'types': BaseWorker.get_all_available_worker_types(),\n"
            "                  'flow': flow.name, 'flow_file': str(FLOW_FILE)}))"
        ),
        tmp_path,
    )
    assert found["worker"] == "prefect_spot.workers.spot.SpotWorker", found
    assert "spot" in found["types"]
    assert found["flow_file"].startswith(str(python.parent.parent)), "the wheel's copy"
    help_text = run(
        python.parent / "prefect",
        "worker",
        "start",
        "--help",
        cwd=tmp_path,
        env=_isolated_env(tmp_path),
    )
    assert "--type" in help_text
    assert (
        "usage"
        in run(
            python.parent / "spot-pipelines", "--help", cwd=tmp_path, env=_isolated_env(tmp_path)
        ).lower()
    )
