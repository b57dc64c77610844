"""The notice file: how a step that cannot poll metadata learns of an interruption.

The watcher writes the notice's JSON event there (temp file + rename, so a reader sees
the old file or the whole new one, never half of it); the step reads it, typically on
SIGTERM or between training steps. The path travels in ``SPOT_NOTICE_FILE``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from spot_core import attempt_env
from spot_core.interruption.base import Notice


def write_notice(path: str | os.PathLike[str], notice: Notice) -> None:
    """Atomically replace ``path`` with the notice's event JSON."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(notice.to_event(), handle)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_notice(path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The event in the notice file (default: ``$SPOT_NOTICE_FILE``), or None if none yet."""
    chosen = path if path is not None else os.environ.get(attempt_env.NOTICE_FILE)
    if not chosen:
        return None
    try:
        return json.loads(Path(chosen).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
