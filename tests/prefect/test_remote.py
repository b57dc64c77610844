"""``python -m prefect_spot._remote CALL_URI``: the call, result and error go through an
object store (file:// here), keyed by attempt, each signed with the job's key; anything
that does not verify is refused before it is unpickled."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

from prefect_spot._remote import (
    CALL_KEY_ENV,
    CALL_PUBKEY_ENV,
    PAYLOAD_KEY,
    CallExchange,
    Ed25519Seal,
    UntrustedObject,
    call_uri,
    error_key,
    lease_seals,
    main,
    new_call_key,
    result_key,
    seal,
)
from spot_core.errors import ConfigError

KEY = new_call_key()


def add(a: int, b: int) -> int:
    return a + b


def broken(column: str) -> None:
    raise KeyError(f"no such column: {column}")


def _exchange(tmp_path, fn, *args, key: bytes = KEY) -> CallExchange:
    exchange = CallExchange.open(call_uri((tmp_path / "ckpt").as_uri()), key)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        exchange.put_payload(
            cloudpickle.dumps({"fn": fn, "args": args, "kwargs": {}, "checkpointer": {}})
        )
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    return exchange


def test_result_is_written_under_the_attempt(tmp_path, monkeypatch):
    exchange = _exchange(tmp_path, add, 2, 3)
    assert exchange.uri == (tmp_path / "ckpt" / "call").as_uri()
    monkeypatch.setenv("SPOT_ATTEMPT", "3")
    monkeypatch.setenv(CALL_KEY_ENV, KEY.hex())
    assert main([exchange.uri]) == 0
    assert exchange.result(3) == 5
    assert (tmp_path / "ckpt" / "call" / result_key(3)).is_file()
    with pytest.raises(FileNotFoundError):
        exchange.result(2)  # another attempt's outcome is never mistaken for this one's
    assert exchange.error(3) is None


def test_the_kubernetes_provider_finds_the_result_where_the_call_leaves_it(tmp_path, monkeypatch):
    """A pod that wrote its result and was then disrupted (its exit 0 cut short by the
    SIGTERM) counts as completed: the provider looks at the same key from the store root."""
    from spot_core.checkpoint import open_store
    from spot_core.providers.kubernetes import result_marker

    exchange = _exchange(tmp_path, add, 2, 3)
    monkeypatch.setenv("SPOT_ATTEMPT", "4")
    monkeypatch.setenv(CALL_KEY_ENV, KEY.hex())
    assert main([exchange.uri]) == 0
    store = open_store((tmp_path / "ckpt").as_uri())
    assert store.backend.exists(result_marker(4)) and not store.backend.exists(result_marker(3))


def test_error_is_reported_with_its_exception(tmp_path, monkeypatch):
    exchange = _exchange(tmp_path, broken, "price")
    monkeypatch.setenv("SPOT_ATTEMPT", "1")
    monkeypatch.setenv(CALL_KEY_ENV, KEY.hex())
    assert main([exchange.uri]) == 1
    report = exchange.error(1)
    assert isinstance(report["error"], KeyError) and "no such column" in report["traceback"]


def _run_remote(exchange: CallExchange, key: bytes | None = KEY):
    env = {k: v for k, v in os.environ.items() if k != CALL_KEY_ENV}
    if key is not None:
        env[CALL_KEY_ENV] = key.hex()
    return subprocess.run(
        [sys.executable, "-m", "prefect_spot._remote", exchange.uri],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_a_call_that_cannot_be_loaded_is_reported_not_just_an_exit_code(tmp_path):
    exchange = CallExchange.open(call_uri((tmp_path / "ckpt").as_uri()), KEY)
    exchange.put_payload(b"not a pickle")  # signed, but no pickle
    proc = _run_remote(exchange)
    assert proc.returncode == 1
    assert "Traceback" in exchange.error(1)["traceback"]
    assert (tmp_path / "ckpt" / "call" / error_key(1)).is_file()


def test_usage_error_without_a_call_uri():
    assert main([]) == 2


# -- nothing executes what it did not write ----------------------------------------------------
class WritesMarker:
    """A pickle that, when loaded, writes a file: what an attacker would plant."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (Path(self.path).write_text, ("pwned",))


def _plant(exchange: CallExchange, name: str, marker: Path, how: str) -> None:
    """Put a malicious pickle at ``name``: unsigned, signed with another job's key, or
    a genuinely signed object of another name (a replay)."""
    evil = pickle.dumps(WritesMarker(marker))
    if how == "unsigned":
        blob = evil
    elif how == "other job's key":
        blob = seal(new_call_key(), name, evil)
    elif how == "replayed from another name":
        blob = seal(KEY, "attempt-000009/result.pkl", evil)
    else:  # a signed object with its bytes changed
        blob = bytearray(seal(KEY, name, pickle.dumps("fine")))
        blob[-3:] = b"xx."
        blob = bytes(blob)
    exchange.backend.put_bytes(name, blob)


HOW = ["unsigned", "other job's key", "replayed from another name", "bytes changed"]


@pytest.mark.parametrize("how", HOW)
def test_a_forged_payload_is_refused_on_the_lease_and_never_runs(tmp_path, how):
    exchange = CallExchange.open(call_uri((tmp_path / "ckpt").as_uri()), KEY)
    marker = tmp_path / "marker"
    _plant(exchange, PAYLOAD_KEY, marker, how)
    proc = _run_remote(exchange)
    assert proc.returncode == 1
    assert not marker.exists()
    assert "refused unread" in proc.stderr and "Traceback" not in proc.stderr.split("error:")[-1]
    report = exchange.error(1)  # the lease's own signed report says why
    assert isinstance(report["error"], UntrustedObject)


@pytest.mark.parametrize("what", ["result", "error"])
@pytest.mark.parametrize("how", HOW)
def test_a_forged_result_or_error_is_refused_by_the_runner_before_unpickling(tmp_path, what, how):
    exchange = CallExchange.open(call_uri((tmp_path / "ckpt").as_uri()), KEY)
    marker = tmp_path / "marker"
    _plant(exchange, result_key(2) if what == "result" else error_key(2), marker, how)
    with pytest.raises(UntrustedObject, match="refused unread") as caught:
        exchange.result(2) if what == "result" else exchange.error(2)
    assert not marker.exists()
    assert "\n" not in str(caught.value) and "docs/aws.md" in str(caught.value)


def test_a_lease_without_the_key_runs_nothing(tmp_path):
    exchange = _exchange(tmp_path, add, 2, 3)
    proc = _run_remote(exchange, key=None)
    assert proc.returncode == 1
    assert f"{CALL_KEY_ENV} is missing" in proc.stderr
    with pytest.raises(FileNotFoundError):
        exchange.result(1)


def test_the_key_is_not_in_the_store_nor_passed_to_the_steps_children(tmp_path, monkeypatch):
    def child_env() -> str:
        return os.environ.get("SPOT_CALL_KEY", "absent")

    exchange = _exchange(tmp_path, child_env)
    monkeypatch.setenv("SPOT_ATTEMPT", "1")
    monkeypatch.setenv(CALL_KEY_ENV, KEY.hex())
    assert main([exchange.uri]) == 0
    assert exchange.result(1) == "absent"
    for path in (tmp_path / "ckpt").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert KEY not in data and KEY.hex().encode() not in data
    assert "SPOT_CALL_KEY" not in repr(exchange) and KEY.hex() not in repr(exchange)


def _ed25519_exchange(tmp_path, signer, verifier=None) -> CallExchange:
    return CallExchange.open(call_uri((tmp_path / "ckpt").as_uri()), signer, verify_with=verifier)


def test_remote_leases_need_no_secret_each_side_verifies_the_others_public_key(tmp_path):
    """EC2 scheme: the runner keeps its private key and sends the public half; the lease
    publishes its own public key (here to a list, on EC2 as a tag on its instance)."""
    runner = Ed25519Seal.generate()
    runner_side = _ed25519_exchange(tmp_path, runner)
    runner_side.put_payload(cloudpickle.dumps({"fn": len, "args": ("abc",), "kwargs": {}}))
    published: list[str] = []
    environ = {CALL_PUBKEY_ENV: runner.public_hex()}
    signer, verifier = lease_seals(environ, publish=published.append)
    assert CALL_PUBKEY_ENV not in environ and len(published) == 1
    lease_side = _ed25519_exchange(tmp_path, signer, verifier)
    assert lease_side.load_payload()["args"] == ("abc",)
    lease_side.put_result(1, 3)
    reading = runner_side.verifying_with(Ed25519Seal.from_public_hex(published[0], "tag"))
    assert reading.result(1) == 3
    with pytest.raises(UntrustedObject, match="does not verify"):
        runner_side.verifying_with(Ed25519Seal.generate()).result(1)


@pytest.mark.parametrize("how", ["unsigned", "another key", "hmac", "replayed", "bytes changed"])
def test_a_forged_ed25519_object_is_refused_before_unpickling(tmp_path, how):
    lease = Ed25519Seal.generate()
    reading = _ed25519_exchange(
        tmp_path, Ed25519Seal.generate(), Ed25519Seal.from_public_hex(lease.public_hex(), "tag")
    )
    marker, name = tmp_path / "marker", result_key(2)
    evil = pickle.dumps(WritesMarker(marker))
    blob = {
        "unsigned": lambda: evil,
        "another key": lambda: Ed25519Seal.generate().sign(name, evil),
        "hmac": lambda: seal(KEY, name, evil),
        "replayed": lambda: lease.sign(result_key(1), evil),
        "bytes changed": lambda: lease.sign(name, pickle.dumps("fine"))[:-3] + b"xx.",
    }[how]()
    reading.backend.put_bytes(name, blob)
    with pytest.raises(UntrustedObject, match="refused unread") as caught:
        reading.result(2)
    assert not marker.exists() and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "environ, message",
    [
        ({}, "SPOT_CALL_KEY is missing and so is SPOT_CALL_PUBKEY"),
        ({CALL_PUBKEY_ENV: "zz"}, "SPOT_CALL_PUBKEY is missing or not a 32-byte Ed25519"),
    ],
)
def test_a_lease_without_a_usable_key_says_which(environ, message):
    with pytest.raises(ConfigError, match=message):
        lease_seals(environ, publish=lambda _: None)
