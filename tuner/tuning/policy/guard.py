"""A class's policy and the guard that chooses it. Pure.

The guard: among the speculative variants measured in a class, choose the one with the
highest lower confidence bound, if that bound is above 1 and its measured speedup is at
least ``min_gain``; else run no speculation. A class keeps the variant it holds (if that
still clears the guard) unless another is faster on the same requests (its paired speedup
over the held one has a lower bound above 1: the fastest such moves the class), or the
best one's lower bound lies above the held one's speedup. A near-tie that the same
requests resolve moves the class; one they do not resolve does not flap.

The kill switch: on a target whose verify pass has a structural cost (small-active MoE,
hybrid recurrent) and where the prior predicts no variant above 1, the class starts off
with that verdict; after a finished search with no variant faster than baseline it is
off with the measured reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from tuner.classify.classes import ROOT
from tuner.stats import Interval

__all__ = ["Best", "Decision", "Policy", "Role", "choose", "measured_policy", "off_reason"]

# held: a conversation's turn kept on the instance holding its history, not its class's choice;
# joined: served by the variant decoding now, where waiting for the class's at the gate costs more
Role = Literal["exploit", "trial", "control", "pinned", "fallback", "held", "joined"]


@dataclass(frozen=True, slots=True)
class Decision:
    variant: str
    role: Role
    trial: int | None = None
    policy_class: str = ROOT  # whose policy an exploit decision used


class Policy(BaseModel):
    """What the engine decided for one class, with its evidence (persisted, reported)."""

    model_config = ConfigDict(frozen=True)

    class_key: str
    variant: str
    speculation: bool
    reason: str
    kill_switch: bool = False
    override: bool = False
    settled: bool = False  # rests on evidence or a verdict, not on a lack of data
    requests: int = 0
    alpha: float | None = None
    alpha_low: float | None = None
    alpha_high: float | None = None
    tokens_per_step: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    predicted_speedup: float | None = None
    since: float = 0.0

    @property
    def gain(self) -> float:
        """The measured speedup this policy delivers: 1.0 when it does not speculate (or
        speculates on a parent's word, with no measurement of its own)."""
        return self.speedup if self.speculation and self.speedup else 1.0


@dataclass(frozen=True, slots=True)
class Best:
    """The outcome of the guard on one class's measurements."""

    chosen: str | None  # the variant that clears the guard (and beats the held one)
    interval: Interval | None  # the chosen one's speedup
    best_any: tuple[float, str] | None  # the fastest measured at all, cleared or not
    # how the choice stands on the same requests: the chosen one over the variant it
    # replaced, or (where the class kept its variant) the closest other over it
    paired: str | None = None


def choose(
    speedups: dict[str, Interval],
    *,
    min_gain: float,
    held: str | None,
    allowed: set[str],
    over_held: Mapping[str, Interval] | None = None,
) -> Best:
    """The guard over one class's measured variants (``allowed``: not forbidden here;
    ``over_held``: variants' speedups over the held one on the same requests).

    >>> s = {"a": Interval(1.30, 1.10, 1.50), "b": Interval(1.32, 1.05, 1.60)}
    >>> choose(s, min_gain=1.02, held=None, allowed={"a", "b"}).chosen
    'a'
    >>> choose(s, min_gain=1.02, held="b", allowed={"a", "b"}).chosen  # a's low < b's value
    'b'
    >>> choose({"a": Interval(0.9, 0.8, 1.0)}, min_gain=1.02, held=None, allowed={"a"})
    Best(chosen=None, interval=None, best_any=(0.9, 'a'), paired=None)
    >>> paired = {"a": Interval(1.03, 1.01, 1.05)}  # a is faster on the same requests
    >>> choose(s, min_gain=1.02, held="b", allowed={"a", "b"}, over_held=paired).chosen
    'a'
    """
    best_any: tuple[float, str] | None = None
    clearing: dict[str, Interval] = {}
    for name, s in speedups.items():
        if name not in allowed:
            continue
        if best_any is None or s.value > best_any[0]:
            best_any = (s.value, name)
        if s.low > 1.0 and s.value >= min_gain:
            clearing[name] = s
    if not clearing:
        return Best(None, None, best_any)
    best = ""
    for name, s in clearing.items():  # the first of equal lower bounds
        if not best or s.low > clearing[best].low:
            best = name
    kept = clearing.get(held) if held is not None else None
    paired = None
    if held is not None and kept is not None:
        rivals = {n: s for n, s in (over_held or {}).items() if n in clearing and n != held}
        faster = {n: s for n, s in rivals.items() if s.low > 1.0}
        if faster:
            best = max(faster, key=lambda name: faster[name].value)
            paired = f"moved: {_of(faster[best])} {held} on the same requests"
        elif not clearing[best].low > kept.value:
            best = held  # a near-tie the same requests do not resolve does not move it
            if rivals:
                rival = max(rivals, key=lambda name: rivals[name].value)
                paired = f"closest on the same requests: {rival}, {_of(rivals[rival])} it"
    return Best(best, clearing[best], best_any, paired)


def _of(s: Interval) -> str:
    return f"{s.value:.3f}x [{s.low:.3f}, {s.high:.3f}] of"


def measured_policy(
    key: str,
    name: str,
    s: Interval,
    *,
    alpha: Interval | None,
    requests: int,
    tokens_per_step: float,
    predicted: float | None,
    now: float,
    paired: str | None = None,
) -> Policy:
    """The policy of a class whose measured variant cleared the guard (``paired``: how it
    stands against others on the same requests, ``Best.paired``)."""
    reason = f"measured {s.value:.2f}x [{s.low:.2f}, {s.high:.2f}] over baseline"
    return Policy(
        class_key=key,
        variant=name,
        speculation=True,
        reason=f"{reason}; {paired}" if paired else reason,
        requests=requests,
        alpha=alpha.value if alpha else None,
        alpha_low=alpha.low if alpha else None,
        alpha_high=alpha.high if alpha else None,
        tokens_per_step=tokens_per_step,
        speedup=s.value,
        speedup_low=s.low,
        speedup_high=s.high,
        predicted_speedup=predicted,
        settled=True,
        since=now,
    )


def off_reason(
    best_any: tuple[float, str] | None,
    *,
    converged: bool,
    trials_done: int,
    verdict: str | None,
) -> tuple[str, bool, bool]:
    """Why a class runs no speculation: (reason, kill switch, settled). ``verdict``: the
    prior's reason where it predicts no variant pays on a target of structural cost.

    >>> off_reason((0.9, "v"), converged=True, trials_done=4, verdict=None)[1:]
    (True, True)
    >>> off_reason(None, converged=False, trials_done=0, verdict=None)
    ('no evidence yet', False, False)
    """
    if converged and best_any is not None:
        reason = (
            f"measured: no variant beats baseline; best {best_any[1]} at "
            f"{best_any[0]:.2f}x after {trials_done} trials"
        )
        return reason, True, True
    if verdict is not None:
        return verdict, True, True
    if best_any is not None and best_any[0] < 1.0:
        reason = (
            f"measured: every variant tried is slower than baseline (best {best_any[1]} "
            f"at {best_any[0]:.2f}x); off until one measures faster"
        )
        return reason, False, True
    if trials_done or best_any:
        return f"no variant measured faster yet ({trials_done} trials)", False, converged
    return "no evidence yet", False, converged
