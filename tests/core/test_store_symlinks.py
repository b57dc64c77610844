"""A file store stays inside its root, whatever folder symlinks are planted in it.

Anyone who can write a store (a step, another job, a hand) can replace one of its folders
by a symlink to somewhere else: ``heartbeat -> /elsewhere`` or ``queue -> /elsewhere``
used to make the driver and the workers write, read and delete there. Every folder under
the root is now opened one level at a time with O_NOFOLLOW from the root, so a planted
link reads as no object (one warning; a checkpoint behind it is skipped like any corrupt
one), a write through it is one CheckpointError naming the link, and nothing outside the
root is created, changed or removed.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.checkpoint.heartbeat import HEARTBEAT_KEY, Heartbeat
from spot_core.errors import CheckpointError, ConfigError, CorruptCheckpoint
from spot_core.workloads.batch import ItemRange, WorkQueue

GOOD = {"model.bin": b"good" * 100}


def tree(root: Path) -> dict[str, bytes | str]:
    """Every file (its bytes) and folder under ``root``: what must not change."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else "folder"
        for p in sorted(root.rglob("*"))
    }


def plant(store: CheckpointStore, folder: str, target: Path) -> None:
    """Replace ``folder`` of the store by a symlink to ``target`` (what a step can do)."""
    path = Path(store.backend.root) / folder
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target, target_is_directory=True)


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    store = open_store(f"file://{tmp_path}/store")
    store.save(1, GOOD)
    store.save(2, GOOD)
    return store


@pytest.fixture
def elsewhere(tmp_path: Path, store: CheckpointStore) -> Path:
    """A folder outside the store holding what a store's folders hold: a copy of its
    checkpoints, a heartbeat, a status report, a queue's spec."""
    other = tmp_path / "elsewhere"
    shutil.copytree(Path(store.backend.root) / "checkpoints", other / "checkpoints")
    donor = open_store(f"file://{tmp_path}/donor")
    Heartbeat(donor).renew(attempt=1, now=1.0)
    WorkQueue.create(donor.uri, ItemRange(0, 4), unit_size=2)
    shutil.copytree(Path(donor.backend.root) / "heartbeat", other / "heartbeat")
    shutil.copytree(Path(donor.backend.root) / "queue", other / "queue")
    (other / "status").mkdir()
    (other / "status" / "attempt-000001.json").write_bytes(b"{}")
    return other


WRITES = {
    "heartbeat renewal": ("heartbeat", lambda s: Heartbeat(s).renew(attempt=1, now=5.0)),
    "queue create": ("queue", lambda s: WorkQueue.create(s.uri, ItemRange(0, 6), unit_size=3)),
    "status report": ("status", lambda s: s.put_object("status/attempt-000002.json", b"{}")),
    "save": ("checkpoints", lambda s: s.save(3, GOOD)),
}
DELETES = {
    "delete_object": ("status", lambda s: s.delete_object("status/attempt-000001.json")),
    "prune": ("checkpoints", lambda s: s.prune(keep=1)),
    "heartbeat release": ("heartbeat", lambda s: Heartbeat(s).release(attempt=1, now=5.0)),
}


@pytest.mark.parametrize("case", sorted(WRITES))
def test_a_write_through_a_planted_folder_symlink_is_one_clear_error(
    store, elsewhere, case
) -> None:
    folder, write = WRITES[case]
    plant(store, folder, elsewhere / folder)
    before = tree(elsewhere)
    # A queue's create reads its spec first: the planted folder is then the spec that
    # cannot be read, one ConfigError naming the link (the store's own word inside it).
    with pytest.raises((CheckpointError, ConfigError), match="symbolic link") as raised:
        write(store)
    assert "\n" not in str(raised.value) and folder in str(raised.value)
    assert not isinstance(raised.value, CorruptCheckpoint)
    assert tree(elsewhere) == before  # nothing created, written or removed out there


@pytest.mark.parametrize("case", sorted(DELETES))
def test_nothing_outside_the_root_is_deleted_through_a_planted_symlink(
    store, elsewhere, case
) -> None:
    folder, delete = DELETES[case]
    plant(store, folder, elsewhere / folder)
    before = tree(elsewhere)
    try:
        delete(store)
    except CheckpointError as exc:  # refused: fine, in one line
        assert "\n" not in str(exc) and "symbolic link" in str(exc)
    assert tree(elsewhere) == before


def test_a_planted_heartbeat_folder_reads_as_no_beat_with_one_warning(
    store, elsewhere, caplog
) -> None:
    plant(store, "heartbeat", elsewhere / "heartbeat")
    with caplog.at_level(logging.WARNING):
        assert [Heartbeat(store).read() for _ in range(3)] == [None] * 3
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and HEARTBEAT_KEY in warned[0].getMessage()


def test_a_planted_queue_folder_is_refused_naming_the_link(store, elsewhere) -> None:
    # Not "no work queue ... create it first": what cannot be read is never absent.
    plant(store, "queue", elsewhere / "queue")
    with pytest.raises(ConfigError, match="symbolic link") as refused:
        WorkQueue.open(store.uri)
    assert "\n" not in str(refused.value)


def test_a_planted_checkpoints_folder_lists_nothing_with_one_warning(
    store, elsewhere, caplog
) -> None:
    plant(store, "checkpoints", elsewhere / "checkpoints")
    with caplog.at_level(logging.WARNING):
        assert [store.latest() for _ in range(3)] == [None] * 3
        assert store.list() == []
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "symbolic link" in warned[0].getMessage()


def test_a_checkpoint_folder_linked_elsewhere_is_skipped_by_latest(store, tmp_path, caplog) -> None:
    newest = store.latest()
    root = Path(store.backend.root) / "checkpoints"
    moved = tmp_path / "moved"
    shutil.move(root / newest.checkpoint_id, moved)
    (root / newest.checkpoint_id).symlink_to(moved, target_is_directory=True)
    with caplog.at_level(logging.WARNING):
        assert store.latest().step == 1  # the one behind the link is skipped as corrupt
        assert store.latest().step == 1
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and newest.checkpoint_id in warned[0].getMessage()
    with pytest.raises(CorruptCheckpoint, match="symbolic link"):
        store.load(newest)
    store.save(3, GOOD)  # the store goes on; the link's target stays as it was
    assert store.load(store.latest()) == GOOD and (moved / "MANIFEST.json").is_file()
