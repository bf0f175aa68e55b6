"""Whether moving a conversation's turn to a faster variant's instance pays (pure).

Moving costs the history the new instance does not hold, processed at the machine's
prefill rate; it saves the answer's decode time between the two variants' speeds, and the
CPU gate's wait where staying waits for another variant's requests and moving does not. A
turn moves only when the saving is larger.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Turn", "move_cost", "move_pays", "move_saving"]


@dataclass(frozen=True, slots=True)
class Turn:
    """A conversation's next turn as routing sees it: the variant whose instance holds its
    history, the prompt tokens each instance holds, and the answer's limit."""

    held: str
    cached: Mapping[str, float]  # tokens (estimated from characters)
    max_tokens: int | None = None

    def extra(self, variant: str) -> float:
        """Tokens that moving to ``variant`` processes again."""
        return self.cached.get(self.held, 0.0) - self.cached.get(variant, 0.0)


def move_cost(extra_tokens: float, prefill_tok_s: float) -> float:
    """Seconds to process ``extra_tokens`` of history again on the new instance."""
    return max(0.0, extra_tokens) / prefill_tok_s


def move_saving(answer_tokens: float, step_s: float, held: float, wanted: float) -> float:
    """Decode seconds saved over an answer by a variant of speedup ``wanted`` against one of
    speedup ``held`` (both over no speculation, whose step takes ``step_s``); negative when
    the held variant is the faster.

    >>> round(move_saving(100, 0.025, 1.0, 2.0), 3)
    1.25
    """
    return answer_tokens * step_s * (1.0 / held - 1.0 / wanted)


def move_pays(
    extra_tokens: float,
    prefill_tok_s: float,
    answer_tokens: float,
    step_s: float,
    held: float,
    wanted: float,
    wait_s: float = 0.0,
) -> bool:
    """Whether the decode time saved, with the gate's ``wait_s`` that staying costs beyond
    moving (negative where moving waits and staying does not), beats the history processed
    again.

    A 2,000-token history at 350 tokens/s costs 5.7 s; 96 tokens at 40 tokens/s, 1.4x
    against 1.9x, save 0.45 s; staying behind a 6 s wait for the other variant's requests
    costs more:

    >>> move_pays(2000, 350, 96, 1 / 40, 1.4, 1.9), move_pays(2000, 350, 96, 1 / 40, 1.4, 1.9, 6.0)
    (False, True)
    >>> move_pays(0, 350, 96, 1 / 40, 1.4, 1.9)
    True
    """
    saving = move_saving(answer_tokens, step_s, held, wanted) + wait_s
    return saving > move_cost(extra_tokens, prefill_tok_s)
