"""The documented maximums of every number the project parses, in one place.

A value that is finite but absurd (``--poll-interval 1e300``, ``--windows 10^20``,
``--time-scale 1e12``, a deadline 50 years away) used to pass the checks and then crash
a thread (``Event.wait`` overflows), exhaust memory or spin a core. Each kind of number
has a bound here; the settings model (``spot_core.settings``) gives every knob one of
them, so every surface refuses the same values with the same line, and the commands,
environment variables and wire formats outside the model use the same ones.
docs/reliability.md ("Bounds") lists them.
"""

from __future__ import annotations

MAX_WAIT_SECONDS = 86400.0
"""1d: no wait, poll interval, timeout or checkpoint interval above a day."""

MAX_SPAN_SECONDS = 365 * 86400.0
"""365d of capacity time: a deadline, the work, an attempt's time limit."""

MAX_COUNT = 10_000
"""Budgets (preemptions, retries, capacity waits): attempt numbers stay far below
``MAX_ATTEMPT``."""

MAX_ATTEMPT = 1_000_000
"""The highest attempt number a job reaches and a store is fenced at: far above what the
budgets allow, far below a typo such as 10^23 that would fence a store for ever."""

MAX_STEPS = 10**12
"""A step counter (total_steps, checkpoint_every_steps)."""

MAX_KEEP = 1000
"""Checkpoints kept in a store."""

MAX_PRICE = 1000.0
"""USD per hour: ten times the dearest GPU instance's on-demand price."""

MAX_RATE = 3600.0
"""Interruptions per hour: one a second."""

MIN_TICK_WALL_SECONDS = 1e-3
"""A replayed trace tick lasts at least this long on the wall clock: a time scale past
``tick_seconds / MIN_TICK_WALL_SECONDS`` made the local cloud spin a core per tick."""

MAX_TIME_SCALE = 3.6e6
"""Trace seconds per wall second: an hour-long tick per millisecond, whatever the trace."""

MAX_WINDOWS = 100_000
"""Windows one ``simulate`` replays."""

MAX_SEED = 2**63 - 1
"""A random seed."""
