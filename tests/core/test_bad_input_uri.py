"""Store URIs, job ids and temp folders: nothing created where the user did not ask.

``file://localhost/x`` is the local path /x (RFC 8089) and ``file:///a%20b`` is the folder
"a b"; any other host is one line. ``--job-id`` names a folder under .spot-runs/, so it
must be a plain name. A run leaves no ``spot-local-cloud-*`` folder in the temp directory,
whether it succeeds or stops on bad input.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from spot_core.checkpoint import open_store, parse_store_uri
from spot_core.errors import ConfigError
from spot_core.providers.local import LocalProvider

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "uri,path",
    [
        ("file://localhost/data/ckpt", "/data/ckpt"),
        ("file://LocalHost/data/ckpt", "/data/ckpt"),
        ("file:///data/a%20b", "/data/a b"),
        ("file://localhost/data/caf%C3%A9", "/data/café"),
        ("file:///data/x/../ckpt", "/data/ckpt"),
    ],
)
def test_file_uris_mean_the_local_decoded_path(uri, path):
    assert parse_store_uri(uri).path == path


@pytest.mark.parametrize(
    "uri,words",
    [
        ("file://fileserver/data/ckpt", "names host 'fileserver'"),
        ("file://localhost:8080/data", "names host"),
        ("file:///data/a%00b", "NUL"),
        ("file://localhost", "no absolute directory"),
        ("file:data/ckpt", "file:///"),
    ],
)
def test_bad_file_uris_are_one_line(uri, words):
    with pytest.raises(ConfigError) as caught:
        parse_store_uri(uri)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_an_opened_store_uses_the_decoded_path(tmp_path):
    store = open_store(f"file://localhost{tmp_path}/a%20b")
    store.save(1, {"m.bin": b"x"})
    assert (tmp_path / "a b" / "checkpoints").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a b"]


def _run(*args, cwd, tmpdir):
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    return subprocess.run(
        [sys.executable, "-m", "spot_core.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=cwd,
        env=env,
    )


@pytest.fixture
def dirs(tmp_path):
    work, tmp = tmp_path / "work dir", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    return work, tmp


@pytest.mark.parametrize(
    "uri,folder",
    [
        ("file://localhost{work}/store", "store"),
        ("file://{work_quoted}/a%20b", "a b"),
        (None, ".spot-runs"),
    ],
)
def test_a_run_writes_where_the_uri_says_and_leaves_no_temp_folder(dirs, uri, folder):
    work, tmp = dirs
    args = ["--job-id", "job-ok", "--pools", "us-east-2a"]
    if uri is not None:
        args += [
            "--checkpoint-uri",
            uri.format(work=work, work_quoted=str(work).replace(" ", "%20")),
        ]
    proc = _run(*args, "--", sys.executable, "-c", "pass", cwd=work, tmpdir=tmp)
    assert proc.returncode == 0, proc.stderr
    # the store where the URI says, and the step's output under .spot-runs/JOB_ID/logs
    assert sorted(p.name for p in work.iterdir()) == sorted({folder, ".spot-runs"}), (
        "no stray ./localhost or %20"
    )
    kept = {p.name for p in (work / ".spot-runs" / "job-ok").iterdir()}
    assert kept == ({"checkpoints", "logs"} if uri is None else {"logs"})
    assert list(tmp.iterdir()) == [], "the local cloud's temp folder is removed"


@pytest.mark.parametrize(
    "job_id", ["../x", "a/b", "..", ".hidden", "x" * 129, "a\x01b", "-rf", "a b"]
)
def test_a_job_id_that_is_not_a_plain_name_is_one_line_and_creates_nothing(dirs, job_id):
    work, tmp = dirs
    proc = _run(f"--job-id={job_id}", "--", "true", cwd=work, tmpdir=tmp)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--job-id" in lines[0] and "plain name" in lines[0]
    assert list(work.iterdir()) == [] and list(tmp.iterdir()) == []
    assert not (work.parent / "x").exists()


def test_a_run_that_stops_on_bad_input_leaves_no_temp_folder(dirs):
    work, tmp = dirs
    proc = _run("--pools", "atlantis-1a", "--", "true", cwd=work, tmpdir=tmp)
    assert proc.returncode == 2 and "unknown pool" in proc.stderr
    assert list(tmp.iterdir()) == []


def test_a_local_cloud_removes_its_temp_folder_on_close_and_when_dropped(tmp_path):
    with LocalProvider.from_traces() as provider:
        workdir = provider.cloud.workdir
        assert workdir.is_dir() and workdir.name.startswith("spot-local-cloud-")
    assert not workdir.exists()
    dropped = LocalProvider.from_traces().cloud.workdir
    gc.collect()
    assert not dropped.exists(), "a cloud never closed still removes its folder"
    given = tmp_path / "mine"
    with LocalProvider.from_traces(workdir=given):
        pass
    assert given.is_dir(), "a folder the caller gave is the caller's"
