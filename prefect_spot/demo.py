"""`spot-pipelines demo --engine prefect`: the example flow against a real Prefect server.

Starts a temporary Prefect server (SQLite, 127.0.0.1, stopped afterwards), runs
``flows/spot_ml_pipeline.py`` (prepare -> train on the trace-driven local spot cloud ->
evaluate), prints the report, and returns the DESIGN.md demo JSON with
``engine: "prefect"``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from unittest import mock

from spot_core.errors import ConfigError

# An installed wheel carries flows/ as prefect_spot/example_flows (pyproject's force-include);
# a clone has it at its top.
_PACKAGED_FLOWS = Path(__file__).resolve().parent / "example_flows"
FLOW_FILE = (
    _PACKAGED_FLOWS if _PACKAGED_FLOWS.is_dir() else Path(__file__).resolve().parents[1] / "flows"
) / "spot_ml_pipeline.py"


def load_example_flows(path: Path = FLOW_FILE) -> ModuleType:
    """The example flow module, loaded from its file (it is an example, not a package)."""
    if not path.exists():
        raise ConfigError(
            f"the example flow {path} is missing; reinstall spot-pipelines[prefect] "
            "or run the demo from a clone (`make demo ENGINE=prefect`)"
        )
    if "spot_ml_pipeline" in sys.modules:
        return sys.modules["spot_ml_pipeline"]
    spec = importlib.util.spec_from_file_location("spot_ml_pipeline", path)
    if spec is None or spec.loader is None:  # never for an existing .py file
        raise ConfigError(f"the example flow {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["spot_ml_pipeline"] = module
    spec.loader.exec_module(module)
    return module


def run_demo(*, workdir: Path | None = None, steps: int = 2000) -> dict:
    if steps < 200:
        raise ConfigError(
            f"--steps must be at least 200 (got {steps}) so the training step "
            "lives long enough to be preempted"
        )
    if workdir is not None:
        return _run(Path(workdir), steps)
    with tempfile.TemporaryDirectory(prefix="spot-demo-prefect-") as tmp:
        return _run(Path(tmp), steps)


def _run(workdir: Path, steps: int) -> dict:
    from prefect.testing.utilities import prefect_test_harness

    from spot_core.model import JobRecord
    from spot_core.report import print_record
    from spot_core.workloads.softmax_regression import TrainConfig, train

    workdir.mkdir(parents=True, exist_ok=True)
    flows = load_example_flows()
    print(
        f"pipeline (Prefect flow {flows.spot_ml_pipeline.name!r}): prepare data -> train "
        f"({steps} steps on spot, local cloud replaying a real AWS V100 trace at 1 s = 1 h) "
        "-> evaluate",
        flush=True,
    )
    reference = train(TrainConfig(steps=steps))
    started = time.monotonic()
    print("starting a temporary Prefect server (SQLite) ...", flush=True)
    with quiet_server(), prefect_test_harness(server_startup_timeout=120):
        result = flows.spot_ml_pipeline(workdir=str(workdir), steps=steps)
    record = JobRecord.from_dict(result["record"])
    print(f"flow finished in {time.monotonic() - started:.1f} s", flush=True)
    print_record(record, flows.DEMO_SPOT.provider_options.get("time_scale", 3600.0))
    report = demo_json(record, result, reference.weights_sha256)
    same = report["final_weights_sha256"] == report["uninterrupted_weights_sha256"]
    print(
        f"final weights  {report['final_weights_sha256']}\n"
        f"uninterrupted  {report['uninterrupted_weights_sha256']}  "
        f"{'(equal)' if same else '(DIFFERENT)'}\naccuracy {report['accuracy']:.3f}",
        flush=True,
    )
    return report


@contextlib.contextmanager
def quiet_server() -> Iterator[None]:
    """The demo's throwaway server without Prefect's telemetry: its heartbeat to Prefect
    (``PREFECT_SERVER_ANALYTICS_ENABLED``) wrote to the same SQLite file as the flow run and
    printed an 80-line "database is locked" traceback, or a "Failed to send telemetry"
    error offline; the client's own events (``DO_NOT_TRACK``) likewise. The settings go
    to the harness's server process through the environment, and come back after."""
    from prefect.settings import PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings

    with (
        mock.patch.dict(os.environ, QUIET_ENV),
        temporary_settings(updates={PREFECT_SERVER_ANALYTICS_ENABLED: False}),
    ):
        yield


QUIET_ENV = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}


def demo_json(record, result: dict, uninterrupted_sha: str) -> dict:
    from spot_core.report import demo_report

    return demo_report(
        "prefect",
        record,
        final_weights_sha256=result["final_weights_sha256"],
        uninterrupted_weights_sha256=uninterrupted_sha,
        accuracy=result["accuracy"],
    )
