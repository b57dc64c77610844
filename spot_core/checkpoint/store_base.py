"""What every part of the checkpoint store shares: its backend, its URI, one warning per
bad object, and the one-line errors its calls raise (``store.py`` holds the commit
protocol; ``store_objects.py`` the job's other objects; ``fencing.py`` the fence)."""

from __future__ import annotations

import errno
import logging
import numbers

from spot_core.checkpoint.backend import ObjectBackend
from spot_core.checkpoint.manifest import Manifest
from spot_core.errors import ConfigError, CorruptCheckpoint, StoreUnavailable

log = logging.getLogger("spot_core.checkpoint.store")  # one logger for the store's parts


class StoreBase:
    """The state the store's parts read: set by ``CheckpointStore.__init__``."""

    backend: ObjectBackend
    uri: str
    _warned: set[str]

    def _warn_once(self, checkpoint_id: str, exc: Exception) -> None:
        if checkpoint_id not in self._warned:
            self._warned.add(checkpoint_id)
            log.warning("skipping checkpoint %s in %s: %s", checkpoint_id, self.uri, exc)


def step_went_back(step: int, newest: int, uri: str) -> ConfigError:
    """The one line for a save whose step is below a checkpoint's the store holds."""
    return ConfigError(
        f"checkpoint step {step} is below step {newest}, which {uri} already "
        "holds: steps must never go back (the new checkpoint would rank below "
        "the old ones, so latest() would skip it and pruning would delete "
        "it); pass a step that keeps growing across epochs and restarts, "
        "e.g. epoch * steps_per_epoch + step, or continue from the restored "
        "step (nothing was written)"
    )


def _unreadable(uri: str, key: str, exc: OSError) -> StoreUnavailable:
    """A store that cannot be read (permissions, an I/O error) as one line naming the fix."""
    return StoreUnavailable(
        f"could not read {key} in {uri}: {exc.strerror or exc}; check the "
        "store's permissions and disk (nothing was changed)",
        retryable=exc.errno in (errno.EIO, errno.EAGAIN, errno.ETIMEDOUT),
    )


def _is_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _unwritable(uri: str, what: str, exc: OSError) -> StoreUnavailable:
    """A full, read-only or unreachable store as one line that names the fix."""
    full = _is_full(exc)
    fix = "free space on it" if full else "make it writable or point the store URI elsewhere"
    return StoreUnavailable(
        f"could not {what} in {uri}: {exc.strerror or exc}; {fix} (existing "
        "checkpoints are untouched)",
        retryable=full,
    )


def _corrupt(manifest: Manifest, name: str, problem: str) -> CorruptCheckpoint:
    return CorruptCheckpoint(
        f"checkpoint {manifest.checkpoint_id} (step {manifest.step}): "
        f"payload file {name!r} {problem}"
    )


def _check_count(what: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """Accept any integral (also numpy ints), never bools or floats; return a plain int."""
    if (
        not isinstance(value, numbers.Integral)
        or isinstance(value, bool)
        or int(value) < minimum
        or (maximum is not None and int(value) > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum:,}"
        raise ConfigError(f"{what} must be an int {bound}, got {repr(value)[:40]}")
    return int(value)
