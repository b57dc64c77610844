"""The notice file: how a step that cannot poll metadata learns of an interruption.

The watcher writes the notice's JSON event there (temp file + rename, so a reader sees
the old file or the whole new one, never half of it; only a regular file is replaced,
``spot_core.safe_files``); the step reads it, typically on SIGTERM or between training
steps. A reader never blocks on it: a FIFO or device there is refused, not opened. The
path travels in ``SPOT_NOTICE_FILE``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from spot_core import attempt_env
from spot_core.errors import ConfigError
from spot_core.interruption.base import Notice
from spot_core.safe_files import read_bytes, write_bytes

NOTICE_EVENTS = ("interruption", "rebalance")
_MAX_NOTICE_BYTES = 64 * 1024  # an event is ~200 bytes; anything far bigger is someone's file


def is_notice_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file holding one event a watcher wrote (so replacing
    or removing it loses nothing of the user's)."""
    try:
        doc = json.loads(
            read_bytes(path, limit=_MAX_NOTICE_BYTES, what="notice file", follow_symlinks=False)
        )
    except (OSError, ValueError, RecursionError):  # UnsafeFile is a ValueError
        return False
    return isinstance(doc, dict) and doc.get("event") in NOTICE_EVENTS and "detected_at" in doc


def check_notice_path(path: str, option: str = "--notice-file") -> str:
    """Refuse, in one line, a notice path the watcher would damage or cannot write.

    The watcher replaces the file on a notice and removes a stale one at start: both are
    safe only for a path that is free or holds a notice it wrote, never a user's file.
    """
    target = Path(path)
    if target.is_dir():
        raise ConfigError(
            f"{option} {path} is a directory; pass a file path such as {target / 'notice.json'}"
        )
    if os.path.lexists(target) and not is_notice_file(target):
        raise ConfigError(
            f"{option} {path} already exists and is not a notice file; pass "
            "a path that does not exist yet (the watcher replaces that file)"
        )
    parent = target.parent
    if parent.exists() and not parent.is_dir():
        raise ConfigError(
            f"{option} {path}: {parent} is not a directory; pass a path in a directory"
        )
    return path


def write_notice(path: str | os.PathLike[str], notice: Notice) -> None:
    """Atomically replace ``path`` with the notice's event JSON."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(target, json.dumps(notice.to_event(), allow_nan=False) + "\n", what="notice file")


def read_notice(path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The event in the notice file (default: ``$SPOT_NOTICE_FILE``), or None if none yet."""
    chosen = path if path is not None else os.environ.get(attempt_env.NOTICE_FILE)
    if not chosen:
        return None
    try:
        data = read_bytes(
            chosen, limit=_MAX_NOTICE_BYTES, what="notice file", follow_symlinks=False
        )
    except FileNotFoundError:
        return None
    event: dict[str, Any] | None = json.loads(data)
    return event
