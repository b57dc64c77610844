"""The AWS Spot Instance Advisor feed: interruption-frequency bands per instance type.

The feed (``spot-advisor-data.json``, as served to the Spot Advisor web page) says, per
region and instance type, how much spot saves (``s``, percent) and which band of
*interruption frequency* it falls in (``r``, an index into ``ranges``). AWS defines that
frequency as the share of spot capacity reclaimed over the trailing month. Ranking uses
a band as a prior for how often a pool interrupts before it has observed the pool itself,
so each band is turned into an expected interruption rate per hour.

The band table is pure data; only ``load_advisor`` touches the disk.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spot_core.errors import ConfigError
from spot_core.safe_files import read_text

HOURS_PER_MONTH = 730.0
MAX_FEED_BYTES = 64 << 20  # the whole feed is about 1 MB
"""AWS's billing month; the advisor's frequencies are per trailing month."""

STANDARD_RANGES: tuple[Mapping[str, Any], ...] = (
    {"index": 0, "label": "<5%", "max": 5},
    {"index": 1, "label": "5-10%", "max": 11},
    {"index": 2, "label": "10-15%", "max": 16},
    {"index": 3, "label": "15-20%", "max": 22},
    {"index": 4, "label": ">20%", "max": 100},
)
"""The ``ranges`` table of the feed as published since 2019 (labels are what users see)."""


@dataclass(frozen=True)
class Band:
    """One interruption-frequency band; ``low``/``high`` are monthly fractions (0.05 = 5%)."""

    label: str
    low: float
    high: float

    @property
    def typical(self) -> float:
        """A representative monthly fraction: the middle of a closed band.

        The open top band (``>20%``) would put its middle at 60%, far above what pools
        in it show in practice, so it is taken as a quarter above its lower edge.
        """
        if self.high >= 1.0:
            return min(1.0, self.low * 1.25)
        return (self.low + self.high) / 2.0

    @property
    def interruptions_per_hour(self) -> float:
        """Expected interruptions per instance-hour, treating reclaims as a Poisson process."""
        return -math.log1p(-min(self.typical, 0.999)) / HOURS_PER_MONTH


_LABEL = re.compile(
    r"^\s*(?:<\s*(?P<lt>\d+(?:\.\d+)?)|>\s*(?P<gt>\d+(?:\.\d+)?)"
    r"|(?P<lo>\d+(?:\.\d+)?)\s*-\s*(?P<hi>\d+(?:\.\d+)?))\s*%\s*$"
)


def band_from_range(entry: Mapping[str, Any]) -> Band:
    """Build a band from one ``ranges`` entry; the label's edges win over ``max``.

    ``max`` in the feed (11, 16, 22) is a chart scale, not a band edge; only the open
    top band needs it for its upper edge.
    """
    label = str(entry.get("label", ""))
    match = _LABEL.match(label)
    if match is None:
        raise ConfigError(
            f"spot advisor band label {label!r} is not '<N%', 'A-B%' or '>N%'; "
            "pass the feed's own 'ranges' table unchanged"
        )
    if match["lt"] is not None:
        return Band(label, 0.0, float(match["lt"]) / 100)
    if match["gt"] is not None:
        return Band(label, float(match["gt"]) / 100, float(entry.get("max", 100)) / 100)
    return Band(label, float(match["lo"]) / 100, float(match["hi"]) / 100)


STANDARD_BANDS: dict[str, Band] = {str(e["label"]): band_from_range(e) for e in STANDARD_RANGES}


def band_for_label(label: str) -> Band:
    """The standard band for a label such as ``"10-15%"`` (what ``Offer`` carries)."""
    try:
        return STANDARD_BANDS[label]
    except KeyError:
        return band_from_range({"label": label})


@dataclass(frozen=True)
class SpotAdvisor:
    """One snapshot of the feed: bands by index, and per-region, per-OS entries."""

    bands: tuple[Band, ...]
    entries: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]]
    source: str = ""

    def regions(self) -> list[str]:
        return sorted(self.entries)

    def _entry(self, region: str, instance_type: str, os: str) -> Mapping[str, int]:
        if region not in self.entries:
            raise ConfigError(
                f"spot advisor has no region {region!r} (it has "
                f"{', '.join(self.regions()[:6])}, ...); check the region name"
            )
        types = (
            self.entries[region].get(os, {}) if isinstance(self.entries[region], Mapping) else {}
        )
        if not isinstance(types, Mapping) or instance_type not in types:
            raise ConfigError(
                f"spot advisor lists no {os} {instance_type!r} in {region}; "
                "check the instance type, or rank this pool without a prior"
            )
        return types[instance_type]

    def interruption_band(self, region: str, instance_type: str, os: str = "Linux") -> Band:
        """The band AWS currently puts this instance type in, in this region."""
        index = self._number(region, instance_type, os, "r")
        if not 0 <= index < len(self.bands):
            raise ConfigError(
                f"spot advisor entry for {instance_type} in {region} names band "
                f"{index}, but the feed defines {len(self.bands)}; the file is "
                "corrupt"
            )
        return self.bands[index]

    def find_band(self, region: str, instance_type: str, os: str = "Linux") -> Band | None:
        """Like ``interruption_band`` but None when the feed does not list the pair."""
        try:
            return self.interruption_band(region, instance_type, os)
        except ConfigError:
            return None

    def savings(self, region: str, instance_type: str, os: str = "Linux") -> float:
        """Advertised saving of spot over on-demand, as a fraction (0.8 = 80% cheaper)."""
        return self._number(region, instance_type, os, "s") / 100

    def _number(self, region: str, instance_type: str, os: str, key: str) -> int:
        """One whole-number field of an entry; a missing or odd one is a corrupt feed."""
        value = (
            self._entry(region, instance_type, os).get(key)
            if isinstance(self._entry(region, instance_type, os), Mapping)
            else None
        )
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"spot advisor entry for {instance_type} in {region} has "
                f"{key}={value!r}, not a whole number; the file is corrupt"
            )
        return value


def parse_advisor(data: Mapping[str, Any], source: str = "") -> SpotAdvisor:
    """Validate the feed's shape and build a ``SpotAdvisor``."""
    if not isinstance(data, Mapping) or "spot_advisor" not in data:
        raise ConfigError(
            f"{source or 'spot advisor data'} has no 'spot_advisor' key; pass "
            "the AWS Spot Advisor feed (spot-advisor-data.json)"
        )
    try:
        ranges = sorted(data.get("ranges") or STANDARD_RANGES, key=lambda e: int(e["index"]))
        bands = tuple(band_from_range(e) for e in ranges)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{source or 'spot advisor data'}: 'ranges' is not a list of "
            f"{{index, label}} entries ({type(exc).__name__}: {exc}); pass the "
            "feed unchanged"
        ) from None
    if not isinstance(data["spot_advisor"], Mapping):
        raise ConfigError(
            f"{source or 'spot advisor data'}: 'spot_advisor' must be an object "
            "of regions; pass the feed unchanged"
        )
    return SpotAdvisor(bands=bands, entries=data["spot_advisor"], source=source)


def default_advisor_path() -> Path:
    """The small excerpt of the feed shipped with the package (a few regions and types)."""
    return Path(__file__).resolve().parent / "data" / "spot-advisor-excerpt.json"


def load_advisor(path: str | Path | Mapping[str, Any] | None = None) -> SpotAdvisor:
    """Load the feed from a file (default: the shipped excerpt) or an already-parsed dict."""
    if isinstance(path, Mapping):
        return parse_advisor(path, "<dict>")
    file = Path(path) if path is not None else default_advisor_path()
    try:
        data = json.loads(read_text(file, limit=MAX_FEED_BYTES, what="spot advisor file"))
    except UnicodeDecodeError:
        raise ConfigError(
            f"spot advisor file {file} is not UTF-8 text; download the feed again"
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            f"spot advisor file {file} is a folder; pass the path of spot-advisor-data.json"
        ) from None
    except FileNotFoundError as exc:
        raise ConfigError(
            f"spot advisor file {file} does not exist; pass the path of spot-advisor-data.json"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"spot advisor file {file} is not JSON ({exc}); download the feed again"
        ) from exc
    return parse_advisor(data, str(file))
