"""Whether a request waits at the CPU gate for its class's variant or joins the variant
decoding now (pure).

On a CPU box one variant decodes at a time (``tuner.proxy.gate``): a request for another
waits until the running variant's requests finish. Waiting costs that wait; joining the
running variant costs the decode time its speedup loses against the class's choice over
the answer. A request joins where the wait is the larger.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.sessions.moves import move_saving

__all__ = ["Busy", "waiting_pays"]


@dataclass(frozen=True, slots=True)
class Busy:
    """The gate as routing sees it: the variant a request joins without waiting, and how
    long requests for another variant have waited (a moving mean, seconds)."""

    variant: str
    wait_s: float


def waiting_pays(
    wait_s: float,
    answer_tokens: float,
    step_s: float,
    busy: float,
    wanted: float,
    join_s: float = 0.0,
) -> bool:
    """Whether the decode time the ``wanted`` variant saves over the ``busy`` one (both
    speedups over no speculation, whose step takes ``step_s``), with what joining the busy
    one costs beyond (``join_s``: a turn's history processed again there), beats the wait.

    96 tokens at 40 tokens/s plain, 1.2x against 1.5x, save 0.4 s: a 3 s wait does not pay,
    a 0.2 s one does; a variant no faster than the busy one pays a wait only where joining
    costs more than it:

    >>> waiting_pays(3.0, 96, 1 / 40, 1.2, 1.5), waiting_pays(0.2, 96, 1 / 40, 1.2, 1.5)
    (False, True)
    >>> waiting_pays(1.0, 96, 1 / 40, 1.5, 1.2), waiting_pays(1.0, 96, 1 / 40, 1.5, 1.2, 6.0)
    (False, True)
    """
    saving = move_saving(answer_tokens, step_s, busy, wanted)
    return saving + join_s > wait_s
