"""From model facts to a cost model, and the speedup envelope over acceptance and draft length.

Assumptions, all memory-bound (decode reads every active weight once per step):

- a draft model's step costs ``draft.bytes_per_token / target.bytes_per_token``
  target steps; n-gram drafting (no draft model) costs ~0;
- a verify pass of ``n`` tokens on an MoE reads the dense part once and the
  routed experts it touches (``moe_verify_curve``);
- a hybrid recurrent target copies its recurrent state every round (checkpoint)
  and copies it back when a draft is partly rejected (restore), each costing
  ``state_bytes / bytes_per_token`` steps, then replays the accepted tokens
  (llama.cpp cannot truncate recurrent state).

``tuner calibrate`` replaces these guesses with measured curves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.model.gguf_facts import ModelFacts
from tuner.model.speedup import CostModel, best_gamma, moe_verify_curve, speedup

__all__ = ["ALPHAS", "GAMMAS", "Envelope", "break_even_alpha", "cost_model", "envelope"]

ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
GAMMAS = (1, 2, 3, 4, 6, 8, 12, 16)


def cost_model(
    *,
    draft_step: float = 0.0,
    experts: int = 0,
    active: int = 0,
    expert_fraction: float = 0.0,
    state_ratio: float = 0.0,
) -> CostModel:
    """A cost model from plain numbers (the ``tuner predict`` inputs)."""
    moe = experts > 1 and 0 < active <= experts and expert_fraction > 0
    verify = (
        moe_verify_curve(experts, active, expert_fraction=expert_fraction)
        if moe
        else CostModel().verify
    )
    return CostModel(
        draft_step=draft_step,
        verify=verify,
        checkpoint=state_ratio,
        restore=state_ratio,
        replay=state_ratio > 0,
        moe=moe,
    )


def cost_model_from_facts(target: ModelFacts, draft: ModelFacts | None = None) -> CostModel:
    step = (
        draft.bytes_per_token / target.bytes_per_token if draft and target.bytes_per_token else 0.0
    )
    return cost_model(
        draft_step=step,
        experts=target.expert_count,
        active=target.expert_used,
        expert_fraction=target.expert_fraction,
        state_ratio=target.state_ratio,
    )


def break_even_alpha(cost: CostModel, gamma_max: int = 16, tol: float = 1e-4) -> float | None:
    """The acceptance above which speculation pays at its best draft length (None: never)."""

    def pays(alpha: float) -> bool:
        return best_gamma(alpha, cost, gamma_max)[0] > 0

    if not pays(0.999):
        return None
    lo, hi = 0.0, 0.999
    if pays(lo):
        return 0.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pays(mid) else (mid, hi)
    return hi


@dataclass(frozen=True, slots=True)
class Envelope:
    alphas: tuple[float, ...]
    gammas: tuple[int, ...]
    table: tuple[tuple[float, ...], ...]  # rows: alphas, columns: gammas
    break_even: float | None


def envelope(
    cost: CostModel, alphas: Sequence[float] = ALPHAS, gammas: Sequence[int] = GAMMAS
) -> Envelope:
    rows = tuple(tuple(speedup(a, g, cost) for g in gammas) for a in alphas)
    return Envelope(tuple(alphas), tuple(gammas), rows, break_even_alpha(cost, max(gammas)))
