"""What runs on the spot lease for a task submitted to ``SpotTaskRunner``.

``python -m prefect_spot._remote CALL_URI``: load the pickled call from the job's object
store, build a Checkpointer from the attempt's environment (restored from the latest
checkpoint if the function asks for one), turn SIGTERM into an emergency save, call the
function and write its result (or its error) back to the store, where the runner reads
it. Exit codes: 0 success, 143 preempted after the emergency save, 1 the function raised
(or its call could not be loaded here).

``CALL_URI`` is a store location (``file:///abs/path`` or ``s3://bucket/prefix``, by
default ``<job checkpoint URI>/call``), so the same exchange works on a local lease and on
an EC2 instance, which reaches S3 through its instance profile (no credential is ever
passed to it). Under it:

- ``payload.pkl``: the cloudpickled call, written by the runner before the job starts;
- ``attempt-NNNNNN/result.pkl`` or ``attempt-NNNNNN/error.pkl``: what attempt N
  produced. Keyed by attempt, so a zombie of a reclaimed attempt can never overwrite (or
  be mistaken for) the outcome of the attempt that finished.

Every write is a backend ``put_bytes``, which is atomic (rename into place for files,
a single PUT for S3). Prefect is not imported here, so a relaunch costs a Python start,
NumPy and the user's own imports.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import traceback
from typing import Any, Iterable

import cloudpickle

from spot_core.attempt_env import PREEMPTED_EXIT_CODE, AttemptEnv
from spot_core.errors import Preempted

CHECKPOINTER_PARAMETER = "checkpointer"
CALL_PREFIX = "call"
PAYLOAD_KEY = "payload.pkl"


def wants_checkpointer(fn) -> bool:
    return CHECKPOINTER_PARAMETER in inspect.signature(fn).parameters


def call_uri(checkpoint_uri: str) -> str:
    """Where the call of the job checkpointing at ``checkpoint_uri`` is exchanged."""
    return f"{checkpoint_uri.rstrip('/')}/{CALL_PREFIX}"


def result_key(attempt: int) -> str:
    return f"attempt-{attempt:06d}/result.pkl"


def error_key(attempt: int) -> str:
    return f"attempt-{attempt:06d}/error.pkl"


class CallExchange:
    """The payload, results and errors of one job's call, in an object backend."""

    def __init__(self, backend, uri: str) -> None:
        self.backend = backend
        self.uri = uri

    @classmethod
    def open(cls, uri: str, **options: Any) -> CallExchange:
        """The exchange at ``uri``; ``options`` go to the S3 backend (endpoint, region...)."""
        from spot_core.checkpoint import open_store

        store = open_store(uri, **options)
        return cls(store.backend, store.uri)

    def __repr__(self) -> str:
        return f"CallExchange({self.uri!r})"

    def put_payload(self, data: bytes) -> None:
        self.backend.put_bytes(PAYLOAD_KEY, data)

    def load_payload(self) -> dict[str, Any]:
        return cloudpickle.loads(self.backend.get_bytes(PAYLOAD_KEY))

    def put_result(self, attempt: int, value: Any) -> None:
        self.backend.put_bytes(result_key(attempt), cloudpickle.dumps(value))

    def put_error(self, attempt: int, exc: BaseException | None, text: str) -> None:
        try:
            blob = cloudpickle.dumps({"error": exc, "traceback": text})
        except Exception:  # noqa: BLE001 - an unpicklable error still reports its text
            blob = cloudpickle.dumps({"error": None, "traceback": text})
        self.backend.put_bytes(error_key(attempt), blob)

    def result(self, attempt: int) -> Any:
        """Attempt ``attempt``'s return value (FileNotFoundError if it wrote none)."""
        return cloudpickle.loads(self.backend.get_bytes(result_key(attempt)))

    def clear(self, attempts: Iterable[int]) -> None:
        """Delete the payload (the pickled arguments) and these attempts' reports, once the
        runner has what it needs: they would otherwise sit next to the checkpoints."""
        self.backend.delete(PAYLOAD_KEY)
        for attempt in attempts:
            self.backend.delete_prefix(f"attempt-{attempt:06d}")

    def error(self, attempt: int) -> dict[str, Any] | None:
        """Attempt ``attempt``'s error report ({"error", "traceback"}), or None."""
        try:
            blob = self.backend.get_bytes(error_key(attempt))
        except FileNotFoundError:
            return None
        return cloudpickle.loads(blob)


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
    exchange = CallExchange.open(argv[0])
    try:
        call_spec = exchange.load_payload()
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
    sys.exit(main(sys.argv[1:]))
