"""Find and signal every process of a local lease, the way a reclaimed node loses them all.

A local lease's processes may leave its process group (``spot-pipelines watch`` runs the
step in a session of its own) or be re-parented when the watcher dies, so neither a
process group nor a parent walk finds them reliably. Instead each lease exports a marker
variable that every descendant inherits, and the process table is searched for it.
Linux ``/proc`` only; elsewhere only the lease's own process is known.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

LEASE_MARKER = "SPOT_LOCAL_LEASE_ID"
_PROC = Path("/proc")


def lease_pids(lease_id: str) -> list[int]:
    """Live processes (other than this one) whose environment carries the lease's marker."""
    return marked_pids(LEASE_MARKER, lease_id)


def marked_pids(marker: str, value: str) -> list[int]:
    """Live processes (other than this one) whose environment has ``marker=value``: every
    descendant of a process started with it, however it left the process group."""
    needle = f"{marker}={value}".encode()
    found = []
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone already, or not ours to read
        if needle in environ.split(b"\0") and not _is_zombie(entry):
            found.append(int(entry.name))
    return found


def live_leases(prefix: str = "", job_id: str | None = None) -> dict[str, list[int]]:
    """Lease id -> its live processes, for every lease on this machine whose id starts
    with ``prefix`` (and whose processes carry ``SPOT_JOB_ID=job_id``, if given)."""
    marker, job = f"{LEASE_MARKER}=".encode(), f"SPOT_JOB_ID={job_id}".encode()
    found: dict[str, list[int]] = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        lease = next(
            (v[len(marker) :].decode(errors="replace") for v in environ if v.startswith(marker)),
            None,
        )
        if (
            lease is None
            or not lease.startswith(prefix)
            or _is_zombie(entry)
            or (job_id is not None and job not in environ)
        ):
            continue
        found.setdefault(lease, []).append(int(entry.name))
    return found


def _is_zombie(entry: Path) -> bool:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def signal_lease(lease_id: str, signum: int, extra_pids: tuple[int, ...] = ()) -> int:
    """Send ``signum`` to every process of the lease; return how many were signalled."""
    sent = 0
    for pid in set(lease_pids(lease_id)) | set(extra_pids):
        try:
            os.kill(pid, signum)
            sent += 1
        except (ProcessLookupError, PermissionError):
            pass
    return sent


def kill_lease(lease_id: str) -> int:
    return signal_lease(lease_id, signal.SIGKILL)
