"""The rule that forms the survivors' generations, pure: who trains together next, at which rank.

- A group from nothing (the first, or after every member was lost) forms once ``num_workers`` workers ask, or once
  the first of at least ``min_workers`` has waited ``settle_s``.
- A later generation forms once every live member of the current one that is not leaving has asked, and something
  changed (a member was lost or is leaving, or a newcomer waits) or none of them asked after a failure (they ended
  their generation to grow, and the newcomer went silent since, or the fit did not end). It is never smaller than
  ``min_workers``.
- The members keep their order; newcomers come after them, first come first, up to ``num_workers``.
- A member on a draining node leaves for good; a newcomer that went silent while it waited is forgotten.
- A member that asks after a failure while no member was lost or is leaving hears so after ``nothing_lost_s``: the
  failure was its own, to be raised as before."""

from __future__ import annotations

from dataclasses import dataclass, field

DONE = "done"  # the run has finished: a waiting worker returns
LEAVE = "leave"  # the worker's node is draining: it trains no more
WAIT = "wait"  # ask again
NOTHING_LOST = "nothing_lost"


@dataclass(frozen=True)
class Seat:
    number: int  # the generation's, from 1
    rank: int
    world_size: int


@dataclass
class _Asking:
    seen: int  # the newest generation the worker trained in (0: none)
    after_failure: bool
    since: float


@dataclass
class Generations:
    num_workers: int
    min_workers: int
    settle_s: float = 5.0
    nothing_lost_s: float = 2.0
    number: int = 0
    ranks: dict[str, int] = field(default_factory=dict)  # the current generation's members
    asking: dict[str, _Asking] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    leaving: set[str] = field(default_factory=set)
    finished: bool = False

    def ask(self, member: str, seen: int, after_failure: bool, now: float) -> Seat | str:
        """``member``'s seat in a generation newer than ``seen``, or what it does instead."""
        if self.finished:
            return DONE
        if member in self.leaving:
            self.asking.pop(member, None)
            return LEAVE
        if self.number > seen and member in self.ranks:
            return self._seat(member)
        asked = self.asking.setdefault(member, _Asking(seen, after_failure, now))
        self._form(now)
        if member in self.ranks and self.number > seen:
            return self._seat(member)
        if asked.after_failure and not self._changed() and now - asked.since >= self.nothing_lost_s:
            del self.asking[member]
            return NOTHING_LOST
        return WAIT

    def lose(self, member: str) -> None:
        """``member`` stopped beating: a member is lost, a newcomer forgotten."""
        self.asking.pop(member, None)
        if member in self.ranks:
            self.lost.add(member)

    def leave(self, member: str) -> None:
        if member in self.ranks or member in self.asking:
            self.leaving.add(member)

    def newcomers_wait(self) -> bool:
        """Whether a waiting newcomer would make the current generation bigger."""
        return len(self.ranks) < self.num_workers and any(m not in self.ranks for m in self.asking)

    def others_suffice(self) -> bool:
        """Whether the members that are not leaving are at least ``min_workers``."""
        return len(self._staying()) >= self.min_workers

    def _seat(self, member: str) -> Seat:
        return Seat(self.number, self.ranks[member], len(self.ranks))

    def _staying(self) -> list[str]:
        return [m for m in sorted(self.ranks, key=self.ranks.__getitem__) if m not in self.lost | self.leaving]

    def _newcomers(self) -> list[str]:
        return sorted((m for m in self.asking if m not in self.ranks), key=lambda m: self.asking[m].since)

    def _changed(self) -> bool:
        return any(m in self.lost | self.leaving for m in self.ranks) or self.newcomers_wait()

    def _form(self, now: float) -> None:
        staying, newcomers = self._staying(), self._newcomers()
        if not staying:
            waited = max((now - self.asking[m].since for m in newcomers), default=0.0)
            if len(newcomers) < self.num_workers and (len(newcomers) < self.min_workers or waited < self.settle_s):
                return
        elif (any(m not in self.asking for m in staying)
              or not self._changed() and any(self.asking[m].after_failure for m in staying)):
            return
        members = staying + newcomers[:self.num_workers - len(staying)]
        if len(members) < self.min_workers:
            return
        self.number += 1
        self.ranks = {m: rank for rank, m in enumerate(members)}
        for m in members:
            del self.asking[m]
        self.lost.clear()  # the leaving stay so: a worker on a draining node never trains again
