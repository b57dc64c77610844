"""A deterministic training job: softmax regression with mini-batch SGD, in NumPy.

It is small enough for a demo and a test, yet a real training loop: it restores from the
latest checkpoint, checkpoints on a schedule, saves an emergency checkpoint when a
notice arrives (SIGTERM forwarded by `spot-pipelines watch`), and its final weights are
bit-identical whether or not it was interrupted. Determinism across restarts comes from
drawing each step's mini-batch from a generator seeded by (seed, step), so no RNG state
has to survive the node.

As a pipeline: ``prepare_dataset`` writes the data set, the training step runs as a spot
job (``python -m spot_core.workloads.softmax_regression --data D --steps N`` with
``SPOT_CHECKPOINT_URI`` and ``SPOT_ATTEMPT`` set by the provider) and leaves its final
weights as the newest checkpoint (metadata ``final: true``), and ``evaluate`` reads them
back from the store. Nothing the next step needs stays on the node.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from spot_core.attempt_env import report_step_exit
from spot_core.errors import SpotError
from spot_core.safe_files import read_bytes, write_bytes

if TYPE_CHECKING:
    from spot_core.checkpoint import Checkpointer, CheckpointStore

MAX_DATASET_BYTES = 1 << 30  # the demo's data set is about 1 MB

STATE_FILE = "state.npz"


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    batch_size: int = 64
    learning_rate: float = 0.2
    seed: int = 7
    features: int = 16
    classes: int = 4
    samples: int = 4000
    step_seconds: float = (
        0.0  # simulated extra compute per step, to make runs long enough to interrupt
    )


@dataclass(frozen=True)
class TrainResult:
    steps_done: int
    resumed_from_step: int | None
    weights_sha256: str
    accuracy: float
    checkpoint_saves: int
    checkpoint_seconds: float


def make_dataset(cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gaussian blobs around random class centres; 80/20 train/test split."""
    rng = np.random.default_rng(cfg.seed)
    centres = rng.normal(0.0, 2.0, size=(cfg.classes, cfg.features))
    labels = rng.integers(0, cfg.classes, size=cfg.samples)
    points = centres[labels] + rng.normal(0.0, 2.5, size=(cfg.samples, cfg.features))
    cut = int(cfg.samples * 0.8)
    return points[:cut], labels[:cut], points[cut:], labels[cut:]


def prepare_dataset(cfg: TrainConfig, path: Path) -> Path:
    """The pipeline's first step: write the data set where every later step can read it."""
    x_train, y_train, x_test, y_test = make_dataset(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    write_bytes(path, buffer.getbuffer(), what="data set")  # whole, over a regular file only
    return path


def load_dataset(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The data set at ``path``: a regular file (a FIFO there would block the step)."""
    raw = read_bytes(path, limit=MAX_DATASET_BYTES, what="data set")
    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = (
            data["x_train"],
            data["y_train"],
            data["x_test"],
            data["y_test"],
        )
        return arrays


def initial_state(cfg: TrainConfig) -> dict[str, np.ndarray]:
    return {"W": np.zeros((cfg.features, cfg.classes)), "b": np.zeros(cfg.classes)}


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
    return probabilities


def train_step(
    state: dict[str, np.ndarray], step: int, x: np.ndarray, y: np.ndarray, cfg: TrainConfig
) -> None:
    """One SGD step on the mini-batch that belongs to ``step`` (in place)."""
    batch = np.random.default_rng([cfg.seed, step]).integers(0, len(x), size=cfg.batch_size)
    xb, yb = x[batch], y[batch]
    probs = _softmax(xb @ state["W"] + state["b"])
    probs[np.arange(len(yb)), yb] -= 1.0
    state["W"] -= cfg.learning_rate * (xb.T @ probs) / len(yb)
    state["b"] -= cfg.learning_rate * probs.mean(axis=0)


def accuracy(state: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float(((x @ state["W"] + state["b"]).argmax(axis=1) == y).mean())


def weights_sha256(state: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(state[name]).tobytes())
    return digest.hexdigest()


class SimulatedCompute:
    """``seconds`` of simulated compute per step, as sleeps that add up to
    ``steps * seconds``: a sleep that overshoots (on a loaded 2-core machine a 10 ms
    sleep lasted 11.6 ms on average) is taken off the next one, so the run's length
    does not grow with the machine's scheduling delay. Real work (the step itself,
    checkpoint saves) still adds its own time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._owed = 0.0  # simulated compute not yet slept (negative: slept ahead)

    def step(self) -> None:
        if not self.seconds:
            return
        self._owed += self.seconds
        if self._owed <= 0:
            return
        started = time.perf_counter()
        time.sleep(self._owed)
        self._owed -= time.perf_counter() - started


def train(
    cfg: TrainConfig, checkpointer: Checkpointer | None = None, data: Path | None = None
) -> TrainResult:
    """Train to ``cfg.steps``, resuming from and saving to ``checkpointer`` if given.

    The final state is saved as the newest checkpoint (``final: true``) so the evaluation
    step can read it from the store. Raises ``Preempted`` after an emergency save when
    the checkpointer was asked for one.
    """
    from spot_core.checkpoint.state import arrays_from_bytes, arrays_to_bytes

    x_train, y_train, x_test, y_test = make_dataset(cfg) if data is None else load_dataset(data)
    state, start = initial_state(cfg), 0
    restored = checkpointer.restore() if checkpointer is not None else None
    if restored is not None:
        start, payload = restored
        state = arrays_from_bytes(payload[STATE_FILE])
    pace = SimulatedCompute(cfg.step_seconds)
    for step in range(start, cfg.steps):
        train_step(state, step, x_train, y_train, cfg)
        pace.step()
        if checkpointer is not None:
            checkpointer.maybe_save(step + 1, lambda: {STATE_FILE: arrays_to_bytes(state)})
    if checkpointer is not None:
        checkpointer.save_now(
            cfg.steps,
            lambda: {STATE_FILE: arrays_to_bytes(state)},
            {"final": True, "accuracy": accuracy(state, x_test, y_test)},
        )
    return TrainResult(
        steps_done=cfg.steps,
        resumed_from_step=None if restored is None else start,
        weights_sha256=weights_sha256(state),
        accuracy=accuracy(state, x_test, y_test),
        checkpoint_saves=0 if checkpointer is None else checkpointer.saves,
        checkpoint_seconds=0.0 if checkpointer is None else checkpointer.total_save_seconds,
    )


def evaluate(store: CheckpointStore, data: Path) -> tuple[str, float]:
    """The pipeline's last step: (weights sha256, test accuracy) of the final checkpoint."""
    from spot_core.checkpoint.state import arrays_from_bytes

    ref = store.latest()
    if ref is None or not ref.metadata.get("final"):
        raise ValueError("the training step left no final checkpoint; run it to completion first")
    state = arrays_from_bytes(store.load(ref)[STATE_FILE])
    _, _, x_test, y_test = load_dataset(data)
    return weights_sha256(state), accuracy(state, x_test, y_test)


def _parse(argv: list[str] | None) -> tuple[TrainConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="data set written by prepare_dataset (default: generate it)",
    )
    parser.add_argument("--checkpoint-every-steps", type=int, default=None)
    parser.add_argument("--checkpoint-every-seconds", type=float, default=None)
    parser.add_argument(
        "--result",
        type=Path,
        default=None,
        help="write the TrainResult as JSON here when training completes",
    )
    args = parser.parse_args(argv)
    return TrainConfig(steps=args.steps, step_seconds=args.step_seconds, seed=args.seed), args


def main(argv: list[str] | None = None) -> int:
    from spot_core.checkpoint import Checkpointer

    cfg, args = _parse(argv)
    try:
        chosen = {
            "every_steps": args.checkpoint_every_steps,
            "every_seconds": args.checkpoint_every_seconds,
        }
        checkpointer = Checkpointer.from_env(**{k: v for k, v in chosen.items() if v is not None})
        with checkpointer.attach_signals():
            result = train(cfg, checkpointer, args.data)
    except SpotError as exc:  # a preemption or an unreachable store: not this step's fault
        return report_step_exit(exc)
    text = json.dumps(result.__dict__, allow_nan=False)
    if args.result is not None:
        write_bytes(args.result, text, inputs=[args.data] if args.data else [], what="--result")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
