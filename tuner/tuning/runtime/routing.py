"""Routing without the learner's lock: an immutable table the learner publishes, read by
the request path, which hands its counters back through a queue.

The learner (``tuner.tuning.runtime.engine``) owns the classes' evidence and re-decides
them on its own thread; after each change it builds a ``RouteTable`` (per class: the
policy that serves it, its pin, the exploration budget's state, the running trial and
what it is expected to cost, the inputs of the conversation rule) and swaps it in with
one reference assignment. ``Router.route`` reads the table it finds, adds what it routed
since the table was built (its own, kept on the event loop), decides, and queues what it
did (a request seen, explored, a trial wanted or to abandon) for the learner, which
applies those counters to the evidence and publishes the next table. No lock the learner
takes is ever taken here.

A class the table does not hold yet (its first request) is served as the learner would
serve a class without evidence: its override, else the nearest level's settled policy
(``Rules.effective_policy`` with nothing of its own to forbid a parent's variant).
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from tuner.classify.classes import ROOT
from tuner.sessions.moves import Turn, move_cost, move_pays
from tuner.tuning.config import Override
from tuner.tuning.evidence.classes import levels
from tuner.tuning.policy.guard import Decision
from tuner.tuning.pricing.prices import answer_tokens
from tuner.tuning.pricing.waiting import Busy, waiting_pays
from tuner.tuning.runtime.table import ClassRoute, RouteTable, Served
from tuner.tuning.variants import BASELINE

__all__ = ["Routed", "Router"]

ANCHORS = 2  # plain requests of all traffic that anchor the fitted step time


@dataclass(frozen=True, slots=True)
class Routed:
    """One routed request, as the learner applies it."""

    seq: int
    key: str
    explored: bool = False
    plain: bool = False  # served without speculation, not by a pin
    prepare: bool = False  # ask the class's study for a trial
    abandon: int | None = None  # the trial whose variant is quarantined


class Router:
    """The request path's side: ``route`` reads the current table and never blocks.
    ``notify`` is called after a request is queued (the learner drains the queue); it is
    called at most once until the learner calls ``taken``."""

    def __init__(
        self,
        table: RouteTable,
        *,
        excluded: Callable[[str], bool],
        notify: Callable[[], None],
    ) -> None:
        self.table = table  # replaced whole by the learner
        self.excluded = excluded  # the quarantine (read without a lock)
        self.notify = notify
        self.queue: queue.SimpleQueue[Routed] = queue.SimpleQueue()
        self._pending = _Pending()  # queued since the table was built
        self._seq = 0
        self._notified = False
        self._overrides: dict[str, Override] = {}  # of classes the table lacks
        self._config = table.config

    def _override(self, table: RouteTable, key: str) -> Override:
        if table.config is not self._config:
            self._overrides, self._config = {}, table.config
        found = self._overrides.get(key)
        if found is None:
            found = self._overrides[key] = table.config.override_for(key)
        return found

    def taken(self) -> None:
        """The learner is about to drain the queue: the next request notifies again."""
        self._notified = False

    def override(self, key: str) -> Override:
        table = self.table
        entry = table.classes.get(key)
        return entry.override if entry is not None else self._override(table, key)

    def forbidden(self, key: str, variant: str) -> bool:
        spec_type = self.table.variants.get(variant)
        return spec_type is not None and spec_type in self.override(key).forbid

    def route(
        self,
        class_key: str | None,
        turn: Turn | None = None,
        busy: Busy | None = None,
        *,
        opens: bool = False,
    ) -> Decision:
        """The variant for one request of this class. A conversation's later ``turn``
        explores only on the instance that holds its history, and stays there unless
        moving to the class's variant (its pin included) pays for processing it again; a
        turn held on another variant than its class's spends the exploration budget.
        Where the CPU gate is ``busy`` with another variant, a request the policy serves
        joins that variant unless what its own saves, with what processing a turn's history
        again there would cost, beats the wait (role ``joined``); a turn's stay prices that
        wait too. A request that ``opens`` a conversation joins however short the wait so
        far, unless that variant measured slower than no speculation in its class: the
        conversation stays where its first turn goes, so each of its turns would wait for
        the other variant while the load lasts, and joining now costs it no history."""
        key = class_key or ROOT
        table = self.table
        pending = self._pending
        pending.since(table.applied)
        entry = table.classes.get(key)
        override = entry.override if entry is not None else self._override(table, key)
        self._seq += 1
        note = Routed(self._seq, key)
        if override.pin is not None and override.pin in table.variants:
            decision = Decision(override.pin, "pinned", policy_class=key)
        else:
            serves = entry.serves if entry is not None else _fresh(table, key, override)
            decision, note = self._decide(table, key, entry, override, serves, note, turn)
        if (
            turn is not None
            and decision.variant != turn.held
            and self._stays(table, key, entry, decision, turn, busy)
        ):
            # what the class would run is not served: the budget pays for it, as for a trial
            # (a conversation opened on a trial holds that trial's variant for its life)
            decision = Decision(turn.held, "held", policy_class=decision.policy_class)
            note = replace(note, explored=True)
        elif (
            busy is not None
            and decision.role == "exploit"
            and decision.variant != busy.variant
            and self._joins(table, key, entry, decision, turn, busy, opens)
        ):
            decision = Decision(busy.variant, "joined", policy_class=decision.policy_class)
        if decision.variant == BASELINE.name and decision.role != "pinned":
            note = replace(note, plain=True)
        pending.append(note)
        self.queue.put(note)
        if not self._notified:
            self._notified = True
            self.notify()
        return decision

    def _decide(
        self,
        table: RouteTable,
        key: str,
        entry: ClassRoute | None,
        override: Override,
        serves: Served,
        note: Routed,
        turn: Turn | None,
    ) -> tuple[Decision, Routed]:
        """A trial or control request while the budget allows (for a later turn, only one
        its history's instance serves: a setting of the spec type it holds), else the
        policy's variant, or the opening variant where the policy runs no speculation only
        for lack of evidence."""
        share = table.config.budget.explore_share
        pending = self._pending
        seen = (entry.seen if entry is not None else 0) + pending.seen.get(key, 0) + 1
        spent = (entry.spent if entry is not None else 0.0) + pending.spent.get(key, 0)
        seen_all = table.seen_all + len(pending.notes) + 1
        spent_all = table.spent_all + pending.spent_all
        if not override.off and spent < share * seen and spent_all < share * seen_all:
            found, note = self._explore(table, key, entry, note, spent, share * seen)
            if found is not None and (turn is None or _in_place(turn, found.variant)):
                return found, replace(note, explored=True)
        opening = table.opening
        opens = (
            entry.opening_ok
            if entry is not None
            else not serves.speculation
            and not serves.settled
            and table.variants.get(opening or "") not in override.forbid
        )
        if opening is not None and opens and not self.excluded(opening):
            return Decision(opening, "exploit", policy_class=ROOT), note
        return Decision(serves.variant, "exploit", policy_class=serves.policy_class), note

    def _explore(
        self,
        table: RouteTable,
        key: str,
        entry: ClassRoute | None,
        note: Routed,
        spent: float,
        budget: float,
    ) -> tuple[Decision | None, Routed]:
        """A trial or control request, or None when there is nothing to explore right now
        or the budget does not yet cover what the trial's variant measured at the nearest
        level (a new class's first request would otherwise always explore)."""
        plain = table.anchors + self._pending.plain
        if plain < ANCHORS:
            return Decision(BASELINE.name, "control", policy_class=key), note
        trial = entry.trial if entry is not None else None
        if trial is not None and self.excluded(trial[0]):
            note = replace(note, abandon=trial[1])  # it cannot run: the class moves on
        elif trial is not None:
            assert entry is not None
            if spent + entry.trial_cost > budget:
                return None, note
            return Decision(trial[0], "trial", trial[1], key), note
        wants = entry.wants_trial if entry is not None else table.searching
        return None, replace(note, prepare=wants) if wants else note

    def _may_run(self, table: RouteTable, key: str, variant: str) -> bool:
        """Whether ``variant`` is served now and allowed to class ``key``."""
        return (
            variant in table.variants
            and not self.excluded(variant)
            and not self.forbidden(key, variant)
        )

    def _stays(
        self,
        table: RouteTable,
        key: str,
        entry: ClassRoute | None,
        wanted: Decision,
        turn: Turn,
        busy: Busy | None,
    ) -> bool:
        """Whether a conversation's turn stays where its history is cached rather than move
        to ``wanted``: it stays unless the decode time the class's measured speedups save
        over its answer, with the gate's wait where the CPU gate is ``busy`` with
        ``wanted`` and not with the variant holding it (less it, where busy with the held
        one), beats processing the history again."""
        held = turn.held
        if not self._may_run(table, key, held):
            return False
        if turn.extra(wanted.variant) <= 0:
            return False  # its instance holds the history too: nothing to process again
        found = entry if entry is not None else _nearest(table, key)
        if found is None or found.plain is None:
            return True  # nothing measured yet to pay for a move
        return not move_pays(
            turn.extra(wanted.variant),
            found.prefill,
            answer_tokens(found.answer, turn.max_tokens),
            1.0 / found.plain,
            found.speeds.get(held, 1.0),
            found.speeds.get(wanted.variant, 1.0),
            _waits(busy, held) - _waits(busy, wanted.variant),
        )

    def _joins(
        self,
        table: RouteTable,
        key: str,
        entry: ClassRoute | None,
        wanted: Decision,
        turn: Turn | None,
        busy: Busy,
        opens: bool,
    ) -> bool:
        """Whether a request joins the variant decoding now rather than wait at the gate
        for ``wanted``: where that variant may serve its class and the wait is longer than
        what the class's measured speedups save plus what processing a later ``turn``'s
        history again there costs; one that ``opens`` a conversation, unless the class
        measured that variant slower than no speculation."""
        variant = busy.variant
        if not self._may_run(table, key, variant):
            return False
        found = entry if entry is not None else _nearest(table, key)
        if opens:
            return found is None or found.speeds.get(variant, 1.0) >= 1.0
        if found is None or found.plain is None:
            return False  # nothing measured yet to weigh the wait against
        extra = turn.extra(variant) - turn.extra(wanted.variant) if turn is not None else 0.0
        return not waiting_pays(
            busy.wait_s,
            answer_tokens(found.answer, turn.max_tokens if turn is not None else None),
            1.0 / found.plain,
            found.speeds.get(variant, 1.0),
            found.speeds.get(wanted.variant, 1.0),
            move_cost(extra, found.prefill),
        )


class _Pending:
    """The requests routed since the table was built, and their sums per class."""

    def __init__(self) -> None:
        self.notes: deque[Routed] = deque()
        self.seen: dict[str, int] = {}
        self.spent: dict[str, int] = {}
        self.spent_all = self.plain = 0

    def append(self, note: Routed) -> None:
        self.notes.append(note)
        self._count(note, 1)

    def since(self, applied: int) -> None:
        """Drop the requests the table already counts."""
        notes = self.notes
        while notes and notes[0].seq <= applied:
            self._count(notes.popleft(), -1)

    def _count(self, note: Routed, sign: int) -> None:
        self.seen[note.key] = self.seen.get(note.key, 0) + sign
        if note.explored:
            self.spent[note.key] = self.spent.get(note.key, 0) + sign
            self.spent_all += sign
        self.plain += sign * note.plain


def _in_place(turn: Turn, variant: str) -> bool:
    """Whether the instance holding a conversation's history serves ``variant`` too (the
    pool's variants that differ only in per-request settings), so a trial moves nothing."""
    return variant in turn.cached and turn.extra(variant) <= 0


def _waits(busy: Busy | None, variant: str) -> float:
    """The gate's wait a request for ``variant`` expects: none where nothing decodes that
    a request would wait for, or where ``variant`` is the one decoding."""
    return busy.wait_s if busy is not None and busy.variant != variant else 0.0


def _nearest(table: RouteTable, key: str) -> ClassRoute | None:
    for level in levels(key)[1:]:
        found = table.classes.get(level)
        if found is not None:
            return found
    return None


def _fresh(table: RouteTable, key: str, override: Override) -> Served:
    """The policy that serves a class with no evidence of its own: its override's, else
    the nearest level's that is settled on enough requests, else the nearest one's with
    enough, else the root's, else none (``Rules.effective_policy`` for a new class)."""
    if override.off:
        return Served(key, BASELINE.name, False, True, override=True)
    fallback: Served | None = None
    for level in levels(key)[1:]:
        entry = table.classes.get(level)
        if entry is None or entry.own is None:
            continue
        if entry.own.override:
            return entry.own
        if entry.enough and fallback is None:
            fallback = entry.own
        if entry.enough and (entry.own.settled or entry.converged):
            return entry.own
    if fallback is not None:
        return fallback
    root = table.classes.get(ROOT)
    if root is not None and root.own is not None:
        return root.own
    return Served(key, BASELINE.name, False, False)
