"""What an hour of an instance costs, from three sources, by precedence: ``cost.prices`` in the run config,
Karpenter's own estimates (read from the Prometheus that scrapes it), and a prices file that ``spotray prices``
wrote (``spotray.accounts.aws_prices``: spot prices per zone from EC2's ``DescribeSpotPriceHistory``, on-demand
prices from the Pricing API).

A run builds its ``PriceBook`` once (``price_book``): nothing here calls AWS or Prometheus per step. An
instance type no source prices is unknown (``None``), never free.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spotray.errors import NotFound, SpotrayError

if TYPE_CHECKING:  # the CLI imports spotray.accounts.aws_prices, which imports this module: it stays light (no pyarrow)
    from spotray.config import CostSection
    from spotray.storage import StorageOptions

log = logging.getLogger(__name__)

# aws/karpenter-provider-aws v1.14.1 pkg/controllers/metrics/metrics.go: karpenter_cloudprovider_*, labels below
KARPENTER_METRIC = "karpenter_cloudprovider_instance_type_offering_price_estimate"
KARPENTER_QUERY = f"avg by (instance_type, capacity_type, zone) ({KARPENTER_METRIC})"  # one series per offering
REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
FILE_KEYS = ("region", "fetched_at", "on_demand", "spot")
SOURCES = ("config", "karpenter", "prices file")  # by precedence
_warned: set[str] = set()  # Prometheus URLs already warned about


# --- shared checks (spotray.accounts.aws_prices uses them too) ----------------------------------------------------

def _is_instance_type(name: Any) -> bool:
    from spotray.config import INSTANCE_TYPE

    return isinstance(name, str) and bool(INSTANCE_TYPE.fullmatch(name))


def _capacity_types() -> tuple[str, ...]:
    from spotray.config import CAPACITY_TYPES

    return CAPACITY_TYPES


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


# --- the prices file -----------------------------------------------------------------------------------------------

def effective_price(history: list[list[float]], at: float) -> float | None:
    """The price in effect at ``at``: the newest entry at or before it; None before the first. ``history`` is
    ascending ``[[unix time, price], ...]``."""
    i = bisect.bisect_right([entry[0] for entry in history], at)
    return float(history[i - 1][1]) if i else None


def read_prices_file(url: str, options: StorageOptions | None = None) -> dict:
    """A prices file (``spotray prices`` wrote it), checked: a known shape, EC2 instance type names, positive
    prices, ascending times."""
    from spotray.storage import resolve

    where = f"prices file {url}"
    try:
        data = json.loads(resolve(url, options).read_text())
    except NotFound as exc:
        raise SpotrayError(f"{where}: not found: write it with `spotray prices --region R --instance-types T "
                           f"--output {url}`") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpotrayError(f"{where}: not JSON ({exc}): write it with `spotray prices`") from exc
    check_prices_file(data, where)
    return data


def check_prices_file(data: Any, where: str = "prices file") -> None:
    """Raise one line naming the first bad key (``spot.g5.xlarge.us-east-1a[3]``) and the fix."""
    def bad(key: str, problem: str, fix: str) -> SpotrayError:
        return SpotrayError(f"{where}: {key} {problem}: {fix}")

    if not isinstance(data, dict):
        raise bad("the file", f"is {type(data).__name__}, not an object", "write it with `spotray prices`")
    for key in data:
        if key not in FILE_KEYS:
            raise bad(str(key), "is not a key of a prices file", f"use only {', '.join(FILE_KEYS)}")
    for key in ("on_demand", "spot"):
        if not isinstance(data.get(key), dict):
            raise bad(key, "is missing" if key not in data else f"is {data[key]!r}, not an object",
                      "write the file with `spotray prices`")
    if "region" in data and not (isinstance(data["region"], str) and REGION.fullmatch(data["region"])):
        raise bad("region", f"is {data['region']!r}", "use a region's code, e.g. us-east-1")
    if "fetched_at" in data and not _positive(data["fetched_at"]):
        raise bad("fetched_at", f"is {data['fetched_at']!r}", "give a UNIX time")
    for instance_type, price in data["on_demand"].items():
        _check_instance_type(instance_type, f"on_demand.{instance_type}", bad)
        if not _positive(price):
            raise bad(f"on_demand.{instance_type}", f"is {price!r}", "give a positive price in USD per hour")
    for instance_type, zones in data["spot"].items():
        key = f"spot.{instance_type}"
        _check_instance_type(instance_type, key, bad)
        if not isinstance(zones, dict):
            raise bad(key, f"is {zones!r}", "map zones to [[unix time, USD per hour], ...]")
        for zone, history in zones.items():
            _check_history(history, f"{key}.{zone}", bad)


def _check_instance_type(instance_type: str, key: str, bad) -> None:
    if not _is_instance_type(instance_type):
        raise bad(key, "is not an EC2 instance type", "use a name like g5.xlarge or p5.48xlarge")


def _check_history(history: Any, key: str, bad) -> None:
    if not isinstance(history, list):
        raise bad(key, f"is {history!r}", "give [[unix time, USD per hour], ...] in ascending time")
    last = -math.inf
    for i, entry in enumerate(history):
        if not (isinstance(entry, list) and len(entry) == 2 and _positive(entry[0])):
            raise bad(f"{key}[{i}]", f"is {entry!r}", "give [unix time, USD per hour]")
        if not _positive(entry[1]):
            raise bad(f"{key}[{i}]", f"is {entry[1]!r}", "give a positive price in USD per hour")
        if entry[0] < last:
            raise bad(f"{key}[{i}]", f"is at {entry[0]}, before the entry above it", "sort the history by time")
        last = entry[0]


def _positive(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value > 0)


# --- Karpenter's estimates -----------------------------------------------------------------------------------------

def karpenter_estimates(prometheus_url: str, timeout_s: float = 5) -> dict[tuple[str, str, str | None], float]:
    """Karpenter's hourly price estimates, ``{(instance_type, capacity_type, zone): USD}``, from one instant query
    of Prometheus's HTTP API. A Prometheus that cannot be reached or answers nothing is a warning (once), not an
    error: a source of lower precedence may price the nodes."""
    import urllib.parse
    import urllib.request

    url = f"{prometheus_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': KARPENTER_QUERY})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts; a body that is not JSON
        _warn_once(prometheus_url, f"no Karpenter price estimates: cannot query Prometheus at {prometheus_url} "
                                   f"({exc}); check cost.prometheus_url")
        return {}
    estimates = parse_karpenter_response(body)
    if not estimates:
        _warn_once(prometheus_url, f"no Karpenter price estimates at {prometheus_url}: it has no "
                                   f"{KARPENTER_METRIC} (is Karpenter's ServiceMonitor enabled?)")
    return estimates


def parse_karpenter_response(body: Any) -> dict[tuple[str, str, str | None], float]:
    """The estimates in a ``/api/v1/query`` answer. Capacity types other than spot and on-demand (Karpenter
    exports ``reserved`` at 0) and prices that are not positive are left out."""
    if not isinstance(body, dict) or body.get("status") != "success":
        return {}
    estimates = {}
    for series in (body.get("data") or {}).get("result") or []:
        labels, value = series.get("metric", {}), series.get("value") or [None, None]
        instance_type, capacity_type = labels.get("instance_type", ""), labels.get("capacity_type")
        price = _number(value[1] if len(value) == 2 else None)
        if (capacity_type in _capacity_types() and _is_instance_type(instance_type) and price is not None
                and price > 0):
            estimates[(instance_type, capacity_type, labels.get("zone") or None)] = price
    return estimates


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


# --- the run's price book ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PriceBook:
    """Hourly prices by precedence: ``config`` (``{type: {capacity: USD}}``) > ``karpenter``
    (``{(type, capacity): {zone: USD}}``) > ``file`` (a checked prices file). The source that prices an
    instance type and capacity type answers for every zone of it.

    Zones: Karpenter and the file price per zone. Where the zone is not given or not listed, the price is the
    **mean over the listed zones** (not the cheapest: the node could be in any of them). The file's spot price
    is the effective price at ``at`` (the newest change at or before it; the newest of all where ``at`` is None),
    so a spot price before the file's first entry is unknown. Config and Karpenter prices hold at any time."""

    config: dict = field(default_factory=dict)
    karpenter: dict = field(default_factory=dict)
    file: dict | None = None

    def source(self, instance_type: str | None, capacity_type: str | None) -> str | None:
        """Which source prices this instance type and capacity type: "config", "karpenter", "prices file" or
        None."""
        if capacity_type not in _capacity_types() or not instance_type:
            return None
        if capacity_type in self.config.get(instance_type, {}):
            return "config"
        if (instance_type, capacity_type) in self.karpenter:
            return "karpenter"
        if self.file and (self.file["on_demand"].get(instance_type) if capacity_type == "on-demand"
                          else any(self.file["spot"].get(instance_type, {}).values())):
            return "prices file"
        return None

    def hourly(self, instance_type: str | None, capacity_type: str | None, zone: str | None = None,
               at: float | None = None) -> float | None:
        """USD per hour of one node, or None where no source prices it (unknown, never 0)."""
        source = self.source(instance_type, capacity_type)
        if source == "config":
            return float(self.config[instance_type][capacity_type])
        if source == "karpenter":
            by_zone = self.karpenter[(instance_type, capacity_type)]
            return by_zone[zone] if zone in by_zone else _mean(by_zone.values())
        if source == "prices file":
            assert self.file is not None  # source() found the price there
            if capacity_type == "on-demand":
                return float(self.file["on_demand"][instance_type])
            zones = self.file["spot"][instance_type]
            when = math.inf if at is None else at
            if zone in zones:
                return effective_price(zones[zone], when)
            return _mean(p for history in zones.values() if (p := effective_price(history, when)) is not None)
        return None


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def price_book(cost: CostSection, options: StorageOptions | None = None) -> PriceBook:
    """The run's prices, read once: Karpenter's estimates where ``cost.prometheus_url`` is set (a warning, not an
    error, where it cannot be read), the prices file where ``cost.prices_file`` is (an error where it is bad)."""
    by_offering: dict[tuple[str, str], dict[str | None, float]] = {}
    if cost.prometheus_url:
        for (instance_type, capacity_type, zone), price in karpenter_estimates(cost.prometheus_url).items():
            by_offering.setdefault((instance_type, capacity_type), {})[zone] = price
    file = read_prices_file(cost.prices_file, options) if cost.prices_file else None
    return PriceBook(config=cost.prices, karpenter=by_offering, file=file)
