"""Turn common training state into checkpoint payload bytes and back.

NumPy arrays go through ``np.savez`` and load with ``allow_pickle=False``, so a
checkpoint written by anyone can be read safely. The pickle helpers are for
trusted data only: unpickling a checkpoint from an untrusted store runs arbitrary
code. Prefer arrays and JSON.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

from spot_core.errors import ConfigError, CorruptCheckpoint


def arrays_to_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialise named arrays (no object dtypes, so loading never unpickles)."""
    for name, array in arrays.items():
        if np.asarray(array).dtype.hasobject:
            raise ConfigError(
                f"array {name!r} has an object dtype; convert it to a numeric "
                "dtype or use pickle_dumps for trusted data"
            )
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **{name: np.asarray(a) for name, a in arrays.items()})
    return buffer.getvalue()


def arrays_from_bytes(data: bytes) -> dict[str, np.ndarray]:
    """Inverse of ``arrays_to_bytes``; never unpickles."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (ValueError, OSError) as exc:
        raise CorruptCheckpoint(f"payload is not a NumPy .npz archive ({exc})") from exc


def json_dumps(value: Any) -> bytes:
    """Strict JSON (no NaN/inf), sorted keys, so equal state gives equal bytes."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"state is not JSON-serialisable ({exc})") from exc


def json_loads(data: bytes) -> Any:
    return json.loads(data)


def pickle_dumps(value: Any) -> bytes:
    """Pickle anything. Only load the result from a store you trust."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def pickle_loads(data: bytes) -> Any:
    """Unpickle trusted data only: a crafted payload runs arbitrary code."""
    return pickle.loads(data)  # noqa: S301 - documented as trusted-data only
