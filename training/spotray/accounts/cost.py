"""What a run cost, from its ledger: node time at each node's price, per trained token, against on-demand.

Billing rules (docs/cost.md lists them):
- Node time, not worker time: a node is billed from the start of the first attempt whose workers ran on it (or from
  its creation, where it was created for the run after the previous attempt ended) to the last record of the last
  consecutive attempt that used it. A node that holds workers in two attempts in a row is billed through the
  recovery between them, idle as it is; not through a pause (a stop or a finish, then a rerun): the run did not hold
  it then.
- A node is billed in full, unless the run's workers use only part of its GPUs: then their share (workers on it x
  GPUs per worker / the node's GPUs).
- A spot node AWS interrupted within an hour of its creation costs nothing: AWS does not charge a spot instance it
  interrupts in its first hour. Interrupted means a spot interruption on the evidence (``endings``): a notice (the
  attempt's spot nodes the next attempt did not reuse), or this node lost without notice. A stop, an error, a lost
  driver or head, or an ending without evidence frees nothing.
- Warm spares: ``cost.warm_spares`` idle nodes of the workers' instance type at its price, and the head node and
  the core nodes (a separate line, where ``cost.head`` and ``cost.core`` name them), for the time the run was held:
  its wall time less its pauses.
- The on-demand counterfactual: the same kept steps on the same instance types at on-demand prices with no
  interruption: the kept steps' time, the first start-up, and the saves and evaluations in proportion to the steps kept.
An unpriced node makes the total unknown (None), never zero.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import TypeVar

from spotray.accounts import endings, goodput, ledger, node_records
from spotray.accounts.node_records import NodeFacts
from spotray.errors import StorageError
from spotray.storage import Location

log = logging.getLogger(__name__)

FREE_FIRST_HOUR_S = 3600.0
UNRECORDED_REFRESH_S = 2.0  # the driver looks new nodes up every 2 s (``progress.ProgressMonitor``)
# When ``spotray status`` trusts the interruption rate a run has seen over the pool's (``planner`` may use it).
TRUSTED_INTERRUPTIONS, TRUSTED_NODE_HOURS = 5, 20.0
NAMED_UNPRICED = 3  # an unknown cost names this many unpriced nodes of no known type, then counts the rest

T = TypeVar("T")


@dataclass(frozen=True)
class NodeBill:
    name: str
    instance_type: str | None
    capacity_type: str | None
    seconds: float
    share: float
    usd: float | None
    free: bool = False  # a spot node interrupted in its first hour

    def to_dict(self) -> dict:
        return {"node": self.name, "instance_type": self.instance_type, "capacity_type": self.capacity_type,
                "hours": round(self.seconds / 3600, 4), "share": round(self.share, 4),
                "usd": None if self.usd is None else round(self.usd, 4), "free_first_hour": self.free}


@dataclass(frozen=True)
class RunCost:
    usd: float | None  # the workers' nodes and warm spares so far
    head_and_core_usd: float | None
    tokens: int | None  # trained by the steps the final model kept
    on_demand_usd: float | None
    node_hours: float
    nodes_interrupted: int  # spot nodes AWS took (``endings.SPOT``): two lost in one ending are two
    example_prices: bool
    unpriced: list[str]  # the nodes without a price
    bills: list[NodeBill]

    @property
    def usd_per_million_tokens(self) -> float | None:
        return self.usd / (self.tokens / 1e6) if self.usd is not None and self.tokens else None

    @property
    def saving(self) -> float | None:
        """1 - spot / on-demand: what spot saved, as a fraction of the on-demand cost."""
        return 1 - self.usd / self.on_demand_usd if self.usd is not None and self.on_demand_usd else None

    @property
    def interruptions_per_node_hour(self) -> float | None:
        return self.nodes_interrupted / self.node_hours if self.node_hours else None

    @property
    def rate_trusted(self) -> bool:
        return self.nodes_interrupted >= TRUSTED_INTERRUPTIONS and self.node_hours >= TRUSTED_NODE_HOURS

    def to_dict(self) -> dict:
        def money(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        rate = self.interruptions_per_node_hour
        return {"usd": money(self.usd), "head_and_core_usd": money(self.head_and_core_usd), "tokens": self.tokens,
                "usd_per_million_tokens": money(self.usd_per_million_tokens),
                "on_demand_usd": money(self.on_demand_usd),
                "saving": None if self.saving is None else round(self.saving, 4),
                "node_hours": round(self.node_hours, 4), "nodes_interrupted": self.nodes_interrupted,
                "interruptions_per_node_hour": None if rate is None else round(rate, 4),
                "rate_trusted": self.rate_trusted, "example_prices": self.example_prices,
                "unpriced_nodes": self.unpriced, "nodes": [b.to_dict() for b in self.bills]}


def run_cost(attempts_root: Location) -> RunCost:
    """The run's cost as its ledger stands."""
    records = goodput.attempt_records(attempts_root)
    return ledger_cost(attempts_root, records, goodput.account_of(records, ledger.run_started_at(attempts_root)))


def ledger_cost(attempts_root: Location, records: list[goodput.AttemptRecord], account: goodput.Account) -> RunCost:
    """``run_cost`` where the attempts are read already: the ledger's node facts and cost settings added."""
    return cost_of(records, account, node_records.read_nodes(attempts_root),
                   node_records.read_cost_settings(attempts_root))


def cost_of(records: list[goodput.AttemptRecord], account: goodput.Account, facts: dict[str, NodeFacts],
            settings: dict) -> RunCost:
    """``run_cost`` of what was read already."""
    bills = _bills(records, account.events, facts)
    unpriced = sorted(b.name for b in bills if b.usd is None)
    held_s = account.total_s
    spares = _spares_usd(records, facts, settings.get("warm_spares", 0), held_s)
    usds = _all_known([b.usd for b in bills])
    usd = None if usds is None or spares is None else sum(usds) + spares
    tokens = _all_known([r.tokens for r in account.kept.values()])
    return RunCost(usd, _head_and_core_usd(settings, held_s), sum(tokens) if tokens else None,
                   _on_demand_usd(records, account, facts), sum(b.seconds for b in bills) / 3600,
                   _nodes_interrupted(records, account.events, facts), bool(settings.get("example_prices")), unpriced,
                   bills)


def _head_and_core_usd(settings: dict, held_s: float) -> float | None:
    """The head and ``core_nodes`` core nodes for the time the run held; None where none is set or one is
    unpriced."""
    settings_parts = [(settings.get("head"), 1), (settings.get("core"), settings.get("core_nodes", 0))]
    parts = [(node, count) for node, count in settings_parts if node and count]
    if not parts or any(node.get("usd_per_hour") is None for node, _ in parts):
        return None
    return sum(node["usd_per_hour"] * count for node, count in parts) * held_s / 3600


def _bills(records: list[goodput.AttemptRecord], events: list[goodput.Event],
           facts: dict[str, NodeFacts]) -> list[NodeBill]:
    bills = []
    for name in dict.fromkeys(n for r in records for n in r.info.nodes):
        used = [i for i, r in enumerate(records) if name in r.info.nodes]
        node = facts.get(name, NodeFacts(name))
        for first, last in _streaks(used, {i for i, e in enumerate(events) if e.kind in endings.PAUSES}):
            start = _billed_from(records, first, node.created_at)
            seconds = max(0.0, records[last].last_seen - start)
            free = (_interrupted(node, events[last] if last < len(events) else None)
                    and node.created_at is not None and records[last].last_seen - node.created_at < FREE_FIRST_HOUR_S)
            share = _gpu_share(records[last].info, name, node.gpus)
            usd = 0.0 if free else None if node.usd_per_hour is None else node.usd_per_hour * share * seconds / 3600
            bills.append(NodeBill(name, node.instance_type, node.capacity_type, seconds, share, usd, free))
    return bills


def _nodes_interrupted(records: list[goodput.AttemptRecord], events: list[goodput.Event],
                       facts: dict[str, NodeFacts]) -> int:
    """The spot nodes AWS took, for the rate per node-hour (the pool's rate is per node): each spot ending counts the
    spot nodes recorded lost that its attempt was the last to use, and at least one (a notice's node may not be)."""
    last_use = {name: i for i, r in enumerate(records) for name in r.info.nodes}
    lost = Counter(i for name, i in last_use.items() if (node := facts.get(name)) and node.lost_reason is not None
                   and endings.node_loss(node.capacity_type, node.lost_reason) == endings.KILL)
    return sum(max(1, lost[i]) for i, event in enumerate(events) if event.spot)


def _interrupted(node: NodeFacts, ending: goodput.Event | None) -> bool:
    """Whether AWS interrupted this spot node as the attempt that last used it ended (``ending``): a notice drains the
    attempt's nodes; without one, only the node recorded lost was."""
    if ending is None or not ending.spot or node.capacity_type != "spot":
        return False
    return ending.kind == endings.NOTICE or node.lost_reason is not None


def _streaks(indices: list[int], pauses: set[int]) -> list[tuple[int, int]]:
    """Runs of consecutive attempt indices as (first, last), broken after an attempt in ``pauses``."""
    streaks: list[tuple[int, int]] = []
    for i in indices:
        if streaks and streaks[-1][1] == i - 1 and i - 1 not in pauses:
            streaks[-1] = (streaks[-1][0], i)
        else:
            streaks.append((i, i))
    return streaks


def _billed_from(records: list[goodput.AttemptRecord], first: int, created_at: float | None) -> float:
    """The attempt's start, or the node's creation where it was created for it after the previous attempt ended."""
    entered = records[first].entered_at
    before = records[first - 1].last_seen if first else records[0].info.started_at
    return created_at if created_at is not None and before < created_at < entered else entered


def _gpu_share(info: ledger.AttemptInfo, name: str, node_gpus: int | None) -> float:
    if not node_gpus or not info.gpus_per_worker:
        return 1.0
    return min(1.0, info.nodes.count(name) * info.gpus_per_worker / node_gpus)


def _workers_type(records: list[goodput.AttemptRecord], facts: dict[str, NodeFacts]) -> NodeFacts | None:
    counts = Counter(n for r in records for n in r.info.nodes)
    return facts.get(counts.most_common(1)[0][0]) if counts else None


def _spares_usd(records: list[goodput.AttemptRecord], facts: dict[str, NodeFacts], spares: int,
                held_s: float) -> float | None:
    if not spares:
        return 0.0
    node = _workers_type(records, facts)
    return spares * node.usd_per_hour * held_s / 3600 if node and node.usd_per_hour is not None else None


def _on_demand_usd(records: list[goodput.AttemptRecord], account: goodput.Account,
                   facts: dict[str, NodeFacts]) -> float | None:
    """The kept steps on the final attempt's nodes at on-demand prices, without interruptions."""
    if not records or not records[-1].info.nodes:
        return None
    final = records[-1].info
    prices = _all_known([facts.get(n, NodeFacts(n)).on_demand_usd_per_hour for n in dict.fromkeys(final.nodes)])
    if prices is None:
        return None
    shares = [_gpu_share(final, n, facts.get(n, NodeFacts(n)).gpus) for n in dict.fromkeys(final.nodes)]
    trained = sum(len(r.steps) for r in records)
    kept_fraction = len(account.kept) / trained if trained else 1.0
    first_start = (records[0].entered_at - account.started_at + records[0].status_of("startup_s")
                   + records[0].status_of("compile_s"))
    seconds = (account.seconds["productive"] + first_start
               + kept_fraction * (account.seconds["checkpoint_save"] + account.seconds["eval"]))
    return seconds / 3600 * sum(p * s for p, s in zip(prices, shares, strict=True))


def _all_known(values: list[T | None]) -> list[T] | None:
    """``values``, or None where one of them is unknown."""
    known = [v for v in values if v is not None]
    return known if len(known) == len(values) else None


def gauge_figures(bill: RunCost | None) -> dict[str, float | None]:
    """The figures the run exports and records at each log interval (None: unknown, left out)."""
    if bill is None:
        return {}
    return {"cost_usd": bill.usd, "usd_per_million_tokens": bill.usd_per_million_tokens,
            "on_demand_usd": bill.on_demand_usd, "spot_saving_ratio": bill.saving}


class LiveCost:
    """The run's cost while an attempt trains: earlier attempts read once, this one's records again at most every
    ``refresh_s``, in a background thread, so that a log line never waits for storage."""

    def __init__(self, attempts_root: Location, attempt: ledger.AttemptInfo, refresh_s: float = 60.0):
        self.root, self.attempt, self.refresh_s = attempts_root, attempt, refresh_s
        self.latest: RunCost | None = None
        self._prior: list[goodput.AttemptRecord] | None = None
        self._next_at = 0.0
        self._recorded = False  # the driver has looked up every node of this attempt
        self._busy = threading.Lock()

    def poke(self, now: float) -> None:
        """Start a refresh if one is due and none is running: every ``refresh_s``, or every ``UNRECORDED_REFRESH_S``
        until the driver has recorded this attempt's nodes."""
        if now >= self._next_at and self._busy.acquire(blocking=False):
            self._next_at = now + (self.refresh_s if self._recorded else UNRECORDED_REFRESH_S)
            threading.Thread(target=self._refresh, daemon=True, name="spotray-cost").start()

    def _refresh(self) -> None:
        try:
            aid = self.attempt.attempt_id
            if self._prior is None:
                self._prior = [r for r in goodput.attempt_records(self.root, starting=aid) if r.info.attempt_id != aid]
            current = goodput.attempt_record(self.root, self.attempt)
            records = [*self._prior, current]
            facts = node_records.read_nodes(self.root)
            account = goodput.account_of(records, ledger.run_started_at(self.root))
            self.latest = cost_of(records, account, facts, node_records.read_cost_settings(self.root))
            self._recorded = set(self.attempt.nodes) <= set(facts)
        except (StorageError, OSError, ValueError, KeyError, TypeError) as exc:
            log.debug("live cost not refreshed: %s", exc)  # the next refresh catches up
        finally:
            self._busy.release()


def _unpriced_text(bills: list[dict]) -> str:
    """What has no price, by instance type (a run may hold hundreds of nodes), and the setting that gives one."""
    prices = "set cost.prices, or cost.prices_file from `spotray prices`"
    if not bills:
        return f"no price for the run's nodes (none recorded yet); {prices}"
    typed = Counter(f"{b['instance_type']} {b['capacity_type'] or ''}".rstrip() for b in bills if b["instance_type"])
    untyped = sorted(b["node"] for b in bills if not b["instance_type"])
    parts = [f"{kind} ({_nodes(count)})" for kind, count in sorted(typed.items())]
    if untyped:
        more = f" and {len(untyped) - NAMED_UNPRICED} more" if len(untyped) > NAMED_UNPRICED else ""
        parts.append(f"{_nodes(len(untyped))} of no known instance type ({', '.join(untyped[:NAMED_UNPRICED])}{more})")
    fix = prices if not untyped else "set cost.node (what the nodes are, off Kubernetes) and cost.prices"
    return f"no price for {', '.join(parts)}; {fix}"


def _nodes(count: int) -> str:
    return f"{count} node{'s' if count != 1 else ''}"


def money_text(figures: dict) -> str:
    """``RunCost.to_dict()``'s money in one line."""
    if figures["usd"] is None:
        return f"unknown: {_unpriced_text([bill for bill in figures['nodes'] if bill['usd'] is None])}"
    parts = [f"${figures['usd']:,.2f}{' (example prices)' if figures['example_prices'] else ''}"]
    per_million = figures["usd_per_million_tokens"]
    parts.append(f"${per_million:,.2f} per million tokens" if per_million is not None else
                 "per million tokens: unknown (steps without token counts)")
    on_demand = figures["on_demand_usd"]
    parts.append(f"on demand ${on_demand:,.2f}: spot saved {100 * figures['saving']:.1f}%"
                 if on_demand and figures["saving"] is not None else "on demand: unknown (no on-demand price)")
    if figures["head_and_core_usd"] is not None:
        parts.append(f"head and core nodes ${figures['head_and_core_usd']:,.2f}")
    return " | ".join(parts)


def rate_text(figures: dict) -> str:
    """The interruption rate the run has seen, and whether it is trusted yet."""
    rate = figures["interruptions_per_node_hour"]
    count = figures["nodes_interrupted"]
    seen = f"{count} spot {'node' if count == 1 else 'nodes'} interrupted in {figures['node_hours']:,.2f} node-hours"
    if rate is None:
        return seen
    trust = ("trusted for planning" if figures["rate_trusted"] else
             f"plan with the pool's rate until {TRUSTED_INTERRUPTIONS} nodes interrupted and {TRUSTED_NODE_HOURS:g} "
             "node-hours")
    return f"{seen} ({rate:.3f} per node-hour; {trust})"
