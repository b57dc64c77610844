"""Lines for a person on a terminal: an event's detail is wrapped under its heading,
whole, never cut at a column (a cut reason, or one cut inside a path, misleads)."""

from __future__ import annotations

import shutil
import textwrap

INDENT = "    "


def event_line(heading: str, detail: str) -> str:
    """``heading  detail`` with the detail wrapped, whole, to the terminal's width; the
    lines after the first indented, so a run of events still reads as one per heading."""
    width = max(60, shutil.get_terminal_size((120, 24)).columns)
    first = f"{heading}  {' '.join(detail.split())}".rstrip()
    return textwrap.fill(
        first,
        width=width,
        subsequent_indent=INDENT,
        break_long_words=False,
        break_on_hyphens=False,
    )
