"""The few SVG primitives the charts share, each escaping what it is given.

Attribute values and text pass through ``html.escape(quote=True)``: a pool, job id or
label read from a record (which a user or a cloud API wrote) can never open a tag.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from html import escape

from spot_core.charts.clock import money as money

FONT = "font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:12px"

# One colour per attempt outcome (and "running" for an attempt still open).
OUTCOME_COLOURS = {
    "succeeded": "#2e7d32",
    "preempted": "#ef6c00",
    "capacity_unavailable": "#9e9e9e",
    "user_failed": "#c62828",
    "infrastructure_failed": "#6a1b9a",
    "drained": "#0277bd",
    "disrupted": "#00838f",
    "running": "#1565c0",
}
SPOT_COLOUR = "#2e7d32"
ON_DEMAND_COLOUR = "#90a4ae"
LOST_COLOUR = "#c62828"
OVERHEAD_COLOUR = "#ffb300"
SERIES_COLOURS = (
    "#1565c0",
    "#2e7d32",
    "#ef6c00",
    "#6a1b9a",
    "#c62828",
    "#00838f",
    "#5d4037",
    "#ad1457",
)


def attrs(values: Mapping[str, object]) -> str:
    """``key="value"`` pairs, escaped; None values are left out."""
    return "".join(
        f' {k}="{escape(_text(v), quote=True)}"' for k, v in values.items() if v is not None
    )


def element(tag: str, values: Mapping[str, object], body: str = "") -> str:
    """One element; ``body`` must already be SVG (escaped)."""
    return f"<{tag}{attrs(values)}>{body}</{tag}>" if body else f"<{tag}{attrs(values)}/>"


def text(x: float, y: float, content: object, **values: object) -> str:
    """A text element whose content is escaped."""
    return f"<text{attrs({'x': x, 'y': y, **_dashed(values)})}>{escape(_text(content))}</text>"


def rect(
    x: float, y: float, width: float, height: float, tooltip: object = None, **values: object
) -> str:
    """A rectangle, with an escaped ``<title>`` tooltip when given."""
    body = "" if tooltip is None else f"<title>{escape(_text(tooltip))}</title>"
    return element(
        "rect",
        {"x": x, "y": y, "width": max(width, 0.0), "height": height, **_dashed(values)},
        body,
    )


def line(x1: float, y1: float, x2: float, y2: float, **values: object) -> str:
    return element("line", {"x1": x1, "y1": y1, "x2": x2, "y2": y2, **_dashed(values)})


def document(width: int, height: int, title: object, body: list[str], **values: object) -> str:
    """The ``<svg>`` element: its own size, an accessible title, the shared font, and a
    text colour of its own (``fill``) so a dark page does not hide the labels."""
    head = {
        "xmlns": "http://www.w3.org/2000/svg",
        "width": width,
        "height": height,
        "viewBox": f"0 0 {width} {height}",
        "role": "img",
        "style": FONT,
        "fill": "#212121",
        **_dashed(values),
    }
    # An opaque background: the charts stay readable on a dark theme (Prefect's, Airflow's).
    background = element(
        "rect", {"width": "100%", "height": "100%", "fill": "#fff", "class": "background"}
    )
    return (
        f"<svg{attrs(head)}><title>{escape(_text(title))}</title>{background}"
        + "".join(body)
        + "</svg>"
    )


TITLE_CHAR_WIDTH = 7.4  # a 12 px semibold glyph, over-estimated: a title never runs out
TITLE_LINE = 16


def heading(title: str, width: int, *, y: float = 18) -> tuple[list[str], int]:
    """``title`` as bold lines wrapped to the chart's ``width`` (never clipped at its
    edge) and how far down they reach: the next line's baseline offset."""
    columns = max(20, int((width - 16) / TITLE_CHAR_WIDTH))
    lines = textwrap.wrap(title, columns) or [""]
    parts = [
        text(8, y + i * TITLE_LINE, part, font_weight="600", class_="title")
        for i, part in enumerate(lines)
    ]
    return parts, (len(lines) - 1) * TITLE_LINE


def _text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return str(value)


def _dashed(values: Mapping[str, object]) -> dict[str, object]:
    """Python keyword names as SVG attribute names (``data_attempt`` -> ``data-attempt``,
    ``class_`` -> ``class``)."""
    return {k.rstrip("_").replace("_", "-"): v for k, v in values.items()}
