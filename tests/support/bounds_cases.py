"""Out-of-range values for every knob with a maximum, and the settings model's one line
for each: every surface's bounds test (the CLI, SpotJobOperator, @task.spot, the Prefect
block, the spot worker's variables and job configuration, spot_task) feeds these and
expects that line, behind the surface's own prefix."""

from __future__ import annotations

from spot_core.errors import ConfigError
from spot_core.settings import KNOBS, Knob, SpotSettings


def over(k: Knob):
    """A value just past ``k``'s maximum, as a user writes it on every surface (a
    duration as text, so it prints alike; whole numbers as ints)."""
    if k.kind == "duration":
        return "25h" if k.maximum <= 86400 else "366d"
    if k.kind == "int":
        return int(k.maximum) + 1
    return float(k.maximum) * 10


def model_line(k: Knob, value) -> str:
    """The settings model's refusal of ``value`` for ``k``."""
    try:
        SpotSettings.build(**{k.name: value})
    except ConfigError as exc:
        return str(exc)
    raise AssertionError(f"the model took {k.name}={value!r}")


def bounded(surface: str) -> list[Knob]:
    """The knobs of ``surface`` that have a maximum."""
    return [k for k in KNOBS if surface in k.surfaces and k.maximum is not None]
