"""The Airflow and Prefect images (and the step image's make-up) under a real engine.

Each check runs a container of the image as `make images` built it: Airflow lists the
provider and parses the example DAGs, Prefect knows the `spot` worker type, every image
runs as the shared non-root UID, keeps no build leftovers (/dist) and, where it serves,
declares a HEALTHCHECK.
"""

from __future__ import annotations

import json

import pytest

from tests.support import REPO

pytestmark = pytest.mark.timeout(300)

SHARED_UID = "50000"


def _run(
    engine, image: str, *command: str, entrypoint: str | None = None, volumes: tuple[str, ...] = ()
) -> str:
    argv = ["run", "--rm", "--network", "host", "-e", "AIRFLOW__CORE__LOAD_EXAMPLES=False"]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    for volume in volumes:
        argv += ["-v", volume]
    done = engine.docker(*argv, image, *command, timeout=240)
    assert done.returncode == 0, f"{image} {command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


def _config(engine, image: str, field: str = "") -> dict:
    """The image's config, or one ``field`` of it (podman's own CLI for podman: its Docker
    API leaves the healthcheck out)."""
    run = engine.podman if engine.kind == "podman" else engine.docker
    done = run("image", "inspect", image, "--format", f"{{{{json .Config{field}}}}}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) or {}


def test_airflow_lists_the_provider_and_parses_the_example_dags(engine, images):
    airflow = images.airflow
    providers = json.loads(
        _run(engine, airflow, "airflow", "providers", "list", "--output", "json")
    )
    assert any(p["package_name"] == "spot-pipelines" for p in providers), providers
    parsed = json.loads(
        _run(
            engine,
            airflow,
            "python",
            "-c",
            _PARSE_DAGS,
            volumes=(f"{REPO / 'dags'}:/opt/airflow/dags:ro",),
        ).splitlines()[-1]
    )
    assert not parsed["errors"], parsed["errors"]
    assert {"spot_first_task", "spot_ml_pipeline"} <= set(parsed["dags"]), parsed


_PARSE_DAGS = """
import json
from airflow.dag_processing.dagbag import DagBag
bag = DagBag("/opt/airflow/dags")
print(json.dumps({"dags": sorted(bag.dag_ids), "errors": bag.import_errors}))
"""


def test_the_spot_worker_type_is_known_in_the_prefect_image(engine, images):
    prefect = images.prefect
    out = _run(engine, prefect, "python", "-c", _WORKER_TYPE)
    assert out.strip().splitlines()[-1] == "prefect_spot.workers.spot.SpotWorker", out
    help_text = _run(engine, prefect, "prefect", "worker", "start", "--help")
    assert "--type" in help_text


_WORKER_TYPE = """
from prefect.plugins import load_prefect_collections
from prefect.workers.base import BaseWorker
load_prefect_collections()
worker = BaseWorker.get_worker_class_from_type("spot")
print(f"{worker.__module__}.{worker.__name__}")
"""


@pytest.mark.parametrize("name", ["step", "airflow", "prefect"])
def test_each_image_runs_as_the_shared_non_root_uid_and_keeps_no_dist(engine, images, name):
    image = getattr(images, name)
    out = _run(
        engine, image, "-c", "id -u; id -g; test ! -e /dist && echo no-dist", entrypoint="/bin/sh"
    )
    uid, gid, dist = out.split()
    assert (uid, gid, dist) == (SHARED_UID, "0", "no-dist"), out
    labels = _config(engine, image).get("Labels") or {}
    assert labels.get("io.spot-pipelines.inputs-sha256"), labels


def test_images_that_serve_declare_a_healthcheck(engine, images):
    step, airflow, prefect = images.step, images.airflow, images.prefect
    assert not _config(engine, step, ".Healthcheck").get("Test")
    for image in (airflow, prefect):
        check = _config(engine, image, ".Healthcheck")
        assert check.get("Test") == ["CMD", "/opt/spot-pipelines/healthcheck"], (image, check)


def test_the_images_install_what_uv_lock_pins(engine, images):
    """boto3 and the engines are uv.lock's versions in every image (constraints exported
    from the lock), not whatever the index served the day of the build."""
    import tomllib

    lock = {
        p["name"]: p["version"]
        for p in tomllib.loads((REPO / "uv.lock").read_text())["package"]
        if p["name"] in ("boto3", "apache-airflow", "prefect")
    }
    versions = "from importlib.metadata import version as v; print(v('boto3'), v('{}'))"
    step, airflow, prefect = images.step, images.airflow, images.prefect
    assert (
        _run(engine, step, "python", "-c", versions.format("boto3")).split() == [lock["boto3"]] * 2
    )
    assert _run(engine, airflow, "python", "-c", versions.format("apache-airflow")).split() == [
        lock["boto3"],
        lock["apache-airflow"],
    ]
    assert _run(engine, prefect, "python", "-c", versions.format("prefect")).split() == [
        lock["boto3"],
        lock["prefect"],
    ]
