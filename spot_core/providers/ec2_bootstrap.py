"""Installing a pinned spot-pipelines on an EC2 instance at boot, for images that lack it.

An attempt's user-data runs the step under ``spot-pipelines watch`` and reports through
``python -m spot_core.providers.ec2_agent``, so the instance needs the package. A machine
image may carry it already (the quickest boot); otherwise the provider option
``bootstrap`` makes user-data install it first, from

- the package index: ``{"pip": "spot-pipelines[aws]==0.1.0"}`` (a pinned requirement), or
- a wheel in S3: ``{"wheel": "s3://bucket/dist/spot_pipelines-0.1.0-py3-none-any.whl"}``,
  fetched with the instance profile's credentials (it needs ``s3:GetObject`` on that
  key), never with any written into user-data;

into a new virtual environment (``venv``, default ``/opt/spot-pipelines``, created with
the image's ``python3`` and, by default, seeing the image's own packages, so a framework
the image ships, such as PyTorch, stays importable by the step) or into the environment
of an interpreter the image already has (``python``, e.g. ``/opt/conda/bin/python``).
That environment's ``bin`` then leads ``PATH`` for the watcher, the agent and the step.

The install is bounded (``timeout_seconds``); if it fails, user-data says so on the
console and powers the instance off, and the attempt ends without a status report.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from spot_core.credentials import value_kind
from spot_core.errors import ConfigError

DEFAULT_VENV = "/opt/spot-pipelines"
DEFAULT_TIMEOUT_SECONDS = 900.0
BOOTSTRAP_LOG = "/var/log/spot-pipelines-bootstrap.log"
KEYS = ("pip", "wheel", "venv", "python", "system_site_packages", "pip_args", "timeout_seconds")
EXAMPLE = (
    '{"pip": "spot-pipelines[aws]==0.1.0"} or '
    '{"wheel": "s3://bucket/spot_pipelines-0.1.0-py3-none-any.whl"}'
)
# A pinned requirement on this package, extras allowed: `spot-pipelines[aws]==0.1.0`.
PINNED = re.compile(
    r"spot[-_.]pipelines(\[[A-Za-z0-9_,.\s-]+\])?\s*==\s*[0-9][A-Za-z0-9.+!_-]*", re.I
)
# A wheel file name (PEP 427): name-version(-build)?-python-abi-platform.whl
WHEEL_NAME = re.compile(r"[A-Za-z0-9_.]+-[0-9][^-]*(-[0-9][^-]*)?-[^-]+-[^-]+-[^-]+\.whl")
# The wheel fetch runs in the target environment's Python: boto3 finds the instance
# profile's credentials itself; SPOT_S3_ENDPOINT_URL (tests, S3-compatible stores) is honoured.
FETCH = (
    'import os, sys, boto3; bucket, _, key = sys.argv[1][len("s3://"):].partition("/"); '
    's3 = boto3.client("s3", endpoint_url=os.environ.get("SPOT_S3_ENDPOINT_URL") or None); '
    "s3.download_file(bucket, key, sys.argv[2])"
)


@dataclass(frozen=True)
class Bootstrap:
    """What to install at boot and where; ``from_plain`` checks a provider option value."""

    pip: str | None = None
    wheel: str | None = None
    venv: str | None = DEFAULT_VENV
    python: str | None = None
    system_site_packages: bool = True
    pip_args: tuple[str, ...] = ()
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS

    @classmethod
    def from_plain(cls, value: Any) -> Bootstrap | None:
        """The checked bootstrap of a ``bootstrap`` provider option (None: the image has
        spot-pipelines); one-line ConfigError naming the fix otherwise."""
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError(f"ec2 provider option bootstrap must be a mapping, e.g. {EXAMPLE}")
        unknown = sorted(set(value) - set(KEYS))
        if unknown:
            raise ConfigError(f"unknown bootstrap key(s) {unknown}; choose from {list(KEYS)}")
        _refuse_credentials(value)
        nulls = [
            key for key in ("pip", "wheel", "venv", "python") if key in value and value[key] is None
        ]
        if nulls:
            raise ConfigError(
                f"bootstrap {nulls[0]} is null: give it a value or leave the key out, "
                f"e.g. {EXAMPLE}"
            )
        if ("pip" in value) == ("wheel" in value):
            raise ConfigError(f"bootstrap needs exactly one of 'pip' or 'wheel', e.g. {EXAMPLE}")
        if "venv" in value and "python" in value:
            raise ConfigError(
                "bootstrap takes 'venv' (a new environment to create) or 'python' "
                "(an interpreter whose environment gets the package), not both"
            )
        boot = cls(
            pip=value.get("pip"),
            wheel=value.get("wheel"),
            venv=None if "python" in value else value.get("venv", DEFAULT_VENV),
            python=value.get("python"),
            system_site_packages=value.get("system_site_packages", True),
            pip_args=_pip_args(value.get("pip_args", ())),
            timeout_seconds=value.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS),
        )
        boot._check()
        return boot

    def _check(self) -> None:
        if (
            self.pip is not None
            and _rendered(self.pip)
            and not (isinstance(self.pip, str) and PINNED.fullmatch(self.pip.strip()))
        ):
            raise ConfigError(
                f"bootstrap pip={self.pip!r} must pin spot-pipelines, e.g. "
                "'spot-pipelines[aws]==0.1.0' (the same version as the driver's)"
            )
        if self.wheel is not None and _rendered(self.wheel):
            _check_wheel_uri(self.wheel)
        for name in ("venv", "python"):
            path = getattr(self, name)
            if (
                path is not None
                and _rendered(path)
                and not (isinstance(path, str) and PurePosixPath(path).is_absolute())
            ):
                raise ConfigError(
                    f"bootstrap {name}={path!r} must be an absolute path on the "
                    "instance, e.g. '/opt/spot-pipelines'"
                )
        if not isinstance(self.system_site_packages, bool):
            raise ConfigError(
                f"bootstrap system_site_packages={self.system_site_packages!r} "
                "must be true or false"
            )
        seconds = self.timeout_seconds
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise ConfigError(
                f"bootstrap timeout_seconds={seconds!r} must be a number of seconds > 0, e.g. 900"
            )

    @property
    def bin_dir(self) -> str:
        """Where the installed ``spot-pipelines`` and the environment's ``python3`` live."""
        if self.python is not None:
            return str(PurePosixPath(self.python).parent)
        if self.venv is None:  # built directly with neither (from_plain refuses a null)
            raise TypeError("bootstrap has neither venv nor python (expected a path, not None)")
        return str(PurePosixPath(self.venv) / "bin")

    def install_lines(self) -> list[str]:
        """The commands that install the package; ``pip_args`` go to every pip install."""
        py = shlex.quote(self.python or f"{self.venv}/bin/python")
        pip = " ".join(
            [
                f"{py} -m pip install --quiet --disable-pip-version-check",
                *map(shlex.quote, self.pip_args),
            ]
        )
        lines = []
        if self.venv is not None:
            site = " --system-site-packages" if self.system_site_packages else ""
            lines.append(f"python3 -m venv{site} {shlex.quote(self.venv)}")
        if self.pip is not None:
            lines.append(f"{pip} {shlex.quote(self.pip.strip())}")
        else:
            if self.wheel is None:  # built directly with neither (from_plain refuses a null)
                raise TypeError("bootstrap has neither pip nor wheel (expected a path, not None)")
            wheel = '"$dir"/' + shlex.quote(PurePosixPath(self.wheel).name)
            lines += [
                f"{py} -c 'import boto3' 2>/dev/null || {pip} boto3",
                'dir="$(mktemp -d)"',
                f"{py} -c {shlex.quote(FETCH)} {shlex.quote(self.wheel)} {wheel}",
                f"{pip} {wheel}'[aws]'",
            ]  # the agent writes its status report to S3
        lines.append(f"{shlex.quote(self.bin_dir)}/spot-pipelines --help > /dev/null")
        return lines

    def shell(self, shutdown_command: str) -> str:
        """The user-data lines: install (bounded, logged to the console and a file), then
        put the environment first on PATH; on failure say so and power off."""
        body = "\n".join(f"    {line}" for line in ["set -euo pipefail", *self.install_lines()])
        seconds = f"{self.timeout_seconds:g}"
        return f"""# Bootstrap: install spot-pipelines (the machine image lacks it).
spot_bootstrap() {{
{body}
}}
export -f spot_bootstrap
BOOTSTRAP_LOG="${{SPOT_BOOTSTRAP_LOG:-{BOOTSTRAP_LOG}}}"
if ! (set -o pipefail
      timeout {seconds} bash -c spot_bootstrap 2>&1 | tee -a "$BOOTSTRAP_LOG"); then
    echo "spot-pipelines bootstrap failed or took over {seconds}s; see $BOOTSTRAP_LOG" >&2
    {shutdown_command}
    exit 1
fi
export PATH={shlex.quote(self.bin_dir)}:"$PATH"
"""


def _rendered(text: Any) -> bool:
    """False for a value still holding an engine template (``{{ ... }}``): checked once rendered."""
    return not (isinstance(text, str) and "{{" in text)


def _check_wheel_uri(uri: Any) -> None:
    if (
        not isinstance(uri, str)
        or not uri.startswith("s3://")
        or any(c.isspace() or not c.isprintable() for c in uri)
    ):
        raise ConfigError(
            f"bootstrap wheel={uri!r} must be an s3:// URI of a wheel (no "
            "spaces or control characters), e.g. "
            "'s3://bucket/dist/spot_pipelines-0.1.0-py3-none-any.whl'"
        )
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket or not WHEEL_NAME.fullmatch(PurePosixPath(key).name or "-"):
        raise ConfigError(
            f"bootstrap wheel={uri!r} must name a wheel file as built "
            "(`uv build`), e.g. s3://bucket/dist/spot_pipelines-0.1.0-py3-none-any.whl"
        )


def _pip_args(value: Any) -> tuple[str, ...]:
    if (
        isinstance(value, str)
        or not isinstance(value, (list, tuple))
        or not all(isinstance(a, str) and a for a in value)
    ):
        raise ConfigError(
            f"bootstrap pip_args={value!r} must be a list of pip arguments, e.g. "
            "['--index-url', 'https://pypi.example.com/simple']"
        )
    return tuple(value)


def _refuse_credentials(value: Mapping[str, Any]) -> None:
    """User-data is readable by anyone with ec2:DescribeInstanceAttribute: no credential in
    a URI or a pip argument (a private index takes the instance profile or a netrc the
    image provides)."""
    texts = [(key, item) for key, item in value.items() if isinstance(item, str)]
    texts += [("pip_args", a) for a in value.get("pip_args", ()) if isinstance(a, str)]
    for key, text in texts:
        kind = value_kind(text)
        if kind:
            raise ConfigError(
                f"bootstrap {key} holds {kind}, which would be written into EC2 "
                "user-data; give the instance access through its profile or a "
                "pip configuration in the image instead"
            )
