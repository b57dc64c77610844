"""NumPy / JSON / pickle state helpers round-trip exactly, and loading never unpickles arrays."""

from __future__ import annotations

import io

import numpy as np
import pytest

from spot_core.checkpoint.state import (
    arrays_from_bytes,
    arrays_to_bytes,
    json_dumps,
    json_loads,
    pickle_dumps,
    pickle_loads,
)
from spot_core.errors import ConfigError, CorruptCheckpoint


def test_arrays_round_trip_bit_exact() -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "w": rng.standard_normal((3, 4)),
        "i": np.arange(5, dtype=np.int16),
        "scalar": np.float32(1.5),
        "empty": np.zeros((0, 2)),
    }
    back = arrays_from_bytes(arrays_to_bytes(arrays))
    assert set(back) == set(arrays)
    for name, value in arrays.items():
        assert back[name].dtype == np.asarray(value).dtype
        assert np.array_equal(back[name], value)


def test_object_arrays_are_refused() -> None:
    with pytest.raises(ConfigError, match="object dtype"):
        arrays_to_bytes({"bad": np.array([{"a": 1}], dtype=object)})


def test_pickled_npz_is_not_loaded() -> None:
    buffer = io.BytesIO()
    np.savez(buffer, bad=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CorruptCheckpoint):
        arrays_from_bytes(buffer.getvalue())


def test_json_and_pickle_helpers() -> None:
    assert json_loads(json_dumps({"b": 1, "a": [1.5, None]})) == {"a": [1.5, None], "b": 1}
    with pytest.raises(ConfigError):
        json_dumps({"x": float("inf")})
    value = {"t": (1, 2), "s": {3}}
    assert pickle_loads(pickle_dumps(value)) == value
