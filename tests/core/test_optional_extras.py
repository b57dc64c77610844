"""An optional dependency a command needs and the install lacks is one line naming the
extra to install (exit 2), never a ``ModuleNotFoundError`` traceback.

Each command runs as the real CLI in a process where the optional modules cannot be
imported (a finder at the head of ``sys.meta_path`` refuses them, as an install without
the extra would), so the whole path from argument parsing to the first import is the
one a user takes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from spot_core.adaptors import extras

REPO = Path(__file__).resolve().parents[2]

# The real CLI, with `SPOT_BLOCKED` (comma-separated top-level modules) not installed.
WITHOUT = textwrap.dedent(
    """
    import importlib.abc, os, sys

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in os.environ["SPOT_BLOCKED"].split(","):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Missing())
    from spot_core.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)
AWS = ("boto3", "botocore")
EC2 = (
    "--provider=ec2",
    "--checkpoint-uri=s3://bucket/jobs/train",
    "--subnets=subnet-0123456789abcdef0",
    "--instance-types=m5.large",
    "--image-id=ami-0123456789abcdef0",
    "--region=us-east-1",
)


def _without(modules: tuple[str, ...], *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, *argv],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**os.environ, "SPOT_BLOCKED": ",".join(modules)},
    )


@pytest.mark.parametrize(
    ("modules", "argv", "extra"),
    [
        pytest.param(("optuna",), ("demo", "--workload", "sweep"), "sweeps", id="sweep-demo"),
        pytest.param(
            AWS, ("run", "--checkpoint-uri", "s3://bucket/jobs/train", "--", "true"), "aws", id="s3"
        ),
        pytest.param(
            AWS,
            ("run", "--heartbeat-uri", "s3://bucket/beats/driver", "--", "true"),
            "aws",
            id="s3-heartbeat",
        ),
        pytest.param(AWS, ("run", *EC2, "--", "true"), "aws", id="ec2"),
        pytest.param(
            ("kubernetes",),
            ("run", "--provider=kubernetes", "--checkpoint-uri=s3://bucket/jobs/k", "--", "true"),
            "kubernetes",
            id="kubernetes-provider",
        ),
        pytest.param(
            ("kubernetes",),
            ("demo", "--provider", "kubernetes"),
            "kubernetes",
            id="kubernetes-demo",
        ),
        pytest.param(("airflow",), ("demo", "--engine", "airflow"), "airflow", id="airflow-demo"),
        pytest.param(("prefect",), ("demo", "--engine", "prefect"), "prefect", id="prefect-demo"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(modules, argv, extra, tmp_path):
    done = _without(modules, *argv, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert f"spot-pipelines[{extra}]" in lines[0], lines[0]


def test_every_extra_named_is_one_pyproject_declares_with_that_package():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for module, (package, extra, _) in extras.OPTIONAL.items():
        assert extra in declared, f"{module}: no extra {extra!r} in pyproject.toml"
        names = [requirement.split(">")[0].split("=")[0].strip() for requirement in declared[extra]]
        assert package in names, f"{module}: extra {extra!r} does not install {package}"
