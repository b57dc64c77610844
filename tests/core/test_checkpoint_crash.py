"""Crash consistency: SIGKILL a writer at random moments; every survivor must verify.

One store directory is reused across trials (as a real job's store is across
preemptions), so later trials also exercise leftovers of earlier torn saves.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_core.checkpoint import open_store
from tests.support import SUPPORT

WRITER = SUPPORT / "checkpoint_writer.py"


def _writer_module():  # the payload recipe lives in the child script; import it by path
    spec = importlib.util.spec_from_file_location("checkpoint_writer", WRITER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start_writer(uri: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(WRITER), uri], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("ready"), f"writer did not start: {line!r}"
    return proc


def _kill_trials(tmp_path: Path, trials: int, max_delay: float) -> None:
    writer = _writer_module()
    payload_for = writer.payload_for
    uri = f"file://{tmp_path}/store"
    store = open_store(uri)
    rng = random.Random(1234)
    newest_seen, progressed, committing = 0, 0, 0
    for _ in range(trials):
        proc = _start_writer(uri)
        # Half the trials let 1-2 saves return first, so the kills land both before the
        # first commit and in the middle of later saves, whatever the machine's load.
        saves = rng.choice((0, 0, 1, 2))
        returned = writer.wait_for_saves(proc, saves)
        committing += saves > 0
        time.sleep(rng.uniform(0, max_delay))
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        ref = store.latest()
        assert (ref.step if ref else 0) >= returned, f"returned save {returned} was lost"
        if ref is None:
            continue
        assert store.load(ref) == payload_for(ref.step), f"step {ref.step} payload differs"
        assert ref.metadata == {"step": ref.step}
        assert ref.step >= newest_seen, "a committed checkpoint disappeared after a crash"
        progressed += ref.step > newest_seen
        newest_seen = ref.step
    steps = [r.step for r in store.list()]
    assert steps == sorted(steps) and len(steps) == len(set(steps))
    assert progressed >= committing > trials // 4, (progressed, committing)


def test_sigkill_at_random_moments_never_leaves_a_bad_latest(tmp_path: Path) -> None:
    _kill_trials(tmp_path, trials=100, max_delay=0.1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_sigkill_thousand_trials(tmp_path: Path) -> None:
    _kill_trials(tmp_path, trials=1000, max_delay=0.1)
