"""Controller.adopt: in-place attempts numbered above the store's fence, or, on a lease
whose launcher already fenced the store for it (a spot worker's), under that number."""

from __future__ import annotations

import pytest

from spot_core.checkpoint import open_store
from spot_core.controller import Controller, JobSpec
from spot_core.errors import FencedOut
from spot_core.model import Outcome
from spot_core.providers.base import LeaseState, LeaseStatus
from spot_core.providers.in_place import InPlaceProvider


def _adopt(tmp_path, record=None, attempt=None):
    provider = InPlaceProvider(price_per_hour=0.5)
    controller = Controller(provider, None, heartbeat_timeout_seconds=None)
    spec = JobSpec("in-place", (), (tmp_path / "ckpt").as_uri(), ())
    record = record or controller.new_record(spec)
    record, lease = controller.adopt(
        spec, record, lambda n, now: provider.adopt(spec.job_id, n, now), attempt=attempt
    )
    return controller, spec, record, lease


def test_adopt_numbers_above_the_fence_or_keeps_the_launchers_number(tmp_path):
    store = open_store((tmp_path / "ckpt").as_uri())
    store.fence(3)  # a launcher (the spot worker) started attempt 3 on this store
    _, _, _, lease = _adopt(tmp_path, attempt=3)
    assert lease.attempt == 3 and store.fence_level() == 3
    controller, spec, record, lease = _adopt(tmp_path)
    assert lease.attempt == 4 and store.fence_level() == 4
    record = controller.on_lease_end(spec, record, LeaseStatus(LeaseState.EXITED, exit_code=0))
    assert record.attempts[-1].outcome is Outcome.SUCCEEDED
    with pytest.raises(FencedOut):  # a stale launcher's attempt is refused
        _adopt(tmp_path, attempt=2)
