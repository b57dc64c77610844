"""Prefect fields from the settings model (``spot_core.settings``).

The ``SpotConfiguration`` block, the spot worker's variables (its work-pool form) and its
job configuration declare each knob with ``spot_field(name)``: the default and the
description come from the knob, and ``normalise`` (a ``mode="before"`` validator) runs
the knob's own check, so a duration given as ``"5m"`` or a ``timedelta`` is stored as
seconds, an old field name (``max_price_per_hour``, ``capacity_wait_seconds``) still
loads with a DeprecationWarning, and a bad value is refused with the model's one-line
message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict

from pydantic import Field

from spot_core.errors import ConfigError
from spot_core.jobs import provider_names
from spot_core.settings import KNOBS_BY_NAME, SpotSettings, resolve_aliases

# The providers that are built (the registry's names), as the form's choices: a Literal
# made at import, which a type checker cannot evaluate (to it, a provider name is a str).
if TYPE_CHECKING:
    ProviderName = str
else:
    ProviderName = Literal[provider_names()]


class _Bounds(TypedDict, total=False):
    """A field's numeric bounds, as pydantic ``Field`` takes them."""

    gt: float
    ge: float
    le: float


def description(name: str) -> str:
    """The knob's help, with the unit a form user types in."""
    knob = KNOBS_BY_NAME[name]
    if knob.kind == "duration" and knob.absolute:
        return (
            f"{knob.help} Seconds of capacity time (in Python also a timedelta or a "
            "string such as '5m', '2h'), or an ISO time such as '2026-12-01T08:00Z'."
        )
    if knob.kind == "duration":
        return f"{knob.help} Seconds (in Python also a timedelta or a string such as '5m', '2h')."
    if knob.unit:
        return f"{knob.help} In {knob.unit}."
    return knob.help


def spot_field(name: str) -> Any:
    """A pydantic ``Field`` with the knob's default and description."""
    knob = KNOBS_BY_NAME[name]
    bounds: _Bounds = {}
    if (
        knob.minimum is not None and not knob.absolute
    ):  # also the form's minimum (the model checks first)
        if knob.strict:
            bounds["gt"] = knob.minimum
        else:
            bounds["ge"] = knob.minimum
    if knob.maximum is not None and not knob.absolute:  # the form's maximum
        bounds["le"] = knob.maximum
    if isinstance(knob.default, (dict, tuple)):
        factory = dict if isinstance(knob.default, dict) else list
        return Field(default_factory=factory, description=description(name))
    return Field(default=knob.default, description=description(name), **bounds)


def normalise(data: Any, names: set[str], where: str) -> Any:
    """Field values renamed (old names) and checked by their knobs; ValueError in one line."""
    if not isinstance(data, dict):
        return data
    try:
        data = resolve_aliases(data, where=where)
        for name in names & set(data):
            data[name] = KNOBS_BY_NAME[name].parse(data[name])
    except ConfigError as exc:
        message = str(exc)
        raise ValueError(message if message.startswith(where) else f"{where}: {message}") from None
    for name, value in data.items():  # tuples from the model; the fields are lists
        if isinstance(value, tuple):
            data[name] = list(value)
    return data


def settings_of(model: Any, names: set[str], where: str) -> SpotSettings:
    """The SpotSettings of a block or job configuration (provider options checked)."""
    try:
        return SpotSettings.build(where=where, **{n: getattr(model, n) for n in names})
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
