"""PyTorch training state as checkpoint payload, for bit-identical resume.

Captures model, optimizer and scheduler state dicts plus every RNG a training
step may draw from (torch CPU, CUDA if available, NumPy's global RNG, Python's
``random``), because resuming without the RNG changes dropout masks and data order
and the resumed run drifts from the uninterrupted one. Everything is stored as
tensors and plain Python values and loaded with ``weights_only=True``, so loading
never unpickles arbitrary objects. torch is imported lazily.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

MODEL, OPTIMIZER, SCHEDULER, RNG, EXTRA = (
    "model.pt",
    "optimizer.pt",
    "scheduler.pt",
    "rng.pt",
    "extra.pt",
)


def torch_payload(
    model: Any, optimizer: Any = None, scheduler: Any = None, extra: Any = None
) -> dict[str, bytes]:
    """Payload dict for ``store.save``; ``extra`` must be tensors / plain Python values."""
    payload = {MODEL: _dumps(model.state_dict()), RNG: _dumps(capture_rng())}
    if optimizer is not None:
        payload[OPTIMIZER] = _dumps(optimizer.state_dict())
    if scheduler is not None:
        payload[SCHEDULER] = _dumps(scheduler.state_dict())
    if extra is not None:
        payload[EXTRA] = _dumps(extra)
    return payload


def staged_torch_payload(
    model: Any, optimizer: Any = None, scheduler: Any = None, extra: Any = None
) -> dict[str, Any]:
    """``torch_payload`` for ``Checkpointer(background=True)``: each value is staged by
    copying its tensors to CPU memory on the loop's thread (a copy, no serialisation) and
    serialised with ``torch.save`` on the saving thread, so the loop stalls only for the
    copy. The bytes are ``torch_payload``'s: ``restore_torch`` reads either. Given to a
    foreground save, each value is staged and serialised at once."""
    payload = {MODEL: StagedState(model.state_dict()), RNG: StagedState(capture_rng())}
    if optimizer is not None:
        payload[OPTIMIZER] = StagedState(optimizer.state_dict())
    if scheduler is not None:
        payload[SCHEDULER] = StagedState(scheduler.state_dict())
    if extra is not None:
        payload[EXTRA] = StagedState(extra)
    return payload


class StagedState:
    """A state (tensors, plain values, nested) that ``stage()`` copies to CPU memory and
    whose copy serialises to ``torch.save`` bytes (``spot_core.checkpoint.background``)."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def stage(self, buffers: dict[str, Any]) -> Callable[[], bytes]:
        copy = _cpu_copy(self.state, buffers, "")
        return lambda: _dumps(copy)


def _cpu_copy(value: Any, buffers: dict[str, Any], path: str) -> Any:
    """Every tensor in ``value`` copied to CPU (detached) into ``buffers[path]`` when one of
    its shape and dtype is there, else into a new one kept there; containers rebuilt; the
    rest as is (plain values the loop replaces rather than changes)."""
    import torch

    if isinstance(value, torch.Tensor):
        kept = buffers.get(path)
        if kept is None or kept.shape != value.shape or kept.dtype != value.dtype:
            kept = buffers[path] = torch.empty_like(value, device="cpu")
        kept.copy_(value.detach())
        return kept
    if isinstance(value, dict):
        return type(value)((k, _cpu_copy(v, buffers, f"{path}/{k}")) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v, buffers, f"{path}/{i}") for i, v in enumerate(value))
    return value


def restore_torch(
    payload: Mapping[str, bytes], model: Any, optimizer: Any = None, scheduler: Any = None
) -> Any:
    """Load state into the given objects and restore RNGs; return ``extra`` (or None)."""
    model.load_state_dict(_loads(payload[MODEL]))
    if optimizer is not None:
        optimizer.load_state_dict(_loads(payload[OPTIMIZER]))
    if scheduler is not None:
        scheduler.load_state_dict(_loads(payload[SCHEDULER]))
    restore_rng(_loads(payload[RNG]))
    return _loads(payload[EXTRA]) if EXTRA in payload else None


def capture_rng() -> dict[str, Any]:
    """Every global RNG state as tensors and plain values."""
    import torch

    legacy = np.random.get_state(legacy=True)
    if not isinstance(legacy, tuple):  # a dict only when the global generator is not MT19937
        raise ValueError("numpy's global random generator is not MT19937; its state is a dict")
    kind, keys, pos, has_gauss, cached = legacy
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (
            n["kind"],
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _dumps(value: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _loads(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
