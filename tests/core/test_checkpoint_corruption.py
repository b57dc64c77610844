"""Damaged checkpoints are detected, skipped by latest() and refused by load()."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.errors import CorruptCheckpoint


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    store = open_store(f"file://{tmp_path}/store")
    store.save(1, {"model.bin": b"one" * 1000, "opt/state.bin": b"o1"}, {"n": 1})
    store.save(2, {"model.bin": b"two" * 1000, "opt/state.bin": b"o2"}, {"n": 2})
    return store


def _dir(store: CheckpointStore, step: int) -> Path:
    [ref] = [r for r in store.list() if r.step == step]
    return Path(store.backend.root) / "checkpoints" / ref.checkpoint_id


def _flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_flipped_payload_byte_fails_load_and_latest_falls_back(
    store: CheckpointStore, caplog
) -> None:
    newest = store.latest()
    _flip_byte(_dir(store, 2) / "model.bin")
    with pytest.raises(CorruptCheckpoint, match=rf"{newest.checkpoint_id}.*'model.bin'"):
        store.load(newest)
    with caplog.at_level(logging.WARNING):
        assert store.latest().step == 1
        assert store.latest().step == 1
    warnings = [r for r in caplog.records if newest.checkpoint_id in r.getMessage()]
    assert len(warnings) == 1, "a bad checkpoint is warned about once"
    assert store.load(store.latest())["model.bin"] == b"one" * 1000


@pytest.mark.parametrize("damage", ["truncate", "garbage", "edit", "delete"])
def test_damaged_manifest_is_skipped(store: CheckpointStore, damage: str) -> None:
    manifest = _dir(store, 2) / "MANIFEST.json"
    text = manifest.read_text()
    if damage == "truncate":
        manifest.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        manifest.write_bytes(b"\x00\xff not json")
    elif damage == "edit":
        manifest.write_text(text.replace('"n": 2', '"n": 3'))
    else:
        manifest.unlink()
    assert store.latest().step == 1
    assert [r.step for r in store.list()] == [1]


def test_missing_or_truncated_payload_file_is_skipped(store: CheckpointStore) -> None:
    (_dir(store, 2) / "opt" / "state.bin").unlink()
    assert store.latest().step == 1
    model = _dir(store, 1) / "model.bin"
    model.write_bytes(model.read_bytes()[:10])
    assert store.latest() is None


def test_manifest_copied_from_another_checkpoint_is_rejected(store: CheckpointStore) -> None:
    older, newer = _dir(store, 1), _dir(store, 2)
    (older / "MANIFEST.json").write_bytes((newer / "MANIFEST.json").read_bytes())
    assert [r.step for r in store.list()] == [2]


def test_prune_never_deletes_newest_valid_checkpoint(store: CheckpointStore) -> None:
    store.save(3, {"model.bin": b"three", "opt/state.bin": b"o3"})
    _flip_byte(_dir(store, 3) / "model.bin", offset=0)
    fresh = open_store(store.uri)  # nothing cached: must hash to find the newest valid one
    fresh.prune(keep=1)
    assert [r.step for r in fresh.list()] == [2, 3]
    assert fresh.latest().step == 2
