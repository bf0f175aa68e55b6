"""What an n-gram drafter would have drafted and accepted on a request it did not serve.

llama.cpp's ``ngram-simple`` drafter is a pure function of the token history: at each
decode step it looks up the last ``size_n`` tokens (the history's tail plus the token
just sampled) at their latest earlier occurrence in the history and drafts up to
``size_m`` tokens that followed it. The target model's output does not depend on the
drafter (greedy: the same tokens; sampled: the same distribution), so replaying a
finished request's prompt and output tokens through the drafter gives the drafted and
accepted counts that variant would have had, exactly, with no request sent. With the
calibrated cost of a drafted token (``tuner.tuning.counts``) those counts are its
speedup on that request: every request of a class measures every ``ngram-simple``
variant at once.

The replay follows the server's loop (``tools/server/server-context.cpp``, build
0c1e570): a draft is made whenever the slot may speculate, cut to the tokens left
before ``max_tokens`` (``n_remaining - 1``); the verify step accepts the draft's longest
prefix that matches the output, then the next token is sampled. The other n-gram types
keep state across requests (``ngram-mod``'s shared hash table, ``ngram-map-k``'s key
map) and are not replayed here.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["REPLAYABLE", "draft_simple", "replay_simple"]

REPLAYABLE = frozenset({"ngram-simple"})


def draft_simple(history: Sequence[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    """``common_ngram_simple_draft``: the draft after ``history`` + ``sampled`` (reference
    form, a backwards scan; ``replay_simple`` keeps an index instead).

    >>> draft_simple([0, 1, 2, 3, 9, 9, 9, 9, 1, 2], 3, size_n=3, size_m=4)
    [9, 9, 9, 9]
    >>> draft_simple([0, 1, 2, 3, 9, 1, 2], 3, size_n=3, size_m=4)  # too short a history
    []
    """
    cur = len(history)
    if cur <= size_n + size_m + 1:
        return []
    pattern = [*history[cur - size_n + 1 :], sampled]
    for j in range(cur - size_n - 1, 0, -1):
        if list(history[j : j + size_n]) == pattern:
            copy = min(size_m, cur - (j + size_n))
            return [] if copy < size_n else list(history[j + size_n : j + size_n + copy])
    return []


def replay_simple(
    prompt: Sequence[int],
    output: Sequence[int],
    size_n: int,
    size_m: int,
    max_tokens: int | None = None,
) -> tuple[int, int]:
    """(drafted, accepted) of ``ngram-simple`` (``size_n``, ``size_m``) on a request that
    produced ``output`` after ``prompt`` (token ids; ``max_tokens``: the request's
    limit, which caps drafts near the end as the server does).

    >>> replay_simple([5, 1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7], 2, 4)
    (4, 4)
    """
    if size_n < 1 or size_m < 1:
        return 0, 0
    history = list(prompt)
    # start of every n-gram in the history, by n-gram, ascending
    index: dict[tuple[int, ...], list[int]] = {}
    indexed = 0  # n-grams starting before this position are in ``index``

    def extend() -> None:
        nonlocal indexed
        for j in range(indexed, len(history) - size_n + 1):
            index.setdefault(tuple(history[j : j + size_n]), []).append(j)
        indexed = max(indexed, len(history) - size_n + 1)

    drafted = accepted = 0
    i = 0  # output[i] is the token just sampled
    last = len(output) - 1
    while i < last:
        # the server's n_draft_max: the tokens left before ``max_tokens``, less one
        cap = size_m if max_tokens is None else min(size_m, max_tokens - (i + 1) - 1)
        draft: Sequence[int] = ()
        cur = len(history)
        if cap > 0 and cur > size_n + size_m + 1:
            extend()
            key = (*history[cur - size_n + 1 :], output[i])
            for j in reversed(index.get(key, ())):
                if 0 < j <= cur - size_n - 1:
                    copy = min(size_m, cur - (j + size_n))
                    if copy >= size_n:
                        draft = history[j + size_n : j + size_n + min(copy, cap)]
                    break
        # a draft running past the output's end is rejected there (the end was sampled)
        k, most = 0, min(len(draft), last - i)
        while k < most and draft[k] == output[i + 1 + k]:
            k += 1
        drafted += len(draft)
        accepted += k
        history.extend(output[i : i + 1 + k])
        i += k + 1
    return drafted, accepted
