"""The attempt's status report: a small JSON object next to the checkpoints.

At ``status/attempt-NNNNNN.json`` in the job's store: the step's exit code, when its
watcher saw a notice (and the deadline the notice gave), when it ended. The node writes it
(``spot-pipelines watch --report``, in a pod and on an EC2 instance; the EC2 user-data's
agent again after the step), at the first notice and again when the step ends, since a
reclaimed node may not live to write anything after. A provider reads it once the lease
is gone, to tell "the step exited 0" from "the node was reclaimed" when the cloud's own
state is ambiguous, and while the lease runs, to learn of a notice that no event queue
brought (EC2 without EventBridge) in time to hand over. Shared by the watcher and the
providers, so it lives with the job's other objects in its store.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from spot_core import attempt_env
from spot_core.checkpoint.uri import ACCEPTED_FORMS
from spot_core.errors import ConfigError

STATUS_PREFIX = "status"


def status_key(attempt: int) -> str:
    return f"{STATUS_PREFIX}/attempt-{attempt:06d}.json"


def parse_report(data: bytes | None) -> dict[str, int | float]:
    """The typed fields of a status report (``exit_code`` int, ``notice_at``, ``reclaim_at``
    and ``ended_at`` finite seconds); anything else, or an unreadable object, is dropped as corrupt.

    The node writes the report into a store others can write too, so what is read back is
    judged, never trusted: a forged or torn report only makes the outcome less precise."""
    try:
        doc = json.loads(data or b"{}", parse_constant=float)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict):
        return {}
    out: dict[str, int | float] = {}
    code = doc.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool) and -255 <= code <= 255:
        out["exit_code"] = code
    for key in ("notice_at", "reclaim_at", "ended_at"):
        value = doc.get(key)
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= 0
        ):
            out[key] = float(value)
    return out


def write_report(
    *,
    exit_code: int | None,
    notice_at: float | None,
    ended_at: float | None,
    environ: Mapping[str, str] | None = None,
    reclaim_at: float | None = None,
) -> dict[str, str | int | float | None]:
    """Write the attempt's status object to its store (``$SPOT_CHECKPOINT_URI``);
    ``reclaim_at``: when the notice said the capacity goes (None: it did not say)."""
    from spot_core.checkpoint.opening import open_store

    env = attempt_env.AttemptEnv.from_environ(environ)
    doc: dict[str, str | int | float | None] = {
        "job_id": env.job_id,
        "attempt": env.attempt,
        "exit_code": exit_code,
        "notice_at": notice_at,
        "reclaim_at": reclaim_at,
        "ended_at": ended_at,
    }
    if env.checkpoint_uri is None:
        raise ConfigError(
            f"{attempt_env.CHECKPOINT_URI} is not set, so the attempt's status report has "
            f"no store; set it to {ACCEPTED_FORMS} (spot-pipelines sets it for each attempt)"
        )
    store = open_store(env.checkpoint_uri)
    store.put_object(status_key(env.attempt), json.dumps(doc, allow_nan=False).encode())
    return doc
