"""The checkpoint store contract: save/latest/load/list/prune, input validation, fencing."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spot_core.checkpoint import CheckpointRef, CheckpointStore, open_store
from spot_core.errors import CheckpointNotFound, ConfigError, CorruptCheckpoint, FencedOut
from tests.support.spot_helpers import ZOMBIE_WRITER


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return open_store(f"file://{tmp_path}/store")


def _files_on_disk(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != ".spot-lock"
    )


# -- open_store ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "uri, words",
    [
        ("", "empty"),
        ("file://relative/dir", "three slashes"),
        ("/abs/path", "file:///abs/path"),
        ("relative", "no scheme"),
        ("gs://bucket/x", "unsupported scheme"),
        ("file:///", "absolute"),
        ("file:///tmp/x?y=1", "query"),
        ("s3://", "bucket"),
    ],
)
def test_bad_uris_name_the_fix(uri: str, words: str) -> None:
    with pytest.raises(ConfigError, match="file:///|s3://bucket") as info:
        open_store(uri)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_s3_uri_opens_an_s3_store_without_touching_the_network() -> None:
    pytest.importorskip("boto3")
    store = open_store("s3://bucket/prefix/", endpoint_url="http://127.0.0.1:9")
    assert store.uri == "s3://bucket/prefix"
    assert type(store.backend).__name__ == "S3Backend"


def test_store_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        open_store(f"file://{tmp_path}/f")


# -- save / latest / load / list -----------------------------------------------------
def test_empty_store_has_no_latest(store: CheckpointStore) -> None:
    assert store.latest() is None and store.list() == []


def test_round_trip_with_metadata(store: CheckpointStore) -> None:
    meta = {"loss": 0.25, "tags": ["a", "b"], "nested": {"lr": 1e-3, "ok": True, "none": None}}
    payload = {
        "model.bin": os.urandom(5000),
        "optim/state.bin": bytearray(b"opt"),
        "view.bin": memoryview(b"abcdef")[1:4],
        "empty": b"",
    }
    ref = store.save(step=10, payload=payload, metadata=meta, attempt=2)
    assert isinstance(ref, CheckpointRef)
    assert (ref.step, ref.attempt, ref.metadata) == (10, 2, meta)
    latest = store.latest()
    assert latest == ref and CheckpointRef.from_dict(latest.to_dict()) == ref
    loaded = store.load(latest)
    assert loaded == {k: bytes(v) for k, v in payload.items()}


def test_latest_orders_by_step_then_attempt(store: CheckpointStore) -> None:
    store.save(3, {"a": b"3"}, attempt=1)
    store.save(5, {"a": b"5"}, attempt=1)
    assert store.latest().step == 5
    store.save(5, {"a": b"5b"}, attempt=2)
    ref = store.latest()
    assert (ref.step, ref.attempt) == (5, 2) and store.load(ref) == {"a": b"5b"}
    assert [(r.step, r.attempt) for r in store.list()] == [(3, 1), (5, 1), (5, 2)]


def test_same_step_twice_does_not_collide(store: CheckpointStore) -> None:
    first = store.save(7, {"a": b"1"})
    second = store.save(7, {"a": b"2"})
    assert first.checkpoint_id != second.checkpoint_id
    assert store.load(first) == {"a": b"1"} and store.load(second) == {"a": b"2"}
    assert store.latest() == second


def test_streams_files_and_file_objects(store: CheckpointStore, tmp_path: Path) -> None:
    big = os.urandom((9 << 20) + 17)  # several chunks, odd tail
    path = tmp_path / "big.bin"
    path.write_bytes(big)
    ref = store.save(1, {"path": path, "str_path": str(path), "fileobj": io.BytesIO(big[:12345])})
    loaded = store.load(ref)
    assert loaded == {"path": big, "str_path": big, "fileobj": big[:12345]}


def test_load_to_dir_streams_verified_files(store: CheckpointStore, tmp_path: Path) -> None:
    ref = store.save(1, {"a/b.bin": b"x" * 100, "c": b"y"})
    out = store.load_to_dir(ref, tmp_path / "restore")
    assert Path(out["a/b.bin"]).read_bytes() == b"x" * 100 and Path(out["c"]).read_bytes() == b"y"


def test_load_of_pruned_checkpoint_is_not_found(store: CheckpointStore) -> None:
    old = store.save(1, {"a": b"1"})
    store.save(2, {"a": b"2"})
    store.prune(keep=1)
    with pytest.raises(CheckpointNotFound, match=old.checkpoint_id):
        store.load(old)


def test_refs_from_another_process_load_here(store: CheckpointStore) -> None:
    ref = store.save(4, {"a": b"data"}, {"k": "v"})
    again = open_store(store.uri)
    assert again.load(CheckpointRef.from_dict(ref.to_dict())) == {"a": b"data"}


# -- validation: nothing is written ------------------------------------------------------
@pytest.mark.parametrize(
    "name, words",
    [
        ("../x", ".."),
        ("a/../../x", ".."),
        ("/abs", "absolute"),
        ("", "empty"),
        ("a\\b", "backslash"),
        ("MANIFEST.json", "manifest"),
        ("a\x00b", "NUL"),
        ("a//b", "empty part"),
        ("dir/", "empty part"),
        ("./a", "'.'"),
        (".spot-tmp-x", "reserved"),
        (3, "int"),
    ],
)
def test_bad_payload_names_write_nothing(store: CheckpointStore, name: object, words: str) -> None:
    root = Path(store.backend.root)
    with pytest.raises(ConfigError, match="relative POSIX paths") as info:
        store.save(1, {"ok.bin": b"fine", name: b"x"})
    assert words in str(info.value)
    assert _files_on_disk(root) == []


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"step": -1}, "step"),
        ({"step": 1.5}, "step"),
        ({"step": True}, "step"),
        ({"attempt": -2}, "attempt"),
        ({"payload": {}}, "non-empty"),
        ({"payload": {"a": "text"}}, "not an existing file"),
        ({"payload": {"a": 42}}, "int"),
        ({"payload": {"a": b"1", "a/b": b"2"}}, "collide"),
        ({"metadata": {"when": object()}}, "JSON"),
        ({"metadata": {"x": float("nan")}}, "JSON"),
        ({"metadata": ["not", "a", "dict"]}, "dict"),
    ],
)
def test_bad_save_arguments_write_nothing(store: CheckpointStore, kwargs: dict, words: str) -> None:
    store.save(1, {"a": b"keep"})
    before = _files_on_disk(Path(store.backend.root))
    args = {"step": 2, "payload": {"a": b"new"}, **kwargs}
    with pytest.raises(ConfigError, match=words):
        store.save(**args)
    assert _files_on_disk(Path(store.backend.root)) == before
    assert [r.step for r in store.list()] == [1]


class _ExplodingReader(io.RawIOBase):
    """A streamed source that fails after a few MiB, like a dying network mount."""

    def __init__(self) -> None:
        self.sent = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self.sent > 6 << 20:
            raise OSError("source device went away")
        self.sent += size
        return b"z" * size


def test_failed_streamed_save_leaves_no_partial_checkpoint(store: CheckpointStore) -> None:
    good = store.save(1, {"a": b"keep"})
    before = _files_on_disk(Path(store.backend.root))
    with pytest.raises(Exception, match="source device went away"):
        store.save(2, {"first": os.urandom(1000), "stream": _ExplodingReader()})
    assert _files_on_disk(Path(store.backend.root)) == before
    assert store.list() == [good] and store.latest() == good
    assert store.load(good) == {"a": b"keep"}


def test_exception_class_from_source_propagates(store: CheckpointStore) -> None:
    class Boom(io.RawIOBase):
        def read(self, size: int = -1) -> bytes:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.save(1, {"x": Boom()})
    assert _files_on_disk(Path(store.backend.root)) == []


# -- prune -------------------------------------------------------------------------------
def test_prune_keeps_newest(store: CheckpointStore) -> None:
    refs = [store.save(s, {"a": str(s).encode()}) for s in range(1, 7)]
    deleted = store.prune(keep=3)
    assert sorted(deleted) == sorted(r.checkpoint_id for r in refs[:3])
    assert store.list() == refs[3:]
    assert store.prune(keep=3) == []


@pytest.mark.parametrize("keep", [0, -1, 1.5, True])
def test_prune_rejects_bad_keep(store: CheckpointStore, keep: object) -> None:
    store.save(1, {"a": b"1"})
    with pytest.raises(ConfigError, match="keep"):
        store.prune(keep=keep)
    assert len(store.list()) == 1


def test_prune_removes_old_torn_saves_but_not_newer_ones(store: CheckpointStore) -> None:
    root = Path(store.backend.root) / "checkpoints"
    old_torn = root / "step-000000000001-attempt-0001-0badc0de"
    new_torn = root / "step-000000000009-attempt-0001-0badc0de"
    for torn in (old_torn, new_torn):
        torn.mkdir(parents=True)
        (torn / "model.bin").write_bytes(b"half")
    store.save(5, {"a": b"5"})
    assert [r.step for r in store.list()] == [5]
    store.prune(keep=1)
    assert not old_torn.exists() and new_torn.exists()


# -- fencing -----------------------------------------------------------------------------
def test_older_attempt_is_fenced_out_after_newer_commit(store: CheckpointStore) -> None:
    store.save(10, {"a": b"a1"}, attempt=1)
    store.save(12, {"a": b"a2"}, attempt=2)
    with pytest.raises(FencedOut, match="attempt 1 may not write"):
        store.save(20, {"a": b"zombie"}, attempt=1)
    latest = store.latest()
    assert (latest.step, latest.attempt) == (12, 2)
    assert all(r.attempt == 2 or r.step == 10 for r in store.list())
    assert not any(
        "attempt-0001" in p and "step-000000000020" in p
        for p in _files_on_disk(Path(store.backend.root))
    )


def test_fence_refuses_old_attempt_before_new_one_saves(store: CheckpointStore) -> None:
    store.save(10, {"a": b"a1"}, attempt=1)
    store.fence(2)
    with pytest.raises(FencedOut):
        store.save(11, {"a": b"zombie"}, attempt=1)
    with pytest.raises(FencedOut):
        store.fence(1)
    store.fence(2)  # idempotent
    assert store.save(11, {"a": b"new"}, attempt=2).attempt == 2
    assert store.fence_level() == 2


def _zombie_is_refused(store: CheckpointStore, fence_it) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE_WRITER, store.uri], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 20
        while not any(r.attempt == 1 for r in store.list()):
            assert time.monotonic() < deadline and proc.poll() is None, "zombie never saved"
            time.sleep(0.01)
        fence_it()
        committed_at_fence = {r.checkpoint_id for r in store.list() if r.attempt == 1}
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert out.startswith("fenced")
    assert {r.checkpoint_id for r in store.list() if r.attempt == 1} <= committed_at_fence


def test_zombie_process_is_fenced_by_new_attempts_commit(store: CheckpointStore) -> None:
    _zombie_is_refused(store, lambda: store.save(10**6, {"a": b"resumed"}, attempt=2))
    assert store.latest().attempt == 2
    assert store.load(store.latest()) == {"a": b"resumed"}


def test_zombie_process_is_fenced_by_fence_call(store: CheckpointStore) -> None:
    _zombie_is_refused(store, lambda: store.fence(2))


# -- digests: new saves record blake3; version-1 manifests (sha256) still verify ------------
def _as_version_1(store, ref) -> None:
    """Rewrite a saved checkpoint's manifest as spot-pipelines 0.1 wrote it: format
    version 1 and a sha256 per file."""
    import hashlib
    import json as _json

    from spot_core.checkpoint.manifest import _body_digest

    folder = Path(store.backend.root) / "checkpoints" / ref.checkpoint_id
    doc = _json.loads((folder / "MANIFEST.json").read_text())
    doc.pop("body_sha256")
    doc["version"] = 1
    doc["files"] = {
        name: {
            "size": entry["size"],
            "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest(),
        }
        for name, entry in doc["files"].items()
    }
    (folder / "MANIFEST.json").write_text(_json.dumps({**doc, "body_sha256": _body_digest(doc)}))


def test_new_saves_name_blake3_and_verify(tmp_path: Path) -> None:
    import json as _json

    from blake3 import blake3

    store = open_store(f"file://{tmp_path}/s")
    payload = {"model.bin": os.urandom(9 << 20), "small.json": b"{}"}
    ref = store.save(1, payload)
    folder = Path(store.backend.root) / "checkpoints" / ref.checkpoint_id
    files = _json.loads((folder / "MANIFEST.json").read_text())["files"]
    assert files["model.bin"] == {
        "size": 9 << 20,
        "blake3": blake3(payload["model.bin"]).hexdigest(),
    }
    assert store.load(store.latest()) == payload


def test_a_version_1_sha256_checkpoint_still_verifies_and_loads(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/s")
    old = store.save(1, {"model.bin": b"from 0.1" * 1000})
    _as_version_1(store, old)
    assert store.latest().step == 1
    assert store.load(store.latest()) == {"model.bin": b"from 0.1" * 1000}
    out = store.load_to_dir(store.latest(), tmp_path / "restore")
    assert Path(out["model.bin"]).read_bytes() == b"from 0.1" * 1000
    store.save(2, {"model.bin": b"new"})
    assert [r.step for r in store.list()] == [1, 2]


def test_a_version_1_checkpoint_with_damaged_bytes_is_skipped(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/s")
    store.save(1, {"model.bin": b"good"})
    old = store.save(2, {"model.bin": b"from 0.1"})
    _as_version_1(store, old)
    (Path(store.backend.root) / "checkpoints" / old.checkpoint_id / "model.bin").write_bytes(
        b"from 0.X"
    )
    assert store.latest().step == 1


def test_newest_is_the_last_listed_checkpoint_for_few_reads(store: CheckpointStore) -> None:
    """What a waiting replacement polls: the same answer as ``list()[-1]`` (torn saves
    newer than it skipped, a later attempt at the same step newer), reading only the
    newest manifests, not every one."""
    assert store.newest() is None
    for step in (5, 10, 15):
        store.save(step, {"a": str(step).encode()}, attempt=1)
    store.fence(2)
    store.save(15, {"a": b"15 again"}, attempt=2)
    torn = Path(store.backend.root) / "checkpoints" / "step-000000000020-attempt-0002-0badc0de"
    torn.mkdir(parents=True)
    (torn / "a").write_bytes(b"half")
    listed = store.list()
    reads: list[str] = []
    get_bytes = store.backend.get_bytes

    def counting(key: str, *args, **kwargs):
        reads.append(key)
        return get_bytes(key, *args, **kwargs)

    store.backend.get_bytes = counting  # type: ignore[method-assign]
    newest = store.newest()
    assert newest == listed[-1] and (newest.step, newest.attempt) == (15, 2)
    assert len(reads) == 2 and len(listed) == 4  # the torn one and the newest: not all five


def test_a_local_store_loads_concurrently_as_it_loads(store: CheckpointStore) -> None:
    """A file store gains nothing from reading files at once (make bench-resume: 0.57x on
    2 cores), so a replacement's prefetch reads it as ``load`` does: the same verified
    bytes, and a damaged file named the same way."""
    ref = store.save(1, {"model.bin": b"m" * 4096, "opt/state.bin": b"o"}, {})
    assert store.load_concurrently(ref) == store.load(ref)
    damaged = Path(store.uri.removeprefix("file://")) / "checkpoints" / ref.checkpoint_id
    (damaged / "model.bin").write_bytes(b"x" * 4096)
    with pytest.raises(CorruptCheckpoint, match="model.bin"):
        open_store(store.uri).load_concurrently(ref)
