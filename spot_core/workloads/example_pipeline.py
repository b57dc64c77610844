"""The steps of the example ML pipeline (``dags/spot_ml_pipeline.py``), step-side helpers.
Engine-agnostic: the DAG only wires these commands into its tasks.

Training is ``spot_core.workloads.softmax_regression`` run as a spot job. Batch
inference is this module's CLI, also run as one spot job per shard: it loads the
trained weights from the training job's checkpoint store, predicts its shard of the
test set in chunks, checkpoints its progress, and writes its predictions beside the
data. Nothing a later attempt needs stays on the node.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

STATE_FILE = "state.npz"
PREDICTIONS_FILE = "predictions.npy"


def train_command(
    data: str, steps: int | str, step_seconds: float | str, every_seconds: float | str
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "spot_core.workloads.softmax_regression",
        "--data",
        str(data),
        "--steps",
        str(steps),
        "--step-seconds",
        str(step_seconds),
        "--checkpoint-every-seconds",
        str(every_seconds),
    ]


def infer_command(
    model_uri: str, data: str, shard: int, shards: int, out: str, chunk_seconds: float = 0.2
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "spot_core.workloads.example_pipeline",
        "--model-uri",
        model_uri,
        "--data",
        data,
        "--shard",
        str(shard),
        "--shards",
        str(shards),
        "--out",
        out,
        "--chunk-seconds",
        str(chunk_seconds),
    ]


def evaluate(model_uri: str, data: str, steps: int) -> dict[str, Any]:
    """Final weights' hash and accuracy, next to an uninterrupted run's hash."""
    from spot_core.checkpoint import open_store
    from spot_core.workloads.softmax_regression import TrainConfig, train
    from spot_core.workloads.softmax_regression import evaluate as core_evaluate

    sha, accuracy = core_evaluate(open_store(model_uri), Path(data))
    reference = train(TrainConfig(steps=steps), data=Path(data))
    return {
        "final_weights_sha256": sha,
        "uninterrupted_weights_sha256": reference.weights_sha256,
        "accuracy": accuracy,
    }


def _load_weights(model_uri: str) -> dict[str, np.ndarray]:
    from spot_core.checkpoint import open_store
    from spot_core.checkpoint.state import arrays_from_bytes

    store = open_store(model_uri)
    ref = store.latest()
    if ref is None or not ref.metadata.get("final"):
        raise SystemExit(f"no final model in {model_uri}; run the training step first")
    return arrays_from_bytes(store.load(ref)[STATE_FILE])


def infer(
    model_uri: str,
    data: Path,
    shard: int,
    shards: int,
    out: Path,
    chunk_seconds: float,
    chunk_rows: int = 50,
) -> int:
    """Predict rows ``shard::shards`` of the test set, resuming from the last checkpoint."""
    from spot_core.checkpoint import Checkpointer
    from spot_core.checkpoint.state import arrays_from_bytes, arrays_to_bytes
    from spot_core.errors import Preempted
    from spot_core.workloads.softmax_regression import load_dataset

    weights = _load_weights(model_uri)
    _, _, x_test, _ = load_dataset(data)
    rows = x_test[shard::shards]
    checkpointer = Checkpointer.from_env(every_steps=1)
    predictions = np.full(len(rows), -1, dtype=np.int64)
    with checkpointer.attach_signals():
        restored = checkpointer.restore()
        done = 0
        if restored is not None:
            done, payload = restored
            predictions = arrays_from_bytes(payload[STATE_FILE])["predictions"]
        try:
            while done < len(rows):
                chunk = rows[done : done + chunk_rows]
                logits = chunk @ weights["W"] + weights["b"]
                predictions[done : done + len(chunk)] = logits.argmax(axis=1)
                done += len(chunk)
                time.sleep(chunk_seconds)
                checkpointer.maybe_save(
                    done, lambda: {STATE_FILE: arrays_to_bytes({"predictions": predictions})}
                )
        except Preempted as exc:
            print(json.dumps({"preempted": True, "reason": str(exc)}), flush=True)
            return 143
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, predictions)
    print(json.dumps({"shard": shard, "rows": int(len(rows))}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="batch inference over one shard")
    parser.add_argument("--model-uri", required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--chunk-seconds", type=float, default=0.2)
    args = parser.parse_args(argv)
    return infer(args.model_uri, args.data, args.shard, args.shards, args.out, args.chunk_seconds)


if __name__ == "__main__":
    sys.exit(main())
