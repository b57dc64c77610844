"""Real spot-market traces, loaded from every shipped format into one normalised form.

Three formats exist (see the repository's ``traces/README.md``) and they disagree on what a 1
means, which is the classic silent bug of trace replay:

- CSV ``date,availability``: **1 = available**, ~195 s ticks with jittered timestamps;
  prices come from a separate ``{trace_stem: [$/h per row]}`` JSON (``spot_prices.json``).
- JSON ``{"metadata": {"gap_seconds", "price_info"}, "data", "prices"}``:
  **1 = preempted / unavailable**, so it is flipped on load.
- boto3's ``describe_spot_price_history`` answer: price change points only, so it becomes
  a step series on a tick grid with capacity assumed available.

After loading, ``ZoneTrace.available`` is always True = spot capacity available.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from spot_core.errors import ConfigError
from spot_core.model import MAX_PRICE_PER_HOUR
from spot_core.safe_files import check_regular, read_text

CSV_TICK_SECONDS = 195.0
"""Nominal tick of the AWS V100 CSV traces; used when a file has too few rows to measure."""

DEFAULT_ON_DEMAND = {"v100": 3.06, "p3.2xlarge": 3.06}
"""On-demand $/h used when a trace carries none: p3.2xlarge in us-east-1, as the NSDI'24
paper and its artifact use."""

INSTANCE_TYPES = {"v100": "p3.2xlarge", "h100": "a3-highgpu-8g"}
"""Accelerator hints in trace file names -> the instance type they were measured on."""

PRICES_FILE = "spot_prices.json"
# A year of 195 s ticks is about 4 MB of CSV; more is not a trace, and is never read whole.
MAX_TRACE_BYTES = 256 << 20


@dataclass(frozen=True, eq=False)
class ZoneTrace:
    """Availability and spot price of one zone, tick by tick (True = capacity available)."""

    name: str
    tick_seconds: float
    available: np.ndarray
    spot_price: np.ndarray
    on_demand_price: float
    start_time: float | None
    source: str

    def __post_init__(self) -> None:
        available = np.asarray(self.available, dtype=bool)
        price = price_array(self.spot_price, f"trace {self.name}'s spot prices")
        if available.ndim != 1 or price.shape != available.shape or available.size == 0:
            raise ConfigError(
                f"trace {self.name}: availability ({available.size} ticks) and "
                f"spot prices ({price.size}) must be equally long and non-empty"
            )
        for what, value in (
            ("tick_seconds", self.tick_seconds),
            ("on_demand_price", self.on_demand_price),
        ):
            if not _positive_number(value):
                raise ConfigError(
                    f"trace {self.name}: {what} must be a finite number > 0, "
                    f"got {value!r}; check the file"
                )
        if self.on_demand_price > MAX_PRICE_PER_HOUR:
            raise ConfigError(
                f"trace {self.name}: on_demand_price {self.on_demand_price:g} "
                f"is above {MAX_PRICE_PER_HOUR:,.0f} $/h, no instance's price; "
                "check the file"
            )
        available.setflags(write=False)
        price.setflags(write=False)
        object.__setattr__(self, "available", available)
        object.__setattr__(self, "spot_price", price)

    @property
    def n_ticks(self) -> int:
        return int(self.available.size)

    @property
    def duration_seconds(self) -> float:
        return self.n_ticks * self.tick_seconds

    @property
    def availability_fraction(self) -> float:
        return float(self.available.mean())

    @property
    def preemptions(self) -> int:
        """Available -> unavailable transitions: each would have reclaimed a running job."""
        return count_preemptions(self.available)

    @property
    def zone(self) -> str:
        """The zone part of the name: ``us-east-1a`` from ``us-east-1a_v100_1``."""
        return self.name.split("_", 1)[0]

    @property
    def instance_hint(self) -> str:
        """What the name says about the capacity: ``v100_1`` from ``us-east-1a_v100_1``."""
        return self.name.split("_", 1)[1] if "_" in self.name else ""

    @property
    def instance_type(self) -> str:
        hint = self.instance_hint
        return INSTANCE_TYPES.get(hint.split("_", 1)[0], hint) if hint else "unknown"

    @property
    def region(self) -> str:
        return zone_region(self.zone)

    @property
    def cloud(self) -> str:
        """GCP zones end in ``-<letter>`` (``us-central1-a``); AWS zones in a bare letter."""
        return "gcp" if re.search(r"\d-[a-z]$", self.zone) else "aws"

    def slice(self, start: int, end: int | None = None) -> ZoneTrace:
        """Ticks ``[start, end)`` as a trace of their own (start time moved along)."""
        stop = self.n_ticks if end is None else end
        if not 0 <= start < stop <= self.n_ticks:
            raise ConfigError(
                f"trace {self.name}: slice [{start}, {stop}) is outside its {self.n_ticks} ticks"
            )
        moved = None if self.start_time is None else self.start_time + start * self.tick_seconds
        return dataclasses.replace(
            self,
            available=self.available[start:stop],
            spot_price=self.spot_price[start:stop],
            start_time=moved,
        )


def _positive_number(value: Any) -> TypeGuard[float | np.number[Any]]:
    return bool(
        isinstance(value, (int, float, np.number))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def price_array(values: Any, where: str) -> np.ndarray:
    """``values`` as $/h floats: a flat list of finite numbers >= 0, else a one-line
    ConfigError. JSON allows strings, NaN and Infinity; none of them is a price."""
    items = values.tolist() if isinstance(values, np.ndarray) else values
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise ConfigError(f"{where} must be a list of $/h numbers, got {type(items).__name__}")
    items = list(items)
    bad = next(
        (
            v
            for v in items
            if isinstance(v, bool)
            or not isinstance(v, (int, float, np.number))
            or not math.isfinite(v)
            or not 0 <= v <= MAX_PRICE_PER_HOUR
        ),
        None,
    )
    if bad is not None or any(v is None for v in items):
        raise ConfigError(
            f"{where} hold {_as_json(bad)}; every price must be a finite number "
            f"of $/h from 0 to {MAX_PRICE_PER_HOUR:,.0f}; check the file"
        )
    return np.asarray(items, dtype=float)


def _as_json(value: Any) -> str:
    """A value as the file spells it (NaN, Infinity, null, "text")."""
    try:
        return json.dumps(value.item() if isinstance(value, np.generic) else value)
    except (TypeError, ValueError):
        return repr(value)


def count_preemptions(available: np.ndarray) -> int:
    values = np.asarray(available, dtype=bool)
    return int(np.count_nonzero(values[:-1] & ~values[1:]))


def zone_region(zone: str) -> str:
    """``us-east-1a`` -> ``us-east-1``; ``us-central1-a`` -> ``us-central1``."""
    match = re.match(r"^(.*\d)-?[a-z]$", zone)
    return match.group(1) if match else zone


# -- loading ------------------------------------------------------------------------------
def load_trace(
    path: str | Path, *, prices: Any = None, on_demand_price: float | None = None
) -> ZoneTrace:
    """Load one zone's trace from a CSV or availability-JSON file.

    ``prices``: a ``{name: [$/h per tick]}`` mapping or a path to one, keyed by trace file
    stem or zone name. CSVs without it use ``spot_prices.json`` beside them. JSON traces
    carry their own prices; ``prices`` overrides them when it names the zone.
    """
    file = Path(path)
    if not file.exists():
        raise ConfigError(
            f"trace file {file} does not exist; pass a path from "
            "the repository's traces/ or spot_core.market.fixture_trace_paths()"
        )
    check_regular(file, what="trace file")  # a FIFO or /dev/zero: one line, never read
    suffix = file.suffix.lower()
    if suffix == ".csv":
        return _load_csv(file, prices, on_demand_price)
    if suffix == ".json":
        return _load_json(file, prices, on_demand_price)
    raise ConfigError(
        f"trace file {file} has unknown format {suffix!r}; expected .csv "
        "(date,availability) or .json ({metadata, data, prices})"
    )


def load_traces(
    paths: Iterable[str | Path], *, prices: Any = None, on_demand_price: float | None = None
) -> list[ZoneTrace]:
    """Load several zones; they must share one tick length to be replayed side by side."""
    price_table = _read_prices(prices) if isinstance(prices, (str, Path)) else prices
    traces = [load_trace(p, prices=price_table, on_demand_price=on_demand_price) for p in paths]
    if not traces:
        raise ConfigError("no trace files given; pass at least one --trace PATH")
    check_compatible(traces)
    return traces


def check_compatible(traces: Sequence[ZoneTrace]) -> None:
    """Several zones replay on one clock only if their ticks agree and names are unique."""
    first = traces[0]
    for trace in traces[1:]:
        if not np.isclose(trace.tick_seconds, first.tick_seconds, rtol=1e-6):
            raise ConfigError(
                f"traces {first.name} ({first.tick_seconds:g} s ticks) and "
                f"{trace.name} ({trace.tick_seconds:g} s ticks) have different tick "
                "lengths; replay only traces from the same set together"
            )
    names = [t.name for t in traces]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"trace names repeat ({', '.join(sorted(names))}); each zone may be given once"
        )


def _load_csv(file: Path, prices: Any, on_demand_price: float | None) -> ZoneTrace:
    times, available = _read_csv_rows(file)
    tick = _csv_tick(times)
    if prices is None:
        prices = file.parent / PRICES_FILE
        if not prices.is_file():
            raise ConfigError(
                f"no spot prices for {file.name}: pass prices= (or --prices) "
                f"with a {{trace_stem: [$/h per row]}} JSON like {PRICES_FILE}"
            )
    spot = _price_series(prices, file.stem, available.size)
    od = _on_demand(on_demand_price, None, file.stem)
    return ZoneTrace(file.stem, tick, available, spot, od, float(times[0]), str(file))


def _csv_tick(times: np.ndarray) -> float:
    """The set's nominal 195 s when the median gap is within 2% of it, else the median.

    Timestamps drift by a second or two (the logger's own latency), so an excerpt's
    median can read 196 s; snapping keeps excerpts replayable beside the full set.
    """
    if times.size < 3:
        return CSV_TICK_SECONDS
    median = float(np.median(np.diff(times)))
    return CSV_TICK_SECONDS if abs(median / CSV_TICK_SECONDS - 1) <= 0.02 else median


def _read_text(file: Path, what: str = "trace file") -> str:
    """The file as UTF-8 text; a binary or differently encoded file is one clear line, and
    so is anything but a regular file of at most MAX_TRACE_BYTES (a FIFO would block the
    read, /dev/zero would never end it)."""
    try:
        return read_text(file, limit=MAX_TRACE_BYTES, what=what)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{file} is not UTF-8 text (byte {exc.start} cannot be decoded); "
            "pass a CSV or JSON trace, not a binary file"
        ) from None
    except FileNotFoundError:
        raise ConfigError(f"{file} does not exist; check the path") from None
    except OSError as exc:
        raise ConfigError(f"{file} cannot be read ({exc.strerror}); check the path") from None


def _read_csv_rows(file: Path) -> tuple[np.ndarray, np.ndarray]:
    lines = _read_text(file).strip().splitlines()
    if not lines or [h.strip() for h in lines[0].split(",")] != ["date", "availability"]:
        raise ConfigError(
            f"{file} is not a 'date,availability' CSV trace (header "
            f"{lines[0] if lines else '<empty>'!r}); check the file"
        )
    rows = [line.split(",") for line in lines[1:]]
    try:
        times = np.array([r[0].strip() for r in rows], dtype="datetime64[s]").astype(float)
        flags = np.array([int(r[1]) for r in rows])
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"{file}: a row is not 'YYYY-MM-DD HH:MM:SS,0|1' ({exc})") from exc
    if flags.size == 0 or not np.isin(flags, (0, 1)).all():
        raise ConfigError(f"{file}: availability must be 0 or 1 on every row (1 = available)")
    return times, flags == 1


def _load_json(file: Path, prices: Any, on_demand_price: float | None) -> ZoneTrace:
    data = _read_json(file)
    if "SpotPriceHistory" in data:
        return _single_history_trace(data, file, on_demand_price)
    if not {"metadata", "data"} <= set(data):
        raise ConfigError(
            f"{file} is neither an availability trace ({{metadata, data, prices}}) "
            "nor a SpotPriceHistory; check the file"
        )
    meta = _object(data["metadata"] or {}, f"{file}: metadata")
    flags = data["data"]
    if (
        not isinstance(flags, list)
        or not flags
        or not all(type(f) is int and f in (0, 1) for f in flags)
    ):
        raise ConfigError(
            f"{file}: 'data' must be a list of 0/1 per tick (1 = preempted / unavailable)"
        )
    available = np.asarray(flags) == 0  # this format counts 1 as *preempted*: flip it
    info = _object(meta.get("price_info") or {}, f"{file}: metadata.price_info")
    spot = _json_prices(file, data, info, prices, available.size)
    od = _on_demand(on_demand_price, info.get("on_demand_price"), file.stem)
    gap = meta.get("gap_seconds")
    if not _positive_number(gap):
        raise ConfigError(
            f"{file}: metadata.gap_seconds must be a finite number of seconds "
            f"> 0 (the tick length), got {gap!r}"
        )
    return ZoneTrace(
        file.stem,
        float(gap),
        available,
        spot,
        od,
        _posix(meta.get("start_time"), f"{file}: metadata.start_time"),
        str(file),
    )


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _json_prices(
    file: Path, data: Mapping[str, Any], info: Mapping[str, Any], prices: Any, n: int
) -> np.ndarray:
    if prices is not None and _price_key(_as_price_table(prices), file.stem) is not None:
        return _price_series(prices, file.stem, n)
    if data.get("prices") is not None:
        return _checked_length(
            price_array(data["prices"], f"{file}: 'prices'"), n, file.stem, str(file)
        )
    if info.get("price") is not None:
        return np.full(n, price_array([info["price"]], f"{file}: price_info.price")[0])
    raise ConfigError(f"{file} has no 'prices' and no metadata.price_info.price; pass prices=")


# -- prices ---------------------------------------------------------------------------------
def _read_json(file: Path, what: str = "trace file") -> dict[str, Any]:
    try:
        data = json.loads(_read_text(file, what))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{file} is not valid JSON ({exc}); check the file") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{file} holds a JSON {type(data).__name__}, expected an object")
    return data


def _read_prices(path: str | Path) -> dict[str, Sequence[float]]:
    return _read_json(Path(path), "price file")


def _as_price_table(prices: Any) -> Mapping[str, Sequence[float]]:
    return _read_prices(prices) if isinstance(prices, (str, Path)) else prices


def _price_key(table: Mapping[str, Any], stem: str) -> str | None:
    """Price files are keyed by trace file stem; a bare zone name is accepted too."""
    for key in (stem, stem.split("_", 1)[0]):
        if key in table:
            return key
    return None


def _price_series(prices: Any, stem: str, n: int) -> np.ndarray:
    table = _as_price_table(prices)
    key = _price_key(table, stem)
    if key is None:
        known = ", ".join(sorted(table)[:5])
        raise ConfigError(
            f"spot prices have no entry for {stem!r} (keys: {known}, ...); key "
            "them by trace file stem or zone name"
        )
    return _checked_length(
        price_array(table[key], f"the prices for {key!r}"), n, stem, "the price file"
    )


def _checked_length(series: np.ndarray, n: int, stem: str, where: str) -> np.ndarray:
    if series.shape != (n,):
        raise ConfigError(
            f"{where} has {series.size} prices for {stem} but the trace has {n} "
            "ticks; prices must align row for row with the trace"
        )
    return series


def _on_demand(given: float | None, from_file: Any, stem: str) -> float:
    for value, where in ((given, "on_demand_price"), (from_file, "price_info.on_demand_price")):
        if value is None:
            continue
        if not _positive_number(value) or value > MAX_PRICE_PER_HOUR:
            raise ConfigError(
                f"trace {stem}: {where} must be a finite number of $/h > 0 and "
                f"at most {MAX_PRICE_PER_HOUR:,.0f}, got {value!r}"
            )
        return float(value)
    hint = stem.split("_")[1] if "_" in stem else stem
    if hint in DEFAULT_ON_DEMAND:
        return DEFAULT_ON_DEMAND[hint]
    raise ConfigError(
        f"trace {stem} carries no on-demand price; pass its $/h: "
        "--on-demand-price P to `run` or `simulate`, the local provider "
        "option on_demand_price, or on_demand_price= to load_trace"
    )


def _posix(value: Any, where: str = "a timestamp") -> float | None:
    """ISO-8601 (naive = UTC), a datetime, or POSIX seconds -> POSIX seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    try:
        moment = (
            value
            if isinstance(value, datetime)
            else datetime.fromisoformat(value.replace("Z", "+00:00"))
        )
    except (AttributeError, TypeError, ValueError):
        raise ConfigError(
            f"{where} {value!r} is not an ISO time (2023-02-01T00:00:00Z) nor "
            "POSIX seconds; check the file"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


# -- EC2 spot price history -------------------------------------------------------------------
def load_spot_price_history(
    source: str | Path | Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    tick_seconds: float = 300.0,
    start: float | None = None,
    end: float | None = None,
    product: str | None = "Linux/UNIX",
    on_demand_price: float | None = None,
) -> dict[tuple[str, str], ZoneTrace]:
    """``describe_spot_price_history`` output -> one step-price trace per (zone, type).

    The API lists price *changes*, so the price at a tick is the latest change at or
    before it; ticks before the first known change take that first price. Capacity is
    not in the history, so every tick is marked available. ``start``/``end`` default to
    the first and last change seen across all series.
    """
    if tick_seconds <= 0:
        raise ConfigError(f"tick_seconds must be > 0, got {tick_seconds}")
    series = _group_history(_history_entries(source), product)
    first = min(t[0] for t, _ in series.values()) if start is None else float(start)
    last = max(t[-1] for t, _ in series.values()) if end is None else float(end)
    grid = first + tick_seconds * np.arange(max(0, math.ceil((last - first) / tick_seconds)) + 1)
    return {
        key: _history_trace(key, times, values, grid, tick_seconds, on_demand_price)
        for key, (times, values) in sorted(series.items())
    }


def _history_entries(source: Any) -> list[Mapping[str, Any]]:
    data = _read_json(Path(source)) if isinstance(source, (str, Path)) else source
    entries = data.get("SpotPriceHistory") if isinstance(data, Mapping) else data
    if not isinstance(entries, Sequence) or not entries:
        raise ConfigError(
            "spot price history is empty or has no 'SpotPriceHistory' list; pass "
            "the response of ec2.describe_spot_price_history"
        )
    return list(entries)


def _group_history(
    entries: list[Mapping[str, Any]], product: str | None
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    grouped: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for e in entries:
        try:
            if product is not None and e.get("ProductDescription", product) != product:
                continue
            key = (str(e["AvailabilityZone"]), str(e["InstanceType"]))
            price = float(price_array([float(e["SpotPrice"])], "SpotPrice")[0])
            when = _posix(e["Timestamp"], "Timestamp")
            if when is None:
                raise TypeError("its Timestamp is null")
            grouped.setdefault(key, []).append((when, price))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"spot price history entry {str(e)[:120]} is not an "
                "AvailabilityZone/InstanceType/Timestamp/SpotPrice record "
                f"({type(exc).__name__}: {exc}); pass the API's answer "
                "unchanged"
            ) from None
    if not grouped:
        raise ConfigError(
            f"spot price history has no {product!r} entries; pass product=None "
            "or the product description you asked the API for"
        )
    return {k: _columns(v) for k, v in grouped.items()}


def _columns(pairs: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(times, prices) of time-sorted (time, price) pairs."""
    times, prices = zip(*sorted(pairs), strict=True)
    return np.array(times), np.array(prices)


def _history_trace(
    key: tuple[str, str],
    times: np.ndarray,
    values: np.ndarray,
    grid: np.ndarray,
    tick: float,
    on_demand_price: float | None,
) -> ZoneTrace:
    index = np.clip(np.searchsorted(times, grid, side="right") - 1, 0, None)
    name = f"{key[0]}_{key[1]}"
    od = _on_demand(on_demand_price, None, name)
    return ZoneTrace(
        name,
        tick,
        np.ones(grid.size, dtype=bool),
        values[index],
        od,
        float(grid[0]),
        "SpotPriceHistory",
    )


def _single_history_trace(
    data: Mapping[str, Any], file: Path, on_demand_price: float | None
) -> ZoneTrace:
    traces = load_spot_price_history(data, on_demand_price=on_demand_price)
    if len(traces) != 1:
        raise ConfigError(
            f"{file} holds price history for {len(traces)} zone/type pairs; use "
            "load_spot_price_history() to get all of them"
        )
    return next(iter(traces.values()))
