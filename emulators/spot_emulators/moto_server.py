"""moto in server mode, started and stopped by tests and benchmarks alike.

EC2, S3, SQS, STS and IAM cannot run here for real, so the tests and benchmarks talk to
``moto_server``: a real HTTP endpoint the unmodified boto3 clients reach, one process per
test session or benchmark. ``running_moto`` starts it on a free port of 127.0.0.1, waits
(bounded) until it answers, and stops it however the block ends; the server also gets
SIGTERM if the process that started it dies (Linux), so a killed run leaves none behind.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT = 60.0  # seconds: a loaded 2-core machine imports moto in a few


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]  # (host, port) of an AF_INET socket
        return port


@contextmanager
def running_moto(log: Path | None = None) -> Iterator[str]:
    """A ``moto_server`` of its own; its URL. Output to ``log`` (default: discarded)."""
    port = free_port()
    binary = Path(sys.executable).with_name("moto_server")
    command = [str(binary)] if binary.exists() else [sys.executable, "-m", "moto.server"]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            [*command, "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
    finally:
        if not isinstance(out, int):  # our log file, not DEVNULL
            out.close()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_it_answers(proc, url, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# What a process needs to talk to a moto server as if it were AWS: throwaway credentials
# (moto accepts any), a region, and no user's own AWS files.
FAKE_AWS_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_CONFIG_FILE": "/dev/null",
}


@contextmanager
def moto_s3_bucket(bucket: str) -> Iterator[str]:
    """A moto server of its own with ``bucket`` made, for a benchmark's S3 store; its URL.

    This process's environment is pointed at it for good (the fake credentials above and
    ``SPOT_S3_ENDPOINT_URL``), so the stores and the steps it starts reach it."""
    import os

    import boto3

    os.environ.update(FAKE_AWS_ENVIRONMENT)
    with running_moto() as endpoint:
        os.environ["SPOT_S3_ENDPOINT_URL"] = endpoint
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint


def _wait_until_it_answers(proc: subprocess.Popen[bytes], url: str, log: Path | None) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log is not None else ""
                raise RuntimeError(f"moto_server did not start: {tail}") from None
            time.sleep(0.1)


def die_with_parent() -> None:
    """``preexec_fn``: SIGTERM to the server when its parent dies, even by SIGKILL."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
