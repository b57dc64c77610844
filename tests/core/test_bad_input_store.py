"""Bad objects read back from a checkpoint store, and stores that cannot be written.

Every object in a store can be written by someone other than this process (a reclaimed
node, another job, a hand): each case here is a forged or damaged object, and the rule
is the same for all of them. ``latest()`` and ``list()`` skip it as corrupt and fall back
to the last good checkpoint; nothing outside the store or the load target is created;
a store that cannot be written is one CheckpointError that names the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spot_core.checkpoint import CheckpointStore, open_store
from spot_core.checkpoint.heartbeat import HEARTBEAT_KEY, Heartbeat
from spot_core.checkpoint.manifest import _body_digest
from spot_core.checkpoint.store import FENCE_KEY
from spot_core.errors import CheckpointNotFound, ConfigError, CorruptCheckpoint

GOOD = {"model.bin": b"good" * 100}


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    store = open_store(f"file://{tmp_path}/store")
    store.save(1, GOOD, {"n": 1})
    return store


def _forge(store: CheckpointStore, step: int, edit) -> Path:
    """Save step ``step``, then rewrite its manifest with ``edit`` applied and a matching
    self-digest (what an attacker with write access to the bucket can do)."""
    ref = store.save(step, {"model.bin": b"forged"})
    path = Path(store.backend.root) / "checkpoints" / ref.checkpoint_id / "MANIFEST.json"
    doc = json.loads(path.read_text())
    doc.pop("body_sha256")
    text = edit(doc)
    path.write_text(text)
    return path


def _signed(doc: dict) -> str:
    return json.dumps({**doc, "body_sha256": _body_digest(doc)})


def _signed_allow_nan(doc: dict) -> str:
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return json.dumps({**doc, "body_sha256": hashlib.sha256(canonical.encode()).hexdigest()})


def _with_files(name: str):
    def edit(doc: dict) -> str:
        doc["files"] = {name: doc["files"]["model.bin"]}
        return _signed(doc)

    return edit


def _deep_json(depth: int) -> str:
    return '{"body_sha256": "x", "metadata": ' + "[" * depth + "]" * depth + "}"


BAD_MANIFESTS = {
    "nan created_at": lambda doc: _signed_allow_nan({**doc, "created_at": float("nan")}),
    "infinity step": lambda doc: _signed_allow_nan({**doc, "step": float("inf")}),
    "deep nesting (100k)": lambda doc: _deep_json(100_000),
    "deep nesting under the limit of the parser": lambda doc: _signed(
        {**doc, "metadata": json.loads("[" * 200 + "]" * 200)}
    ),
    "dotdot file name": _with_files("../../escape.bin"),
    "absolute file name": _with_files("/etc/escape.bin"),
    "newline in file name": _with_files("model\n.bin"),
    "U+0085 in file name": _with_files("model\x85.bin"),
    "bidi override in file name": _with_files("model\u202enib.exe"),
    "backslash file name": _with_files("..\\escape.bin"),
    "empty file name": _with_files(""),
    "very long file name": _with_files("x" * 300),
    "size is a string": lambda doc: _signed(
        {
            **doc,
            "files": {"model.bin": {"size": "6", "blake3": doc["files"]["model.bin"]["blake3"]}},
        }
    ),
    "negative size": lambda doc: _signed(
        {**doc, "files": {"model.bin": {"size": -1, "blake3": doc["files"]["model.bin"]["blake3"]}}}
    ),
    "digest not hex": lambda doc: _signed(
        {**doc, "files": {"model.bin": {"size": 6, "blake3": "z" * 64}}}
    ),
    "sha256 not hex": lambda doc: _signed(
        {**doc, "files": {"model.bin": {"size": 6, "sha256": "z" * 64}}}
    ),
    "unknown digest": lambda doc: _signed(
        {**doc, "files": {"model.bin": {"size": 6, "md5": "0" * 64}}}
    ),
    "two digests": lambda doc: _signed(
        {
            **doc,
            "files": {
                "model.bin": {
                    "size": 6,
                    "blake3": doc["files"]["model.bin"]["blake3"],
                    "sha256": hashlib.sha256(b"forged").hexdigest(),
                }
            },
        }
    ),
    "format version from the future": lambda doc: _signed({**doc, "version": 3}),
    "files is a list": lambda doc: _signed({**doc, "files": []}),
    "step disagrees with the id": lambda doc: _signed({**doc, "step": 10**9}),
    "manifest is a JSON list": lambda doc: json.dumps([doc]),
    "manifest is not JSON": lambda doc: "\x00\xff not json",
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_a_forged_manifest_is_skipped_by_latest_and_list(store, case, caplog) -> None:
    _forge(store, 2, BAD_MANIFESTS[case])
    assert store.latest().step == 1
    assert [r.step for r in store.list()] == [1]
    assert store.load(store.latest()) == GOOD
    assert "skipping checkpoint" in caplog.text


def test_a_manifest_that_is_a_folder_is_skipped(store) -> None:
    ref = store.save(2, {"model.bin": b"x"})
    manifest = Path(store.backend.root) / "checkpoints" / ref.checkpoint_id / "MANIFEST.json"
    manifest.unlink()
    manifest.mkdir()
    assert store.latest().step == 1


def test_a_payload_file_that_is_a_folder_is_skipped(store) -> None:
    ref = store.save(2, {"model.bin": b"x"})
    payload = Path(store.backend.root) / "checkpoints" / ref.checkpoint_id / "model.bin"
    payload.unlink()
    payload.mkdir()
    assert store.latest().step == 1


@pytest.mark.parametrize("name", ["../../outside/escape.bin", "/abs/escape.bin"])
def test_load_to_dir_creates_nothing_outside_its_target(store, tmp_path, name) -> None:
    path = _forge(store, 2, _with_files(name))
    target = tmp_path / "restore" / "here"
    before = sorted(p.name for p in tmp_path.iterdir())
    forged_ref = type(store.latest())(
        store_uri=store.uri, checkpoint_id=path.parent.name, step=2, attempt=1, created_at=0.0
    )
    with pytest.raises(CorruptCheckpoint, match="escape.bin"):
        store.load_to_dir(forged_ref, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing created beside"
    assert not (tmp_path / "outside").exists() and not Path("/abs").exists()


def test_load_to_dir_refuses_a_symlink_out_of_its_target(store, tmp_path) -> None:
    ref = store.save(3, {"sub/model.bin": b"payload"})
    target = tmp_path / "restore"
    target.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (target / "sub").symlink_to(elsewhere)
    with pytest.raises(CorruptCheckpoint, match="outside"):
        store.load_to_dir(ref, target)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("ref", [None, "step-1"])
def test_load_of_nothing_is_checkpoint_not_found(tmp_path, ref) -> None:
    empty = open_store(f"file://{tmp_path}/empty")
    assert empty.latest() is None
    with pytest.raises(CheckpointNotFound, match="check for None|not a checkpoint id"):
        empty.load(empty.latest() if ref is None else ref)
    with pytest.raises(CheckpointNotFound):
        empty.load_to_dir(ref, tmp_path / "out")


BAD_FENCES = [
    b"",
    b"garbage",
    b"[]",
    b'{"attempt": NaN}',
    b'{"attempt": -3}',
    b'{"attempt": "7"}',
    b'{"attempt": true}',
    b"[" * 100_000,
]


@pytest.mark.parametrize("data", BAD_FENCES, ids=lambda d: repr(d[:20]))
def test_a_corrupt_fence_blocks_neither_latest_nor_the_next_attempt(store, data) -> None:
    (Path(store.backend.root) / FENCE_KEY).write_bytes(data)
    assert store.latest().step == 1
    store.fence(2)  # the next attempt starts and rewrites the fence
    assert store.fence_level() == 2
    store.save(2, GOOD, attempt=2)
    assert store.latest().step == 2


BAD_BEATS = [
    b"",
    b"garbage",
    b"[]",
    b'{"attempt": 1, "renewed_at": NaN, "sequence": 1}',
    b'{"attempt": 1, "renewed_at": "x", "sequence": 1}',
    b"[" * 100_000,
    b'{"attempt": 1e999, "renewed_at": 1, "sequence": 1}',
]


@pytest.mark.parametrize("data", BAD_BEATS, ids=lambda d: repr(d[:20]))
def test_a_corrupt_heartbeat_reads_as_no_beat(store, data) -> None:
    store.put_object(HEARTBEAT_KEY, data)
    assert Heartbeat(store).read() is None
    assert store.latest().step == 1


# -- objects that are no regular file, or too large to be what a writer made ---------------
# A FIFO with no writer blocks open() for ever, /dev/zero never ends a read, a sparse file
# of a TiB costs nothing to make: each used to hang latest(), save() or fence() while the
# attempt's lease billed. Each is now a corrupt object: skipped, or an error for load.
def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero_link(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _link_elsewhere(path: Path) -> None:
    other = path.parent / ".." / "elsewhere"
    other.write_bytes(b"not an object of this store")
    path.symlink_to(other.resolve())


def _device(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers


def _huge(path: Path) -> None:
    with open(path, "wb") as fh:
        fh.truncate(1 << 40)  # sparse: a TiB that takes no disk (and hours to hash)


NOT_OBJECTS = {
    "fifo": _fifo,
    "symlink to /dev/zero": _zero_link,
    "symlink elsewhere": _link_elsewhere,
    "char device": _device,
    "a sparse TiB": _huge,
}


def _replace(path: Path, make) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    make(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(NOT_OBJECTS))
@pytest.mark.parametrize("which", ["payload", "manifest"])
def test_a_payload_or_manifest_that_is_no_file_is_skipped_and_never_blocks(
    store, kind, which
) -> None:
    ref = store.save(2, {"model.bin": b"newer"})
    folder = Path(store.backend.root) / "checkpoints" / ref.checkpoint_id
    _replace(folder / ("model.bin" if which == "payload" else "MANIFEST.json"), NOT_OBJECTS[kind])
    assert store.latest().step == 1, "the newer checkpoint is skipped as corrupt"
    with pytest.raises(CorruptCheckpoint):
        store.load(ref)
    with pytest.raises(CorruptCheckpoint):
        store.load_to_dir(ref, folder.parent.parent.parent / "restored")
    store.fence(2)
    assert store.save(3, GOOD, attempt=2).step == 3
    store.prune(keep=1)
    assert store.load(store.latest()) == GOOD


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(NOT_OBJECTS))
def test_a_fence_that_is_no_file_blocks_nothing_and_the_next_fence_replaces_it(store, kind) -> None:
    _replace(Path(store.backend.root) / FENCE_KEY, NOT_OBJECTS[kind])
    assert store.latest().step == 1
    assert store.save(2, GOOD).step == 2
    store.fence(3)
    assert store.fence_level() == 3
    assert (Path(store.backend.root) / FENCE_KEY).is_file()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(NOT_OBJECTS))
def test_a_heartbeat_that_is_no_file_reads_as_no_beat(store, kind) -> None:
    path = Path(store.backend.root) / HEARTBEAT_KEY
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace(path, NOT_OBJECTS[kind])
    assert Heartbeat(store).read() is None
    assert Heartbeat(store).renew(attempt=1, now=1.0).sequence == 1  # and is replaced
    assert Heartbeat(store).read().attempt == 1


@pytest.mark.parametrize(
    "data,expected",
    [
        (None, {}),
        (b"garbage", {}),
        (b"[1, 2]", {}),
        (b"[" * 100_000, {}),
        (b'{"exit_code": "0", "ended_at": NaN}', {}),
        (b'{"exit_code": true, "notice_at": -5, "ended_at": "soon"}', {}),
        (
            b'{"exit_code": 3, "notice_at": 10.5, "ended_at": 12}',
            {"exit_code": 3, "notice_at": 10.5, "ended_at": 12.0},
        ),
    ],
    ids=lambda v: repr(v)[:24],
)
def test_a_corrupt_status_report_keeps_only_well_typed_fields(data, expected) -> None:
    from spot_core.providers.ec2_agent import parse_report

    assert parse_report(data) == expected


@pytest.mark.parametrize(
    "name",
    [
        "a\nb.bin",
        "x" * 256,
        # Unicode control (Cc), format (Cf: bidi overrides and isolates, zero-width) and
        # line/paragraph separators: documented as refused, they used to pass
        "next\x85line.bin",
        "model\u202enib.exe",
        "rtl\u2067.bin",
        "line\u2028sep.bin",
        "para\u2029sep.bin",
        "zero\u200bwidth.bin",
        "bom\ufeff.bin",
        "c1\x9b.bin",
    ],
    ids=repr,
)
def test_odd_payload_names_are_refused_on_save(store, name) -> None:
    with pytest.raises(ConfigError, match="payload name"):
        store.save(5, {name: b"x"})
    assert store.latest().step == 1
    assert [p.name for p in (Path(store.backend.root) / "checkpoints").iterdir()] == [
        store.latest().checkpoint_id
    ], "nothing was written"


@pytest.mark.parametrize("name", ["ü-model.bin", "日本語/重み.bin", "emoji-\U0001f600.bin"])
def test_printable_unicode_payload_names_still_save_and_load(store, name) -> None:
    ref = store.save(5, {name: b"x"})
    assert store.load(store.latest()) == {name: b"x"} and store.latest() == ref


def test_metadata_too_deep_to_read_back_is_refused_on_save(store) -> None:
    with pytest.raises(ConfigError, match="nests deeper"):
        store.save(5, GOOD, {"x": json.loads("[" * 100 + "]" * 100)})


# -- a store that cannot be written -----------------------------------------------------
# A real full file system and a real read-only one: a small tmpfs in a private user and
# mount namespace (``unshare -rm``; no privilege needed), so the kernel's own ENOSPC and
# EROFS reach the store, not an injected exception.
UNWRITABLE = textwrap.dedent("""
    import json, os, subprocess, sys
    from spot_core.checkpoint import open_store
    from spot_core.errors import CheckpointError
    mount, mode = sys.argv[1], sys.argv[2]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mount], check=True)
    store = open_store(f"file://{mount}/store")
    store.fence(1)
    ref = store.save(1, {"model.bin": b"good" * 100})
    fence_before = open(f"{mount}/store/FENCE.json", "rb").read()
    if mode == "full":
        try:
            with open(f"{mount}/filler", "wb") as fh:
                while True:
                    fh.write(b"x" * 4096); fh.flush()
        except OSError:
            pass
    else:
        subprocess.run(["mount", "-o", "remount,ro", mount], check=True)
    try:
        store.fence(2)
        result = {"raised": None}
    except CheckpointError as exc:
        result = {"raised": type(exc).__name__, "message": str(exc),
                  "retryable": exc.retryable}
    except BaseException as exc:
        result = {"raised": type(exc).__name__, "message": str(exc), "raw": True}
    result["intact"] = store.load(store.latest()) == {"model.bin": b"good" * 100}
    result["fence_kept"] = open(f"{mount}/store/FENCE.json", "rb").read() == fence_before
    names = os.listdir(f"{mount}/store")
    result["leftovers"] = sorted(n for n in names if n.startswith(".spot-tmp"))
    print(json.dumps(result))
""")


@pytest.mark.parametrize("mode,fix", [("full", "free space"), ("read-only", "writable")])
def test_fence_on_an_unwritable_store_is_one_clear_error(tmp_path, mode, fix) -> None:
    if shutil.which("unshare") is None:
        pytest.fail("this test needs util-linux 'unshare' (apt-get install util-linux)")
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = tmp_path / "unwritable.py"
    script.write_text(UNWRITABLE)
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, str(script), str(mount), mode],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["raised"] == "StoreUnavailable", result  # a CheckpointError: infrastructure
    assert fix in result["message"] and "\n" not in result["message"]
    assert result["retryable"] is (mode == "full")
    assert result["intact"] and result["fence_kept"] and result["leftovers"] == []


# Every other operation that writes, on the same real full and read-only file systems: each
# used to end in a raw OSError (a traceback from the CLI, an unclassified failure in a step).
UNWRITABLE_OPS = textwrap.dedent("""
    import json, os, subprocess, sys
    from spot_core.checkpoint import open_store
    from spot_core.errors import CheckpointError
    mount, mode, op = sys.argv[1], sys.argv[2], sys.argv[3]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mount], check=True)
    store = open_store(f"file://{mount}/store")
    refs = [store.save(step, {"model.bin": b"good" * 100}) for step in (1, 2, 3)]
    store.put_object("status/attempt-000001.json", b"{}")
    os.makedirs(f"{mount}/restore")
    if mode == "full":
        try:
            with open(f"{mount}/filler", "wb") as fh:
                while True:
                    fh.write(b"x" * 4096); fh.flush()
        except OSError:
            pass
    else:
        subprocess.run(["mount", "-o", "remount,ro", mount], check=True)
    ops = {
        "prune": lambda: store.prune(keep=1),
        "put_object": lambda: store.put_object("status/attempt-000002.json", b"x" * 300_000),
        "delete_object": lambda: store.delete_object("status/attempt-000001.json"),
        "load_to_dir": lambda: store.load_to_dir(refs[-1], f"{mount}/restore"),
    }
    try:
        ops[op]()
        result = {"raised": None}
    except CheckpointError as exc:
        result = {"raised": type(exc).__name__, "message": str(exc), "retryable": exc.retryable}
    except BaseException as exc:
        result = {"raised": type(exc).__name__, "message": str(exc), "raw": True}
    result["intact"] = [store.load(r) for r in store.list()] == [{"model.bin": b"good" * 100}] * 3
    result["leftovers"] = sorted(n for _, _, names in os.walk(mount) for n in names
                                 if n.startswith(".spot-tmp"))
    print(json.dumps(result))
""")


@pytest.mark.parametrize(
    "mode,op",
    [
        ("read-only", "prune"),
        ("read-only", "put_object"),
        ("read-only", "delete_object"),
        ("read-only", "load_to_dir"),
        ("full", "put_object"),
        ("full", "load_to_dir"),
    ],
)
def test_every_write_to_an_unwritable_store_is_one_clear_error(tmp_path, mode, op) -> None:
    if shutil.which("unshare") is None:
        pytest.fail("this test needs util-linux 'unshare' (apt-get install util-linux)")
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = tmp_path / "unwritable_ops.py"
    script.write_text(UNWRITABLE_OPS)
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, str(script), str(mount), mode, op],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # the store's faults are the infrastructure's; a load target's is the caller's folder
    assert result["raised"] == ("CheckpointError" if op == "load_to_dir" else "StoreUnavailable")
    fix = "free space" if mode == "full" else "writable"
    assert fix in result["message"] and "\n" not in result["message"], result
    assert result["retryable"] is (mode == "full")
    assert result["intact"] and result["leftovers"] == []
