"""A provider is one module and one entry point line: a package that registers a built-in
provider's plugin under a new name (``acme``, pointing at the local provider's) works in
the CLI, in SpotJobOperator and its trigger, and in the Prefect ``spot`` worker, with no
other change anywhere.

The package is built as a wheel here (one entry point line and an empty module) and
installed with the built spot-pipelines wheel into clean environments pinned to uv.lock,
as a user would install both (test_packaging.py builds the same way). Each environment
runs its check as a subprocess; nothing of the checkout is on its path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.dist_helpers import REPO, find_uv, run

pytestmark = pytest.mark.timeout(600)
CHECKS = Path(__file__).parent / "plugin_checks"
PYPROJECT = textwrap.dedent("""
    [build-system]
    requires = ["hatchling>=1.27"]
    build-backend = "hatchling.build"

    [project]
    name = "acme-spot"
    version = "1.0"
    dependencies = ["spot-pipelines"]

    # The whole registration: a new name for the local provider's plugin.
    [project.entry-points."spot_pipelines.providers"]
    acme = "spot_core.providers.local:LocalPlugin"
""")


@pytest.fixture(scope="module")
def acme_wheel(tmp_path_factory) -> Path:
    """The third-party package, built by ``uv build`` like any other."""
    source = tmp_path_factory.mktemp("acme-spot")
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "acme_spot").mkdir()
    (source / "acme_spot" / "__init__.py").write_text(
        '"""Acme capacity: the local cloud, under our own name."""\n'
    )
    out = source / "dist"
    run(find_uv(), "build", "--wheel", "--out-dir", out, source, cwd=source)
    return next(out.glob("*.whl"))


def _isolated_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT")
        and not k.startswith(("SPOT_", "AIRFLOW", "PREFECT"))
    }
    return {
        **env,
        "AIRFLOW_HOME": str(home / "airflow"),
        "PREFECT_HOME": str(home / "prefect"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }


@pytest.fixture
def with_acme(clean_installs, acme_wheel):
    """The session's clean environment of an extra (the built spot-pipelines wheel) with
    the acme wheel added; acme is removed after the test, so the packaging tests that
    share the environment see the spot-pipelines wheel alone."""
    added: list[Path] = []

    def install(extra: str) -> Path:
        python = clean_installs.python(extra)
        clean_installs.add(python, acme_wheel, *sorted({extra, "aws", "kubernetes"}))
        added.append(python)
        return python

    yield install
    for python in added:
        clean_installs.remove(python, "acme-spot")


def _helpers(tmp_path: Path) -> Path:
    """A path entry holding the tests' own helpers (``tests.support``: the Airflow task
    context, the Prefect process stack; the emulators it uses), never the checkout's packages:
    spot-pipelines comes from its wheel."""
    helpers = tmp_path / "helpers"
    (helpers / "tests").mkdir(parents=True)
    (helpers / "tests" / "__init__.py").write_text("")
    (helpers / "tests" / "support").symlink_to(REPO / "tests" / "support")
    (helpers / "spot_emulators").symlink_to(REPO / "emulators" / "spot_emulators")
    return helpers


def _last_json(python: Path, script: Path, workdir: Path, timeout: float = 420) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**_isolated_env(workdir), "PYTHONPATH": str(_helpers(workdir.parent))}
    done = subprocess.run(
        [str(python), str(script), str(workdir)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_new_name_for_a_provider_works_in_the_cli(with_acme, tmp_path):
    python = with_acme("aws")
    cli = python.parent / "spot-pipelines"
    listed = json.loads(run(cli, "providers", "--json", cwd=tmp_path, env=_isolated_env(tmp_path)))
    by_name = {p["name"]: p for p in listed["providers"]}
    assert list(by_name)[:3] == ["local", "ec2", "kubernetes"] and "acme" in by_name
    assert by_name["acme"]["capabilities"] == by_name["local"]["capabilities"]
    out = run(
        cli,
        "run",
        "--provider",
        "acme",
        "--time-scale",
        "60",
        "--json",
        "--",
        sys.executable,
        "-c",
        "pass",
        cwd=tmp_path,
        env=_isolated_env(tmp_path),
    )
    record = json.loads(out.strip().splitlines()[-1])
    assert record["status"] == "succeeded" and len(record["attempts"]) == 1
    refused = subprocess.run(
        [str(cli), "run", "--provider", "acmee", "--", "true"],
        cwd=tmp_path,
        env=_isolated_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        refused.returncode == 2 and "choose one of local, ec2, kubernetes, acme" in refused.stderr
    )


def test_a_new_name_for_a_provider_works_in_the_airflow_operator(with_acme, tmp_path):
    python = with_acme("airflow")
    found = _last_json(python, CHECKS / "airflow_operator.py", tmp_path / "work")
    assert found["summary"]["status"] == "succeeded", found
    assert found["trigger_providers"] and set(found["trigger_providers"]) == {"acme"}, found


def test_a_new_name_for_a_provider_works_in_the_prefect_worker(with_acme, tmp_path):
    python = with_acme("prefect")
    found = _last_json(python, CHECKS / "prefect_worker.py", tmp_path / "work")
    assert "acme" in found["enum"], found  # the work-pool form offers it
    assert found["state"] == "COMPLETED" and found["attempts"] == ["succeeded"], found


def test_the_checks_import_no_package_of_the_checkout(tmp_path):
    """What runs in the clean environments imports spot-pipelines from its wheel: the
    helpers' path entry holds test helpers only."""
    helpers = _helpers(tmp_path)
    names = {p.name for p in helpers.iterdir()}
    assert names == {"tests", "spot_emulators"}  # test code, no product
    assert {p.name for p in (helpers / "tests").iterdir()} == {"__init__.py", "support"}
    assert not names & {"spot_core", "airflow_spot", "prefect_spot"}
