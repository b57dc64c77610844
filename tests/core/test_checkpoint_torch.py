"""PyTorch resume is bit-identical: save mid-training, restore into fresh objects, finish."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from spot_core.checkpoint import open_store
from spot_core.checkpoint.torch_state import restore_torch, torch_payload

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _fresh(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    return model, optimizer, scheduler


def _train(model, optimizer, scheduler, steps: int) -> None:
    """Draws from every RNG the payload captures: torch (data, dropout), NumPy, random."""
    for _ in range(steps):
        x = torch.randn(32, 8) + float(np.random.rand()) + random.random()
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def test_resume_is_bit_identical(tmp_path: Path) -> None:
    model, optimizer, scheduler = _fresh(0)
    _seed_all(1)
    _train(model, optimizer, scheduler, 20)
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    store = open_store(f"file://{tmp_path}/store")
    model, optimizer, scheduler = _fresh(0)
    _seed_all(1)
    _train(model, optimizer, scheduler, 8)
    ref = store.save(8, torch_payload(model, optimizer, scheduler, extra={"epoch": 3}))

    _seed_all(999)  # a new process would start with unrelated RNG states and weights
    model, optimizer, scheduler = _fresh(123)
    extra = restore_torch(store.load(store.latest()), model, optimizer, scheduler)
    assert extra == {"epoch": 3} and store.latest() == ref
    _train(model, optimizer, scheduler, 12)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
