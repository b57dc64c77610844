"""The command line's half of the settings: a ``spot-pipelines run`` flag for every CLI
knob declared in ``spot_core.settings`` (its name, help, default and bound from the one
declaration), and the flags' text parsed back into ``SpotSettings`` with one line naming
the flag when a value is bad."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterable
from typing import Any

from spot_core.errors import ConfigError
from spot_core.settings import (
    BOOL,
    CLI,
    DURATION,
    INT,
    KNOBS_BY_NAME,
    NAMES,
    NUMBER,
    TEXT,
    Knob,
    SpotSettings,
    format_duration,
    knobs_for,
)


def cli_flag(knob_: Knob) -> str:
    return "--" + knob_.name.replace("_", "-")


def cli_value(knob_: Knob, text: Any) -> Any:
    """The knob's value from a flag's text (one-line ConfigError naming the flag).

    Flags are parsed here, after argparse, rather than as argparse ``type``s, so a bad
    value ends the command with one line naming the fix instead of a usage block.
    """
    if not isinstance(text, str):  # a boolean flag, or a default
        return knob_.parse(text)
    try:
        if knob_.kind == INT:
            value: Any = int(text)
        elif knob_.kind == NUMBER:
            value = float(text)
        elif knob_.kind == NAMES:
            value = tuple(w.strip() for w in text.split(",") if w.strip())
        elif knob_.kind == DURATION and knob_.field.endswith("_capacity_seconds"):
            value = _with_unit(knob_, text)
        else:
            value = text
        return knob_.parse(value)
    except (ValueError, ConfigError) as exc:
        detail = (
            str(exc)
            if isinstance(exc, ConfigError)
            else f"{text!r} is not a {'whole number' if knob_.kind == INT else 'number'}"
        )
        raise ConfigError(f"{cli_flag(knob_)}: {detail}") from None


def _with_unit(knob_: Knob, text: str) -> str:
    """A capacity-time flag's text (``--deadline``, ``--work``, ``--restart-overhead``),
    refused when it is a bare non-zero number: ``--deadline 12`` could mean seconds, hours
    or (on a trace cloud, where 1 h of capacity time is 1 wall second) wall seconds. The
    wall-time flags (``--capacity-wait 0.5``) and the Python API keep bare seconds."""
    try:
        number = float(text)
    except ValueError:
        return text
    if number == 0 or not math.isfinite(number):  # the model says what is wrong with these
        return text
    raise ConfigError(
        f"{text!r} has no unit; write it with one, e.g. {cli_flag(knob_)} {text}s, "
        f"{text}m, {text}h or {text}d"
    )


def cli_help(knob_: Knob) -> str:
    shown = knob_.default
    if knob_.kind == DURATION and shown is not None:
        shown = format_duration(shown)
    text = knob_.help.replace("%", "%%")
    unit = " (a duration: 90s, 5m, 2h, 1d)" if knob_.kind == DURATION else ""
    if knob_.absolute:
        unit = (
            " (a duration of capacity time: 90s, 5m, 2h, 1d; or an ISO time such as "
            "2026-12-01T08:00Z)"
        )
    bound = "" if knob_.maximum is None else f"; at most {knob_.shown(knob_.maximum)}"
    return f"{text}{unit} (default: {'none' if shown is None else shown}{bound})"


def add_cli_arguments(parser: Any, *, skip: Iterable[str] = ()) -> None:
    """Add a flag for every CLI knob to an argparse parser (``dest`` = the knob's name;
    None when not given, so the model's default applies in ``settings_from_cli``)."""

    skipped = set(skip)
    for knob_ in knobs_for(CLI):
        if knob_.name in skipped:
            continue
        if knob_.kind == BOOL:
            parser.add_argument(
                cli_flag(knob_),
                dest=knob_.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=cli_help(knob_),
            )
            continue
        metavar = knob_.metavar or {DURATION: "DURATION", INT: "N", TEXT: "NAME"}.get(knob_.kind)
        if knob_.allowed is not None and knob_.name != "deadline_policy":
            metavar = "{" + ",".join(knob_.allowed) + "}"
        parser.add_argument(
            cli_flag(knob_), dest=knob_.name, default=None, metavar=metavar, help=cli_help(knob_)
        )


def settings_from_cli(args: Any, *, where: str = "", **overrides: Any) -> SpotSettings:
    """SpotSettings from parsed CLI arguments (each CLI knob's ``dest``; None: not given)
    and ``overrides`` (values a command computed itself, under the knobs' names)."""
    values = {
        k.name: cli_value(k, getattr(args, k.name))
        for k in knobs_for(CLI)
        if getattr(args, k.name, None) is not None
    }
    try:
        return SpotSettings.build(where=where, check_options=False, **{**values, **overrides})
    except ConfigError as exc:  # a check across knobs: say it in flags, as the user wrote it
        raise ConfigError(in_flags(str(exc))) from None


def in_flags(message: str) -> str:
    """``work=2h needs deadline=...`` as ``--work 2h needs --deadline ...``."""
    names = "|".join(sorted((k.name for k in knobs_for(CLI)), key=len, reverse=True))
    return re.sub(rf"\b({names})=", lambda m: cli_flag(KNOBS_BY_NAME[m[1]]) + " ", message)
