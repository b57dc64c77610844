"""spot_core.safe_files from Python: the rules every command's reads and writes follow
(the commands' own tests drive them end to end: test_report_command, test_bad_input_*)."""

from __future__ import annotations

import os

import pytest

from spot_core.errors import ConfigError
from spot_core.safe_files import UnsafeFile, read_bytes, write_bytes


def test_a_nul_in_a_path_is_one_clear_error_not_a_value_error(tmp_path):
    with pytest.raises(UnsafeFile, match="NUL"):
        read_bytes(f"{tmp_path}/a\x00b", limit=10)
    with pytest.raises(UnsafeFile, match="NUL"):
        write_bytes(f"{tmp_path}/a\x00b", b"x")
    assert list(tmp_path.iterdir()) == []


def test_a_file_over_its_bound_is_refused_unread_and_one_at_it_is_read(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 11)
    with pytest.raises(UnsafeFile, match="holds more than 10 bytes"):
        read_bytes(path, limit=10)
    assert read_bytes(path, limit=11) == b"x" * 11


def test_a_write_changes_nothing_when_it_fails(tmp_path):
    target = tmp_path / "page.html"
    target.write_text("old")

    def chunks():
        yield b"new "
        raise RuntimeError("the source failed half-way")

    with pytest.raises(RuntimeError):
        write_bytes(target, chunks())
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["page.html"]
    with pytest.raises(ConfigError, match="does not exist"):
        write_bytes(tmp_path / "missing" / "page.html", b"x")
    assert not (tmp_path / "missing").exists()
