"""Processes the tests start: a free local port, and stopping a process or a whole tree.

Shared by every suite that starts servers (moto, PostgreSQL, `airflow standalone`, the
compose stack's services, the Prefect stack) and by the benchmarks (bench/processes.py),
so that each stops its processes the same, bounded way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def stop_tree(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM a process we started, its children and everything still in its session
    (an orphan re-parented to init keeps the session, e.g. the log server of a SIGKILLed
    triggerer), then SIGKILL what outlives ``timeout``. (psutil: in the environments
    that start such trees, Airflow's and the compose stack's.)"""
    import psutil

    try:
        parent = psutil.Process(pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    procs += [p for p in psutil.process_iter() if p not in procs and session_of(p.pid) == pid]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)


def stop_process(proc: subprocess.Popen, timeout: float = 30.0, *, session: bool = False) -> None:
    """SIGTERM, then SIGKILL after ``timeout``. ``session``: signal the whole session of a
    process started with ``start_new_session`` (the server's uvicorn and services too),
    else the process alone (a worker's lease processes must outlive it, as in production)."""

    def send(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig) if session else proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    if proc.poll() is None:
        send(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(timeout=10)
    if session:
        send(signal.SIGKILL)  # whatever of its session outlived it
