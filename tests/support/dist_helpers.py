"""Building this repository's sdist and wheel, and clean environments from uv.lock, with uv.

The packaging and EC2 bootstrap tests install the *built* package (never the checkout)
into fresh environments, so they test what a user gets from `pip install`. uv is the one
`make` installs (.venv-tools); ``UV`` names another. Environments resolve against the
versions in uv.lock (``uv export``), so they are reproducible and come from uv's cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT = 240


def find_uv() -> str:
    """The uv executable: $UV, the Makefile's .venv-tools/bin/uv, or uv on PATH."""
    for candidate in (
        os.environ.get("UV"),
        str(REPO / ".venv-tools" / "bin" / "uv"),
        shutil.which("uv"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError(
        "uv not found: run `make envs` (it installs .venv-tools/bin/uv) or set UV=/path/to/uv"
    )


def run(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = COMMAND_TIMEOUT
) -> str:
    """Run a command; its stdout, or an AssertionError carrying its output."""
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, args))} exited {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def build_dist(out: Path) -> tuple[Path, Path]:
    """(sdist, wheel) built by ``uv build`` (the wheel from the sdist, as a user's would be)."""
    run(find_uv(), "build", "--out-dir", out, REPO, cwd=REPO)
    return next(out.glob("*.tar.gz")), next(out.glob("*.whl"))


def locked_requirements(out: Path, *extras: str) -> Path:
    """The lock's versions for the core plus ``extras`` (no project, no test group), as a
    requirements file usable as constraints or requirements."""
    path = out / f"locked-{'-'.join(extras) or 'core'}.txt"
    extra_args = [arg for extra in extras for arg in ("--extra", extra)]
    run(
        find_uv(),
        "export",
        "--frozen",
        "--no-hashes",
        "--no-emit-project",
        "--no-dev",
        "--no-header",
        "--no-annotate",
        *extra_args,
        "--output-file",
        path,
        cwd=REPO,
    )
    return path


def clean_venv(path: Path, *, seed: bool = False) -> Path:
    """A fresh virtual environment on this Python (``seed``: with pip in it); its python."""
    args = ["venv", "--python", sys.executable, "--quiet"] + (["--seed"] if seed else [])
    run(find_uv(), *args, path)
    return path / "bin" / "python"


def uv_install(python: Path, *requirements: str, constraints: Path | None = None) -> None:
    extra = ["--constraint", str(constraints)] if constraints else []
    run(find_uv(), "pip", "install", "--quiet", "--python", python, *extra, *requirements)


class CleanInstalls:
    """The built wheel installed into one clean environment per extra (``wheel[extra]``
    with aws and kubernetes, every dependency at uv.lock's version), each made once, when
    a test first asks for it, and shared by the tests that check the installed package
    (test_packaging, test_provider_plugins: three builds instead of six). A test that adds
    a package (``add``) removes it again (``remove``), so the others see the wheel alone."""

    def __init__(self, root: Path, wheel: Path) -> None:
        self.root, self.wheel = root, wheel
        self._pythons: dict[str, Path] = {}

    def python(self, extra: str) -> Path:
        """The python of ``extra``'s environment (its folder is ``venv-<extra>``)."""
        if extra not in self._pythons:
            python = clean_venv(self.root / f"venv-{extra}")
            extras = sorted({extra, "aws", "kubernetes"})
            uv_install(python, f"{self.wheel}[{extra}]", constraints=self.constraints(*extras))
            self._pythons[extra] = python
        return self._pythons[extra]

    def constraints(self, *extras: str) -> Path:
        return locked_requirements(self.root, *extras)

    def add(self, python: Path, package: Path, *extras: str) -> None:
        uv_install(python, str(package), constraints=self.constraints(*extras))

    def remove(self, python: Path, name: str) -> None:
        run(find_uv(), "pip", "uninstall", "--python", python, name)
