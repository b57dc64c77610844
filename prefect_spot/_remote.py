"""What runs on the spot lease for a task submitted to ``SpotTaskRunner``.

``python -m prefect_spot._remote CALL_URI``: load the pickled call from the job's object
store, build a Checkpointer from the attempt's environment (restored from the latest
checkpoint if the function asks for one), turn SIGTERM into an emergency save, call the
function and write its result (or its error) back to the store, where the runner reads
it. Exit codes: 0 success, 143 preempted after the emergency save, 1 the function raised
(or its call could not be loaded here).

``CALL_URI`` is a store location (``file:///abs/path`` or ``s3://bucket/prefix``, by
default ``<job checkpoint URI>/call``). Under it:

- ``payload.pkl``: the cloudpickled call, written by the runner before the job starts;
- ``attempt-NNNNNN/result.pkl`` or ``attempt-NNNNNN/error.pkl``: what attempt N
  produced. Keyed by attempt, so a zombie of a reclaimed attempt can never overwrite (or
  be mistaken for) the outcome of the attempt that finished.

Every write is a backend ``put_bytes``, which is atomic (rename into place for files,
a single PUT for S3). Prefect is not imported here, so a relaunch costs a Python start,
NumPy and the user's own imports.

Nothing is unpickled that this job's engine or its own lease did not write: anyone who
can write to the store (a reclaimed node, another job's step) could otherwise run code
in the flow runner or in the step. Every object is signed over its location and bytes,
and an object that does not verify is refused (``UntrustedObject``) before ``pickle``
sees it. Two schemes, by where the lease runs:

- local lease: an HMAC-SHA256 under a random per-call key (``new_call_key``) that the
  runner holds in memory and hands to the lease in its environment (``SPOT_CALL_KEY``);
- remote lease (EC2, Kubernetes), where no channel carries a secret safely: Ed25519, no
  secret travels. The runner signs the payload with a per-call private key it keeps and
  gives the lease only the public key (``SPOT_CALL_PUBKEY``, user-data or the pod spec may
  hold it). The lease makes its own key pair, publishes its public key as the tag
  ``spot-pipelines/call-pubkey`` on its own instance (``ec2_agent.tag_own_instance``; the
  instance policy lets an instance tag only itself) or as that annotation on its own pod
  (``providers.kubernetes.annotate_own_pod``; the admission policy in
  deploy/kubernetes/rbac.yaml lets a step pod patch only itself) and signs its result or
  error with it; the runner reads it from the attempt's instance or pod and verifies.

The threat model is in docs/reliability.md ("Prefect").
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import os
import secrets
import sys
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import cloudpickle

from spot_core.attempt_env import PREEMPTED_EXIT_CODE, AttemptEnv
from spot_core.errors import ConfigError, Preempted, SpotError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

CHECKPOINTER_PARAMETER = "checkpointer"
CALL_PREFIX = "call"
PAYLOAD_KEY = "payload.pkl"
CALL_KEY_ENV = "SPOT_CALL_KEY"  # the per-job key, hex, in a local lease's environment
CALL_PUBKEY_ENV = "SPOT_CALL_PUBKEY"  # the runner's Ed25519 public key, hex (remote leases)
PUBKEY_TAG = "spot-pipelines/call-pubkey"  # the lease's public key, on its own instance
SIGNED_MAGIC = b"spot-hmac-sha256:"
ED25519_MAGIC = b"spot-ed25519:"
TAG_BYTES = hashlib.sha256().digest_size
SIGNATURE_BYTES = 64
KEY_BYTES = 32


class UntrustedObject(SpotError):
    """An object in the call exchange that this job's engine or lease did not write
    (no signature, a wrong one, or one made for another object): never unpickled."""


def new_call_key() -> bytes:
    """A fresh random key for one job's call exchange (held by the engine only)."""
    return secrets.token_bytes(KEY_BYTES)


def key_from_environ(environ=None) -> bytes:
    """The lease's copy of the job's key (``SPOT_CALL_KEY``), removed from the
    environment so the step's own child processes do not inherit it."""
    environ = os.environ if environ is None else environ
    text = environ.pop(CALL_KEY_ENV, "")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ConfigError(
            f"{CALL_KEY_ENV} is missing or not {KEY_BYTES} bytes of hex: this "
            "lease cannot verify its call; run it through SpotTaskRunner, "
            "which sets it"
        )
    return key


def lease_seals(environ=None, publish=None) -> tuple[Any, Any]:
    """The lease's (signer, verifier), taken out of the environment.

    Local: the job's HMAC key (``SPOT_CALL_KEY``) for both. Remote: the runner's public
    key (``SPOT_CALL_PUBKEY``) verifies the payload, and a fresh key pair of the lease's
    own signs its result or error; its public half is published on the lease's own
    instance by ``publish`` (default: the EC2 tag ``spot-pipelines/call-pubkey``)
    before anything is signed, so the runner can read it from there."""
    environ = os.environ if environ is None else environ
    if CALL_KEY_ENV in environ:
        key = key_from_environ(environ)
        return key, key
    text = environ.pop(CALL_PUBKEY_ENV, None)
    if text is None:
        raise ConfigError(
            f"{CALL_KEY_ENV} is missing and so is {CALL_PUBKEY_ENV}: this lease "
            "cannot verify its call; run it through SpotTaskRunner, which "
            "sets one"
        )
    verifier = Ed25519Seal.from_public_hex(text, CALL_PUBKEY_ENV)
    signer = Ed25519Seal.generate()
    (publish or _publish_on_own_instance)(signer.public_hex())
    return signer, verifier


def _publish_on_own_instance(public_hex: str) -> None:
    """On the lease's own capacity, by the provider that launched it (its plugin knows its
    leases: an EC2 instance's tag, a pod's annotation)."""
    from spot_core.jobs import publish_from_lease

    publish_from_lease(PUBKEY_TAG, public_hex, os.environ)


def _tag(key: bytes, name: str, data: bytes) -> bytes:
    """The HMAC of ``data`` bound to its location, so a signed result cannot be replayed
    as another attempt's result, as an error or as the payload."""
    return hmac.new(key, name.encode() + b"\0" + data, hashlib.sha256).digest()


def seal(key: bytes, name: str, data: bytes) -> bytes:
    return SIGNED_MAGIC + _tag(key, name, data) + data


def unseal(key: bytes, name: str, blob: bytes, where: str) -> bytes:
    """The signed bytes of ``blob`` if its HMAC verifies for ``name``, else UntrustedObject."""
    head = len(SIGNED_MAGIC) + TAG_BYTES
    if not blob.startswith(SIGNED_MAGIC) or len(blob) < head:
        raise _refused_unsigned(where, name)
    tag, data = blob[len(SIGNED_MAGIC) : head], blob[head:]
    if not hmac.compare_digest(tag, _tag(key, name, data)):
        raise _refused_bad(where, name, "this job's key")
    return data


def _refused_unsigned(where: str, name: str) -> UntrustedObject:
    return UntrustedObject(
        f"{where}/{name} is not signed by this job: refused unread "
        "(someone else wrote it to the store); check who can write "
        "there (docs/aws.md, instance policy)"
    )


def _refused_bad(where: str, name: str, whose: str) -> UntrustedObject:
    return UntrustedObject(
        f"{where}/{name} does not verify with {whose}: refused "
        "unread (tampered with, or written by another job or run); "
        "check who can write there (docs/aws.md, instance policy)"
    )


class HmacSeal:
    """Sign and verify with the per-call HMAC key (both sides hold it: local leases)."""

    def __init__(self, key: object) -> None:
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            raise ConfigError(
                f"a call exchange needs the job's {KEY_BYTES}-byte key "
                "(prefect_spot._remote.new_call_key())"
            )
        self._key = key

    def sign(self, name: str, data: bytes) -> bytes:
        return seal(self._key, name, data)

    def verify(self, name: str, blob: bytes, where: str) -> bytes:
        return unseal(self._key, name, blob, where)


def _message(name: str, data: bytes) -> bytes:
    """What an Ed25519 signature covers: the object's location and its bytes, so a
    genuine signature cannot be replayed as another attempt's result or as the payload."""
    return name.encode() + b"\0" + data


class Ed25519Seal:
    """Sign with a private key this process made and keeps, or verify with a public key
    received from the other side; the public half alone cannot sign, so it may travel in
    user-data or a tag."""

    def __init__(
        self,
        private_key: Ed25519PrivateKey | None = None,
        public_key: Ed25519PublicKey | None = None,
    ) -> None:
        if public_key is None:
            if private_key is None:
                raise ConfigError("an Ed25519Seal needs a private or a public key")
            public_key = private_key.public_key()
        self._private = private_key
        self._public = public_key

    @classmethod
    def generate(cls) -> Ed25519Seal:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(private_key=Ed25519PrivateKey.generate())

    @classmethod
    def from_public_hex(cls, text: str, what: str) -> Ed25519Seal:
        """A verifier from a hex public key; ConfigError naming ``what`` if malformed."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            raw = bytes.fromhex(text or "")
            return cls(public_key=Ed25519PublicKey.from_public_bytes(raw))
        except ValueError:
            raise ConfigError(
                f"{what} is missing or not a 32-byte Ed25519 public key in hex: "
                "nothing signed with it can be verified"
            ) from None

    def public_hex(self) -> str:
        from cryptography.hazmat.primitives import serialization

        return self._public.public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        ).hex()

    def sign(self, name: str, data: bytes) -> bytes:
        if self._private is None:
            raise ConfigError(
                "this side holds only the other side's public key: it "
                "cannot sign (a bug in the call exchange's wiring)"
            )
        return ED25519_MAGIC + self._private.sign(_message(name, data)) + data

    def verify(self, name: str, blob: bytes, where: str) -> bytes:
        from cryptography.exceptions import InvalidSignature

        head = len(ED25519_MAGIC) + SIGNATURE_BYTES
        if not blob.startswith(ED25519_MAGIC) or len(blob) < head:
            raise _refused_unsigned(where, name)
        signature, data = blob[len(ED25519_MAGIC) : head], blob[head:]
        try:
            self._public.verify(signature, _message(name, data))
        except InvalidSignature:
            raise _refused_bad(where, name, "the signer's public key") from None
        return data


def wants_checkpointer(fn) -> bool:
    return CHECKPOINTER_PARAMETER in inspect.signature(fn).parameters


def call_uri(checkpoint_uri: str) -> str:
    """Where the call of the job checkpointing at ``checkpoint_uri`` is exchanged."""
    return f"{checkpoint_uri.rstrip('/')}/{CALL_PREFIX}"


def result_key(attempt: int) -> str:
    return f"attempt-{attempt:06d}/result.pkl"


def error_key(attempt: int) -> str:
    return f"attempt-{attempt:06d}/error.pkl"


def _as_seal(key: Any) -> Any:
    return HmacSeal(key) if isinstance(key, (bytes, bytearray, str)) or key is None else key


class CallExchange:
    """The payload, results and errors of one job's call, in an object backend, each
    signed by its writer and verified before it is unpickled.

    ``key`` signs what this side writes: the job's HMAC key (bytes) or an
    ``Ed25519Seal`` holding a private key. ``verify_with`` checks what the other side
    wrote (default: ``key``, right for HMAC, where both sides hold the same key)."""

    def __init__(self, backend, uri: str, key: Any, *, verify_with: Any = None) -> None:
        self.backend = backend
        self.uri = uri
        self._signer = _as_seal(key)
        self._verifier = self._signer if verify_with is None else _as_seal(verify_with)

    @classmethod
    def open(cls, uri: str, key: Any, *, verify_with: Any = None, **options: Any) -> CallExchange:
        """The exchange at ``uri`` under the job's ``key``; ``options`` go to the S3
        backend (endpoint, region...)."""
        from spot_core.checkpoint import open_store

        store = open_store(uri, **options)
        return cls(store.backend, store.uri, key, verify_with=verify_with)

    def verifying_with(self, verifier: Any) -> CallExchange:
        """This exchange, reading what is verified by ``verifier`` (the lease's public
        key, known only once the lease has published it)."""
        return CallExchange(self.backend, self.uri, self._signer, verify_with=verifier)

    def __repr__(self) -> str:
        return f"CallExchange({self.uri!r})"  # never the key

    def _put(self, name: str, data: bytes) -> None:
        self.backend.put_bytes(name, self._signer.sign(name, data))

    def _load(self, name: str) -> Any:
        """Verify, then unpickle (FileNotFoundError if there is nothing at ``name``)."""
        data = self._verifier.verify(name, self.backend.get_bytes(name), self.uri)
        return cloudpickle.loads(data)

    def put_payload(self, data: bytes) -> None:
        self._put(PAYLOAD_KEY, data)

    def load_payload(self) -> dict[str, Any]:
        return self._load(PAYLOAD_KEY)

    def put_result(self, attempt: int, value: Any) -> None:
        self._put(result_key(attempt), cloudpickle.dumps(value))

    def put_error(self, attempt: int, exc: BaseException | None, text: str) -> None:
        try:
            blob = cloudpickle.dumps({"error": exc, "traceback": text})
        except Exception:  # noqa: BLE001 - an unpicklable error still reports its text
            blob = cloudpickle.dumps({"error": None, "traceback": text})
        self._put(error_key(attempt), blob)

    def result(self, attempt: int) -> Any:
        """Attempt ``attempt``'s return value (FileNotFoundError if it wrote none;
        UntrustedObject if what is there does not verify)."""
        return self._load(result_key(attempt))

    def clear(self, attempts: Iterable[int]) -> None:
        """Delete the payload (the pickled arguments) and these attempts' reports, once the
        runner has what it needs: they would otherwise sit next to the checkpoints."""
        self.backend.delete(PAYLOAD_KEY)
        for attempt in attempts:
            self.backend.delete_prefix(f"attempt-{attempt:06d}")

    def error(self, attempt: int) -> dict[str, Any] | None:
        """Attempt ``attempt``'s error report ({"error", "traceback"}), or None."""
        try:
            report = self._load(error_key(attempt))
        except FileNotFoundError:
            return None
        if not isinstance(report, dict) or "traceback" not in report:
            raise UntrustedObject(f"{self.uri}/{error_key(attempt)} is not an error report")
        return report


def call(fn, args, kwargs, checkpointer):
    if checkpointer is not None:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        bound.arguments[CHECKPOINTER_PARAMETER] = checkpointer
        args, kwargs = bound.args, bound.kwargs
    value = fn(*args, **kwargs)
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def _report_error(exchange: CallExchange, attempt: int, exc: BaseException) -> int:
    text = "".join(traceback.format_exception(exc))
    print(text, file=sys.stderr, flush=True)
    exchange.put_error(attempt, exc, text)
    return 1


def main(argv: list[str]) -> int:
    from spot_core.checkpoint import Checkpointer

    if len(argv) != 1:
        print("usage: python -m prefect_spot._remote CALL_URI", file=sys.stderr)
        return 2
    attempt = AttemptEnv.from_environ().attempt
    try:
        signer, verifier = lease_seals()
    except Exception as exc:  # noqa: BLE001 - nothing can be verified or signed: no report
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    exchange = CallExchange.open(argv[0], signer, verify_with=verifier)
    try:
        call_spec = exchange.load_payload()
    except UntrustedObject as exc:  # refused unread: say so, and run nothing
        print(f"error: {exc}", file=sys.stderr, flush=True)
        exchange.put_error(attempt, exc, str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - e.g. a module the lease's Python lacks
        return _report_error(exchange, attempt, exc)
    fn, args, kwargs = call_spec["fn"], call_spec["args"], call_spec["kwargs"]
    checkpointer = None
    if wants_checkpointer(fn):
        checkpointer = Checkpointer.from_env(**call_spec.get("checkpointer", {}))
        checkpointer.attach_signals()
        checkpointer.restore()
    try:
        value = call(fn, args, kwargs, checkpointer)
    except Preempted as exc:
        print(f"preempted: {exc}", flush=True)
        return PREEMPTED_EXIT_CODE
    except Exception as exc:  # noqa: BLE001 - the step's own error, handed to Prefect
        return _report_error(exchange, attempt, exc)
    finally:
        if checkpointer is not None:
            checkpointer.close()
    exchange.put_result(attempt, value)
    return 0


if __name__ == "__main__":
    # Run the imported module's main, so the errors it reports pickle by reference
    # (prefect_spot._remote.UntrustedObject), not as classes of __main__.
    from prefect_spot._remote import main as _main

    sys.exit(_main(sys.argv[1:]))
