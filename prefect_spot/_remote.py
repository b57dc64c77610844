"""What runs on the spot lease for a task submitted to ``SpotTaskRunner``.

``python -m prefect_spot._remote PAYLOAD RESULT ERROR``: load the pickled call, build a
Checkpointer from the attempt's environment (restored from the latest checkpoint if
the function asks for one), turn SIGTERM into an emergency save, call the function and
write its result (or its error) where the runner reads it. Exit codes: 0 success, 143
preempted after the emergency save, 1 the function raised. Prefect is not imported
here, so a relaunch costs a Python start, NumPy and the user's own imports.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import traceback
from pathlib import Path

import cloudpickle

from spot_core.attempt_env import PREEMPTED_EXIT_CODE
from spot_core.errors import Preempted

CHECKPOINTER_PARAMETER = "checkpointer"


def wants_checkpointer(fn) -> bool:
    return CHECKPOINTER_PARAMETER in inspect.signature(fn).parameters


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def call(fn, args, kwargs, checkpointer):
    if checkpointer is not None:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        bound.arguments[CHECKPOINTER_PARAMETER] = checkpointer
        args, kwargs = bound.args, bound.kwargs
    value = fn(*args, **kwargs)
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def main(argv: list[str]) -> int:
    from spot_core.checkpoint import Checkpointer

    payload_path, result_path, error_path = (Path(p) for p in argv)
    call_spec = cloudpickle.loads(payload_path.read_bytes())
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
        text = "".join(traceback.format_exception(exc))
        print(text, file=sys.stderr, flush=True)
        try:
            blob = cloudpickle.dumps({"error": exc, "traceback": text})
        except Exception:  # noqa: BLE001 - an unpicklable error still reports its text
            blob = cloudpickle.dumps({"error": None, "traceback": text})
        write_atomically(error_path, blob)
        return 1
    finally:
        if checkpointer is not None:
            checkpointer.close()
    write_atomically(result_path, cloudpickle.dumps(value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
