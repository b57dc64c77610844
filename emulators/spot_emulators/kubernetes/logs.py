"""A container's log as the kubelet keeps it: timestamped lines of stdout and stderr
interleaved, served with the ``log`` subresource's options (timestamps, sinceSeconds,
sinceTime, tailLines, limitBytes, follow)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator

from .timefmt import rfc3339_nano

MAX_LINES = 200_000  # the kubelet rotates logs too; older lines are dropped


class ContainerLog:
    def __init__(self) -> None:
        self._lines: deque[tuple[float, bytes]] = deque(maxlen=MAX_LINES)
        self._dropped = 0
        self._cond = threading.Condition()
        self.closed = False

    def append(self, line: bytes, at: float | None = None) -> None:
        with self._cond:
            if len(self._lines) == self._lines.maxlen:
                self._dropped += 1
            self._lines.append((time.time() if at is None else at, line))
            self._cond.notify_all()

    def close(self) -> None:
        """No more lines: the container ended; a following reader finishes."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def _snapshot(self) -> tuple[list[tuple[float, bytes]], int]:
        with self._cond:
            return list(self._lines), self._dropped + len(self._lines)

    def render(self, line: tuple[float, bytes], timestamps: bool) -> bytes:
        at, data = line
        data = data if data.endswith(b"\n") else data + b"\n"
        return (rfc3339_nano(at).encode() + b" " + data) if timestamps else data

    def read(
        self,
        *,
        timestamps: bool = False,
        since: float | None = None,
        tail: int | None = None,
        limit_bytes: int | None = None,
    ) -> bytes:
        lines, _ = self._snapshot()
        return _limit(
            b"".join(self.render(line, timestamps) for line in _select(lines, since, tail)),
            limit_bytes,
        )

    def follow(
        self,
        stop: threading.Event,
        *,
        timestamps: bool = False,
        since: float | None = None,
        tail: int | None = None,
        max_seconds: float = 3600.0,
    ) -> Iterator[bytes]:
        """Existing lines, then new ones as they come, until the container ends, ``stop``
        is set or ``max_seconds`` pass (every wait is bounded)."""
        lines, total = self._snapshot()
        for line in _select(lines, since, tail):
            yield self.render(line, timestamps)
        deadline = time.monotonic() + max_seconds
        while not stop.is_set() and time.monotonic() < deadline:
            with self._cond:
                seen = self._dropped + len(self._lines)
                if seen == total and not self.closed:
                    self._cond.wait(0.25)
                    continue
                fresh = list(self._lines)[max(0, len(self._lines) - (seen - total)) :]
                closed = self.closed
            total = seen
            for line in fresh:
                yield self.render(line, timestamps)
            if closed and not fresh:
                return


def _select(
    lines: list[tuple[float, bytes]], since: float | None, tail: int | None
) -> list[tuple[float, bytes]]:
    if since is not None:
        lines = [line for line in lines if line[0] >= since]
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    return lines


def _limit(data: bytes, limit_bytes: int | None) -> bytes:
    return data[:limit_bytes] if limit_bytes is not None and limit_bytes >= 0 else data
