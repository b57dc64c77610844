"""``python -m prefect_spot._remote CALL_URI``: the call, result and error go through an
object store (file:// here; s3:// in the EC2 tests), keyed by attempt."""

from __future__ import annotations

import subprocess
import sys

import cloudpickle
import pytest

from prefect_spot._remote import CallExchange, call_uri, error_key, main, result_key


def add(a: int, b: int) -> int:
    return a + b


def broken(column: str) -> None:
    raise KeyError(f"no such column: {column}")


def _exchange(tmp_path, fn, *args) -> CallExchange:
    exchange = CallExchange.open(call_uri((tmp_path / "ckpt").as_uri()))
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        exchange.put_payload(cloudpickle.dumps({"fn": fn, "args": args, "kwargs": {},
                                                "checkpointer": {}}))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    return exchange


def test_result_is_written_under_the_attempt(tmp_path, monkeypatch):
    exchange = _exchange(tmp_path, add, 2, 3)
    assert exchange.uri == (tmp_path / "ckpt" / "call").as_uri()
    monkeypatch.setenv("SPOT_ATTEMPT", "3")
    assert main([exchange.uri]) == 0
    assert exchange.result(3) == 5
    assert (tmp_path / "ckpt" / "call" / result_key(3)).is_file()
    with pytest.raises(FileNotFoundError):
        exchange.result(2)  # another attempt's outcome is never mistaken for this one's
    assert exchange.error(3) is None


def test_error_is_reported_with_its_exception(tmp_path, monkeypatch):
    exchange = _exchange(tmp_path, broken, "price")
    monkeypatch.setenv("SPOT_ATTEMPT", "1")
    assert main([exchange.uri]) == 1
    report = exchange.error(1)
    assert isinstance(report["error"], KeyError) and "no such column" in report["traceback"]


def test_a_call_that_cannot_be_loaded_is_reported_not_just_an_exit_code(tmp_path):
    exchange = CallExchange.open(call_uri((tmp_path / "ckpt").as_uri()))
    exchange.backend.put_bytes("payload.pkl", b"not a pickle")
    proc = subprocess.run([sys.executable, "-m", "prefect_spot._remote", exchange.uri],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" in exchange.error(1)["traceback"]
    assert (tmp_path / "ckpt" / "call" / error_key(1)).is_file()


def test_usage_error_without_a_call_uri():
    assert main([]) == 2
