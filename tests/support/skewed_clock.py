"""Run a module or script as a machine whose wall clock is off: ``time.time`` (and
``time.time_ns``) of this process read ``SPOT_TEST_CLOCK_OFFSET`` seconds ahead (negative:
behind). What the kernel stamps (file mtimes) and what another process or server reads
(moto's dates) are untouched, as on a second machine with a wrong clock.

    SPOT_TEST_CLOCK_OFFSET=3600 python tests/support/skewed_clock.py -m spot_core.cli run ...
    SPOT_TEST_CLOCK_OFFSET=-60 python tests/support/skewed_clock.py worker.py ARG ...

The clock is patched before anything else is imported, so defaults bound at import time
(``clock=time.time``) read the offset clock too. Child processes run on honest clocks.
"""

from __future__ import annotations

import os
import runpy
import sys
import time

OFFSET_SECONDS = float(os.environ["SPOT_TEST_CLOCK_OFFSET"])
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + OFFSET_SECONDS
time.time_ns = lambda: _time_ns() + int(OFFSET_SECONDS * 1e9)

if __name__ == "__main__":
    if sys.argv[1] == "-m":
        sys.argv = [sys.argv[2], *sys.argv[3:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
