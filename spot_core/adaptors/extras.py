"""Optional dependencies: which extra brings each, and one line naming it when missing.

The core installs without its SDKs and engines; each comes with an extra of
pyproject.toml. Whatever needs one imports it through ``require`` (or the command line
translates the ``ModuleNotFoundError``, ``explain``), so a missing extra is one line
saying what to install, never a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from spot_core.errors import ConfigError

AWS = "the ec2 provider and s3:// checkpoint stores"
# Top-level module -> (the package to name, the extra that installs it, what needs it).
OPTIONAL: dict[str, tuple[str, str, str]] = {
    "boto3": ("boto3", "aws", AWS),
    "botocore": ("boto3", "aws", AWS),  # boto3's own dependency
    "kubernetes": ("kubernetes", "kubernetes", "the kubernetes provider and detector"),
    "optuna": ("optuna", "sweeps", "sweeps (spot_core.sweeps, `demo --workload sweep`)"),
    "torch": ("torch", "torch", "the PyTorch checkpoint helpers (checkpoint.torch_state)"),
    "airflow": ("apache-airflow", "airflow", "the Airflow adapter (airflow_spot)"),
    "prefect": ("prefect", "prefect", "the Prefect adapter (prefect_spot)"),
}


def missing(module: str) -> ConfigError:
    """The one line for an optional ``module`` that is not installed."""
    package, extra, needs = OPTIONAL[module.split(".")[0]]
    return ConfigError(
        f"{needs} need {package}, which is not installed here: "
        f"pip install 'spot-pipelines[{extra}]'"
    )


def require(module: str) -> ModuleType:
    """Import an optional ``module`` (dotted names too) on first use; a ConfigError
    naming its extra when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(module) from exc


def explain(exc: ImportError) -> ConfigError | None:
    """The one line for an import of an optional module that failed, or None when the
    module that is missing is not an optional one (a bug or a broken install)."""
    name = exc.name or ""
    return missing(name) if name.split(".")[0] in OPTIONAL else None
