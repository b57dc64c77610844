"""The demo's batch inference: a small fixed linear classifier scoring one item at a time.

Deterministic (features from the item's SHA-256, weights from a fixed seed), so a batch
run through a queue that survived reclaims and a plain loop over the same items give
byte-identical outputs. ``SPOT_BATCH_ITEM_SECONDS`` adds simulated compute per item (a
model's forward pass), so a demo's workers live long enough to be reclaimed.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import time
from typing import Any

ITEM_SECONDS = "SPOT_BATCH_ITEM_SECONDS"
FEATURES, CLASSES, SEED = 16, 4, 7

_rng = random.Random(SEED)
WEIGHTS = tuple(tuple(_rng.gauss(0.0, 1.0) for _ in range(FEATURES)) for _ in range(CLASSES))


def features(item: str | int) -> list[float]:
    digest = hashlib.sha256(str(item).encode()).digest()
    return [(digest[i] - 127.5) / 127.5 for i in range(FEATURES)]


def infer(item: str | int) -> dict[str, Any]:
    """Class and probability of one item (rounded: a stable text form)."""
    seconds = float(os.environ.get(ITEM_SECONDS) or 0)
    if seconds > 0:
        time.sleep(seconds)
    x = features(item)
    logits = [sum(w * v for w, v in zip(row, x, strict=True)) for row in WEIGHTS]
    top = max(logits)
    exps = [math.exp(z - top) for z in logits]
    label = exps.index(max(exps))
    return {"item": item, "label": label, "p": round(exps[label] / sum(exps), 6)}
