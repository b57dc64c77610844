"""``make bench-checkpoint`` runs end to end at a tiny size and writes its table."""

from __future__ import annotations

import pytest

from bench import checkpoint


def test_the_checkpoint_bench_writes_a_row_per_store_and_size(tmp_path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "checkpoint.md"
    assert checkpoint.main(["--gib", "0.01", "--stores", "file", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| file |")]
    assert len(rows) == 1 and "DCP sharded save" in out.read_text()
