"""The speedup model as a prior: which variants to try first, and when not to try at all. Pure.

Before any request of a class is measured, its acceptance is a guess (echo classes
accept more; sampling accepts less; some spec types draft worse). N-gram variants
copy earlier text, so they are predicted with the copy model (drafts only on a
match, accepted as runs; ``copy_speedup``), model drafts with Leviathan's. With the
target's cost model (verify curve from a calibration profile or the MoE expert
coverage, recurrent-state restore) each variant gets a predicted speedup. The
best few are tried first; if none is predicted to pay, the class starts with
speculation off and the verdict's reason is kept (the kill switch before data).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tuner.model.speedup import CostModel, copy_speedup, largest_overhead, speedup
from tuner.tuning.config import Prior
from tuner.tuning.variants import Variant

__all__ = ["PriorView", "class_alpha", "cost_for", "rank"]

GAMMA_MAX = 64


def class_alpha(class_key: str, variant: Variant, prior: Prior) -> float:
    """The acceptance guessed for a variant on a class, from the class key alone.

    >>> from tuner.tuning.config import Prior
    >>> round(class_alpha("code/echo/sampled", Variant.of("ngram-simple"), Prior()), 3)
    0.56
    """
    parts = class_key.split("/")
    alpha = prior.alpha_echo if "echo" in parts else prior.alpha_fresh
    if "sampled" in parts:
        alpha *= prior.sampled_scale
    return min(alpha * prior.alpha_scale.get(variant.spec_type, 1.0), 0.99)


def cost_for(variant: Variant, base: CostModel, draft_step: float) -> CostModel:
    """The target's costs with this variant's drafting cost (n-gram drafting is ~free)."""
    step = draft_step if variant.needs_draft_model else 0.0
    return replace(base, draft_step=step)


@dataclass(frozen=True, slots=True)
class PriorView:
    """Variants of one class, best predicted first, and the kill-switch verdict."""

    ranked: tuple[tuple[Variant, float], ...]  # (variant, predicted speedup), best first
    pays: bool
    reason: str

    def predicted(self, name: str) -> float | None:
        return next((s for v, s in self.ranked if v.name == name), None)


def rank(
    class_key: str,
    variants: Sequence[Variant],
    prior: Prior,
    base: CostModel,
    draft_step: float = 0.0,
    alpha_of: Callable[[Variant], float] | None = None,
) -> PriorView:
    """Predict every speculative variant's speedup on a class and sort them.

    ``alpha_of`` replaces the guessed acceptance (the engine passes measured alpha
    once a variant has data). ``pays`` is False when no variant is predicted above 1: the
    reason names the best and its largest overhead.
    """
    scored: list[tuple[Variant, float, float]] = []
    for variant in variants:
        if not variant.speculative:
            continue
        alpha = alpha_of(variant) if alpha_of else class_alpha(class_key, variant, prior)
        gamma = max(1, min(variant.draft_length, GAMMA_MAX))
        cost = cost_for(variant, base, draft_step)
        if variant.copies:
            s = copy_speedup(alpha, gamma, cost, prior.ngram_match, prior.ngram_copy_tokens)
        else:
            s = speedup(alpha, gamma, cost)
        scored.append((variant, s, alpha))
    scored.sort(key=lambda t: (-t[1], t[0].name))
    ranked = tuple((v, s) for v, s, _ in scored)
    if not scored:
        return PriorView(ranked, False, "no speculative variant is available")
    best, s, alpha = max(scored, key=lambda t: t[1])
    if s > 1.0:
        return PriorView(ranked, True, f"predicted {s:.2f}x with {best.name}")
    gamma = max(1, min(best.draft_length, GAMMA_MAX))
    main, size = largest_overhead(alpha, gamma, cost_for(best, base, draft_step))
    reason = (
        f"speculation cannot pay: predicted {s:.2f}x at best ({best.name}, gamma={gamma}, "
        f"alpha={alpha:.2f}); largest overhead: {main} = {size:.2f} decode steps"
    )
    return PriorView(ranked, False, reason)
