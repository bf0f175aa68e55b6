"""Predicted speedup of speculative decoding: pure functions with worked examples.

Notation: ``alpha`` is the chance that a drafted token is accepted, ``gamma`` the
draft length (tokens proposed per round), and all times are relative to one plain
decode step of the target model, ``t(1) = 1``.

Leviathan et al. (2023), for a draft step costing ``c`` and a verify pass that
costs the same as one decode step::

    S = (1 - alpha**(gamma + 1)) / ((1 - alpha) * (gamma * c + 1))

>>> f"{leviathan(0.80, 4, 0.05):.2f}", f"{leviathan(0.70, 4, 0.05):.2f}"
('2.80', '2.31')
>>> f"{leviathan(0.70, 4, 0.20):.2f}", f"{leviathan(0.55, 4, 0.20):.2f}"
('1.54', '1.17')
>>> f"{leviathan(0.55, 4, 0.30):.2f}"
'0.96'

The general form lets the verify pass of ``n`` tokens cost ``T(n)`` (it grows
with ``n`` on a small-active MoE, because more distinct experts are read) and
adds a recurrent-state checkpoint per round plus a restore when a round is
partly rejected (hybrid gated-delta-net / Mamba targets)::

    S = E[tokens per round] / (gamma * c + T(gamma + 1) + checkpoint + P(reject) * restore)

With ``T(n) = 1`` and no state terms it is exactly Leviathan's formula:

>>> cost = CostModel(draft_step=0.05)
>>> f"{speedup(0.80, 4, cost):.2f}"
'2.80'

A small-active MoE (8 of 256 experts routed, 60 % of a decode step's bytes in
routed experts): verifying 5 tokens reads ~4.7x the expert bytes of one token,
so the verify pass costs 3.2 decode steps, and the same draft that paid 2.80x on
a dense model now loses:

>>> moe = CostModel(0.05, moe_verify_curve(256, 8, expert_fraction=0.6), moe=True)
>>> f"{moe.verify(5):.2f}", f"{speedup(0.80, 4, moe):.2f}"
('3.22', '0.98')
>>> v = verdict(0.55, moe)
>>> v.pays, v.gamma, f"{v.speedup:.2f}"
(False, 0, '1.00')
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "CostModel",
    "Verdict",
    "best_gamma",
    "copy_speedup",
    "distinct_experts",
    "effective_draft_cost",
    "expected_tokens",
    "interpolated_curve",
    "leviathan",
    "moe_verify_curve",
    "speedup",
    "tokens_for_coverage",
    "verdict",
]


def _check(alpha: float, gamma: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")


def expected_tokens(alpha: float, gamma: float) -> float:
    """Expected tokens produced per verify round: ``(1 - alpha**(gamma+1)) / (1 - alpha)``.

    ``gamma`` may be fractional: a measured mean draft length.

    >>> expected_tokens(0.0, 4), expected_tokens(1.0, 4), round(expected_tokens(0.8, 4), 4)
    (1.0, 5.0, 3.3616)
    """
    _check(alpha, gamma)
    if alpha >= 1.0:
        return float(gamma + 1)
    return float((1.0 - alpha ** (gamma + 1)) / (1.0 - alpha))


def leviathan(alpha: float, gamma: int, c: float) -> float:
    """Leviathan's speedup for acceptance ``alpha``, draft length ``gamma``, cost ratio ``c``."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def _flat(n: int) -> float:
    return 1.0


@dataclass(frozen=True, slots=True)
class CostModel:
    """Costs of one speculative round, in units of one plain target decode step.

    ``verify(n)`` is the target's time to check a batch of ``n`` tokens (1 at n=1).
    ``checkpoint`` is paid every round, ``restore`` when a round is partly rejected.
    ``replay``: after a restore the target re-decodes the accepted prefix plus the
    correction token (llama.cpp does this for recurrent targets, whose state
    cannot be truncated), costing ``verify(k + 1)`` when ``k`` drafts were accepted.
    """

    draft_step: float = 0.0
    verify: Callable[[int], float] = field(default=_flat)
    checkpoint: float = 0.0
    restore: float = 0.0
    replay: bool = False
    moe: bool = False  # verify grows because a batch routes to more experts

    @property
    def structural(self) -> bool:
        """A cost the target's architecture imposes (MoE expert growth, recurrent state),
        known from its facts before any request: enough for a verdict before data."""
        return self.moe or self.checkpoint > 0 or self.restore > 0 or self.replay

    def round_time(self, alpha: float, gamma: int) -> float:
        p_reject = 1.0 - alpha**gamma
        time = gamma * self.draft_step + self.verify(gamma + 1) + self.checkpoint
        time += p_reject * self.restore
        if self.replay:  # k accepted, then a rejection: probability alpha**k * (1 - alpha)
            time += sum(alpha**k * (1.0 - alpha) * self.verify(k + 1) for k in range(gamma))
        return time


def speedup(alpha: float, gamma: int, cost: CostModel) -> float:
    """Predicted speedup over plain decoding; exactly 1 for ``gamma == 0``."""
    _check(alpha, gamma)
    if gamma == 0:
        return 1.0
    return expected_tokens(alpha, gamma) / cost.round_time(alpha, gamma)


def copy_speedup(alpha: float, gamma_max: int, cost: CostModel, match: float, copy: float) -> float:
    """Predicted speedup of n-gram drafting, which copies rather than guesses.

    An n-gram draft is what followed an earlier occurrence of the last few tokens, so
    a draft is made only in the ``match`` share of rounds (the others are plain decode
    steps), its length is what that occurrence continues with (about ``copy`` tokens,
    capped at ``gamma_max``), and it is accepted as a run: ``alpha`` is the share of
    drafted tokens accepted (what llama-server reports), not an independent per-token
    chance, so a round that drafts ``d`` tokens yields ``1 + alpha * d`` on average::

        d = copy * (1 - (1 - 1/copy)**gamma_max)
        S = (match * (1 + alpha * d) + 1 - match) / (match * round_cost(d) + 1 - match)

    where ``round_cost(d)`` is ``d * draft_step + T(d + 1)`` plus the recurrent-state
    terms (a restore, and the replay, when the run breaks: share ``1 - alpha``).

    >>> f"{copy_speedup(0.7, 16, CostModel(), match=0.2, copy=16):.2f}"
    '2.40'
    >>> f"{copy_speedup(0.7, 0, CostModel(), match=0.2, copy=16):.2f}"
    '1.00'
    """
    _check(alpha, gamma_max)
    if not 0.0 <= match <= 1.0:
        raise ValueError(f"match must be in [0, 1], got {match}")
    if copy < 1.0:
        raise ValueError(f"copy must be >= 1, got {copy}")
    if gamma_max == 0 or match == 0.0:
        return 1.0
    d = max(1, round(copy * (1.0 - (1.0 - 1.0 / copy) ** gamma_max)))
    broken = 1.0 - alpha
    time = d * cost.draft_step + cost.verify(d + 1) + cost.checkpoint + broken * cost.restore
    if cost.replay:
        time += broken * cost.verify(round(alpha * d) + 1)
    return (match * (1.0 + alpha * d) + 1.0 - match) / (match * time + 1.0 - match)


def distinct_experts(n_experts: int, k: int, n_tokens: int) -> float:
    """Expected distinct experts one layer touches for ``n_tokens`` tokens: E(1 - (1 - k/E)^n).

    >>> round(distinct_experts(256, 8, 1), 6), round(distinct_experts(256, 8, 94) / 256, 3)
    (8.0, 0.949)
    """
    if not 0 < k <= n_experts:
        raise ValueError(f"need 0 < k <= n_experts, got k={k}, E={n_experts}")
    return n_experts * (1.0 - (1.0 - k / n_experts) ** n_tokens)


def tokens_for_coverage(n_experts: int, k: int, fraction: float) -> float:
    """Tokens after which a layer is expected to have touched ``fraction`` of its experts.

    >>> round(tokens_for_coverage(256, 8, 0.95), 1)
    94.4
    """
    if k >= n_experts:
        return 1.0
    return math.log(1.0 - fraction) / math.log(1.0 - k / n_experts)


def moe_verify_curve(
    n_experts: int, k: int, *, expert_fraction: float, per_token: float = 0.0
) -> Callable[[int], float]:
    """``T(n)`` for a memory-bound MoE: the routed-expert bytes grow with distinct experts.

    ``expert_fraction`` is the share of one decode step's bytes that are routed
    experts (the rest, attention and shared experts, is read once per batch);
    ``per_token`` adds compute that grows linearly with the batch.
    """
    if not 0.0 <= expert_fraction <= 1.0:
        raise ValueError("expert_fraction must be in [0, 1]")

    def verify(n: int) -> float:
        growth = distinct_experts(n_experts, k, n) / k
        return (1.0 - expert_fraction) + expert_fraction * growth + per_token * (n - 1)

    return verify


def interpolated_curve(points: Sequence[tuple[int, float]]) -> Callable[[float], float]:
    """A measured ``T(n)`` (calibration) as a function, linear between points, flat past the ends.

    It takes fractional ``n`` too: a measured mean draft length is rarely whole.

    >>> curve = interpolated_curve([(1, 1.0), (3, 1.2), (5, 2.0)])
    >>> curve(2), curve(4), curve(9), curve(2.5)
    (1.1, 1.6, 2.0, 1.15)
    """
    pts = sorted(points)
    if not pts:
        raise ValueError("need at least one point")

    def verify(n: float) -> float:
        if n <= pts[0][0]:
            return pts[0][1]
        for (n0, t0), (n1, t1) in itertools.pairwise(pts):
            if n <= n1:
                return round(t0 + (t1 - t0) * (n - n0) / (n1 - n0), 12)
        return pts[-1][1]

    return verify


def best_gamma(alpha: float, cost: CostModel, gamma_max: int = 16) -> tuple[int, float]:
    """The draft length with the highest predicted speedup (0 = do not speculate)."""
    return max(((g, speedup(alpha, g, cost)) for g in range(gamma_max + 1)), key=lambda t: t[1])


@dataclass(frozen=True, slots=True)
class Verdict:
    pays: bool
    gamma: int  # best draft length; 0 when speculation cannot pay
    speedup: float  # predicted at that length (1.0 when off)
    best_speculative: float  # best predicted over gamma >= 1, even when < 1
    reason: str


def verdict(alpha: float, cost: CostModel, gamma_max: int = 16) -> Verdict:
    """Whether speculation can pay at acceptance ``alpha``, and why not when it cannot."""
    g, s = max(((g, speedup(alpha, g, cost)) for g in range(1, gamma_max + 1)), key=lambda t: t[1])
    if s > 1.0:
        return Verdict(True, g, s, s, f"predicted {s:.2f}x at gamma={g}")
    main, size = largest_overhead(alpha, g, cost)
    reason = (
        f"speculation cannot pay: predicted {s:.2f}x at best gamma={g} "
        f"(alpha={alpha:.2f}); largest overhead: {main} = {size:.2f} decode steps"
    )
    return Verdict(False, 0, 1.0, s, reason)


def largest_overhead(alpha: float, gamma: int, cost: CostModel) -> tuple[str, float]:
    """The biggest of a round's costs beyond one decode step, in decode steps."""
    parts = {
        "draft cost": gamma * cost.draft_step,
        f"verify cost growth{' (MoE experts)' if cost.moe else ''}": cost.verify(gamma + 1) - 1.0,
        "recurrent-state checkpoint/restore": cost.checkpoint + (1.0 - alpha**gamma) * cost.restore,
    }
    main = max(parts, key=lambda k: parts[k])
    return main, parts[main]


def effective_draft_cost(measured_speedup: float, alpha: float, gamma: float) -> float | None:
    """The draft cost ratio ``c`` that makes Leviathan's formula match a measured speedup.

    Solves ``S = E / (gamma * c + 1)`` for ``c`` (with fractional gamma allowed,
    since the measured mean draft length rarely is whole). None when undefined.

    >>> round(effective_draft_cost(2.8013, 0.8, 4), 3)
    0.05
    """
    if measured_speedup <= 0 or gamma <= 0:
        return None
    return (expected_tokens(alpha, gamma) / measured_speedup - 1.0) / gamma
