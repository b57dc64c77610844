"""``make bench-checkpoint`` runs end to end at a tiny size and writes its table."""

from __future__ import annotations

import pytest

from bench import checkpoint


def test_the_checkpoint_bench_writes_a_row_per_store_and_size(tmp_path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "checkpoint.md"
    assert checkpoint.main(["--gib", "0.01", "--stores", "file", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| file |")]
    assert len(rows) == 1


def test_the_dcp_bench_prints_a_row_with_each_rank_count(capsys) -> None:
    pytest.importorskip("torch")
    from bench import checkpoint_dcp

    assert checkpoint_dcp.main(["--mib", "1", "--ranks", "1", "2", "--stores", "file"]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if "DCP sharded" in line]
    assert "1: " in row and " / 2: " in row
