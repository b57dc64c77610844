"""A container as local processes: started in a session of its own with a marker in its
environment, so the whole tree can be signalled and measured (even the parts that left
the group, as ``spot-pipelines watch`` does), its output captured into a ContainerLog,
and its memory held to ``limits.memory`` by a watchdog that SIGKILLs it (OOMKilled)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO

from spot_core.localcloud.lease_processes import marked_pids

from .logs import ContainerLog

MARKER = "SPOT_KUBE_EMULATOR_CONTAINER_ID"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class ContainerProcess:
    def __init__(
        self,
        container_id: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        log: ContainerLog,
        memory_limit: float | None,
    ) -> None:
        self.container_id = container_id
        self.log = log
        self.memory_limit = memory_limit
        self.oom_killed = False
        self.started_at = time.time()
        self.finished_at: float | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.exited = threading.Event()
        env = {**env, MARKER: container_id}
        self._process = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._pumps = [
            threading.Thread(
                target=self._pump, args=(pipe,), daemon=True, name=f"kube-log-{container_id[:8]}"
            )
            for pipe in (self._process.stdout, self._process.stderr)
        ]
        for pump in self._pumps:
            pump.start()
        threading.Thread(
            target=self._reap, daemon=True, name=f"kube-reap-{container_id[:8]}"
        ).start()
        if memory_limit:
            threading.Thread(
                target=self._watch_memory, daemon=True, name=f"kube-oom-{container_id[:8]}"
            ).start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def pids(self) -> list[int]:
        found = set(marked_pids(MARKER, self.container_id))
        if self._process.poll() is None:
            found.add(self._process.pid)
        return sorted(found)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """The container runtime's stop signal: to the container's PID 1 only, as a kubelet
        stopping a container sends it; the processes PID 1 started hear it only if PID 1
        passes it on (as ``spot-pipelines watch`` does), and get SIGKILL at the end of the
        grace period."""
        try:
            os.kill(self._process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def send(self, signum: int) -> None:
        """Signal every process of the container (its group and every marked descendant)."""
        try:
            os.killpg(self._process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in self.pids():
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def rss_bytes(self, pids: list[int] | None = None) -> int:
        total = 0
        for pid in self.pids() if pids is None else pids:
            try:
                with open(f"/proc/{pid}/statm") as statm:
                    total += int(statm.read().split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                continue
        return total

    def _watch_memory(self) -> None:
        """Sum the tree's RSS every 0.1 s (the process table is rescanned for new members
        every 0.5 s: reading every process's environment is the expensive part)."""
        pids, scanned = [], 0.0
        while not self.exited.wait(0.1):
            if time.monotonic() - scanned > 0.5:
                pids, scanned = self.pids(), time.monotonic()
            if self.rss_bytes(sorted(set(pids) | {self.pid})) > (self.memory_limit or 0):
                self.oom_killed = True
                self.send(signal.SIGKILL)
                return

    def _pump(self, pipe: IO[bytes]) -> None:
        for line in iter(pipe.readline, b""):
            self.log.append(line)
        pipe.close()

    def _reap(self) -> None:
        code = self._process.wait()
        for pump in self._pumps:
            pump.join(timeout=5)
        # PID 1 of a container exiting takes the rest of the container with it.
        for pid in marked_pids(MARKER, self.container_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.finished_at = time.time()
        if code < 0:
            self.signal, self.exit_code = -code, 128 - code
        else:
            self.exit_code = code
        if self.oom_killed:
            self.exit_code, self.signal = 137, signal.SIGKILL
        self.exited.set()

    def kill_now(self, timeout: float = 10.0) -> None:
        self.send(signal.SIGKILL)
        self.exited.wait(timeout)
