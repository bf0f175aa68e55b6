"""What an n-gram drafter would have drafted and accepted on a request it did not serve.

llama.cpp's ``ngram-simple`` drafter is a pure function of the token history: at each
decode step it looks up the last ``size_n`` tokens (the history's tail plus the token
just sampled) at their latest earlier occurrence in the history and drafts up to
``size_m`` tokens that followed it. The target model's output does not depend on the
drafter (greedy: the same tokens; sampled: the same distribution), so replaying a
finished request's prompt and output tokens through the drafter gives the drafted and
accepted counts that variant would have had, exactly, with no request sent. With the
calibrated cost of a drafted token (``tuner.tuning.evidence.counts``) those counts are its
speedup on that request: every request of a class measures every ``ngram-simple``
variant at once.

The replay follows the server's loop (``tools/server/server-context.cpp``, build
0c1e570): a draft is made whenever the slot may speculate, cut to the tokens left
before ``max_tokens`` (``n_remaining - 1``); the verify step accepts the draft's longest
prefix that matches the output, then the next token is sampled.

``ngram-mod`` keeps a hash table across requests (``ModDrafter``): its replay is exact
for the same sequence of requests, and what the daemon gets from it is an estimate
(what the variant would have drafted had it served all the traffic so far). The other
types (``ngram-map-k``'s key map, ``ngram-cache``) are not replayed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "EXACT",
    "MOD_SIZE",
    "REPLAYABLE",
    "ModDrafter",
    "cut_tail",
    "draft_simple",
    "mod_index",
    "replay_simple",
]

REPLAYABLE = frozenset({"ngram-simple", "ngram-mod"})


# replays that give exactly the server's counts (ngram-mod's table depends on what that one
# instance has served since it was loaded: its replay is an estimate)
EXACT = frozenset({"ngram-simple"})


def cut_tail(predicted: int, output: int) -> int:
    """The accepted drafts an answer left out at its end (``Capabilities.cuts_last_round``): its
    ``predicted`` tokens less the ``output`` tokens its text holds, less the token sampled
    after those drafts (in an answer not cut: its end-of-generation token, or none).

    >>> cut_tail(96, 91), cut_tail(96, 95), cut_tail(96, 96)
    (4, 0, 0)
    """
    return max(0, predicted - output - 1)


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


# -- ngram-mod --------------------------------------------------------------------------

MOD_SIZE = 4 * 1024 * 1024  # common_speculative_impl_ngram_mod's table: 4 Mi entries
_MOD_MULT = 6364136223846793005  # common_ngram_mod::idx's multiplier
_MASK64 = (1 << 64) - 1
_EMPTY = -1
_CHUNK = 32  # draft_one adds the history's new n-grams once this many tokens are pending
_OCCUPANCY = 0.25  # begin() clears the table when more of it is used
_LOW_ACCEPTANCE, _LOW_STREAK = 0.25, 5  # accept(): this many drafts in a row below this share


def mod_index(tokens: Sequence[int], n: int, size: int = MOD_SIZE) -> int:
    """``common_ngram_mod::idx``: the table slot of the ``n`` tokens (reference form, in
    64-bit arithmetic like the C++; ``ModDrafter`` computes the same modulo the size).

    >>> mod_index([1, 2], 2, size=1 << 22) == (6364136223846793005 + 2) % (1 << 22)
    True
    """
    res = 0
    for t in tokens[:n]:
        res = (res * _MOD_MULT + t) & _MASK64
    return res % size


class ModDrafter:
    """One llama-server instance's ``ngram-mod`` drafter, replayed (``speculative.cpp``,
    build 0c1e570).

    Unlike ``ngram-simple`` it keeps state across requests: a hash table of ``size``
    slots (n-gram of ``n_match`` tokens -> the token that followed it; collisions
    overwrite) that every request's prompt and output feed, and a streak of
    low-acceptance drafts that clears the table. ``replay`` runs one request through
    it in the server's order (``begin`` adds the prompt's n-grams; each draft first
    adds the history's new n-grams in chunks of 32, then chains table lookups from the
    last ``n_match`` tokens: at most ``n_max``, none unless ``n_min`` are found).

    So a replay is exact only for the same sequence of requests on one slot. The
    daemon feeds it every answered request, whichever variant served it: what the
    variant would have drafted had it served all traffic. An instance that served
    only part of it (or several slots, each with its own streak) drafts from a
    smaller table. ``size`` is a power of two; the table takes ``4 * size`` bytes
    (16 MiB at the server's size, allocated on the first request).
    """

    def __init__(self, n_match: int = 24, n_max: int = 64, n_min: int = 48, size: int = MOD_SIZE):
        if n_match < 1 or size < 1 or size & (size - 1):
            raise ValueError("n_match must be >= 1 and size a power of two")
        self.n, self.n_max, self.n_min, self.size = n_match, n_max, n_min, size
        self._mask = size - 1
        # idx modulo a power of two only needs each term modulo it
        self._mult = _MOD_MULT & self._mask
        self._powers = [pow(self._mult, n_match - 1 - k, size) for k in range(n_match)]
        self._entries: np.ndarray[Any, np.dtype[np.int32]] | None = None
        self.used = 0
        self._low = 0  # the slot's streak of low-acceptance drafts (kept across requests)
        self._last = 0  # history position up to which n-grams were added (sinfo.i_last)

    @property
    def entries(self) -> np.ndarray[Any, np.dtype[np.int32]]:
        if self._entries is None:
            self._entries = np.full(self.size, _EMPTY, dtype=np.int32)
        return self._entries

    def reset(self) -> None:
        if self._entries is not None:
            self._entries.fill(_EMPTY)
        self.used = 0

    def _hash(self, window: Sequence[int]) -> int:
        return sum(t * p for t, p in zip(window, self._powers, strict=True)) & self._mask

    def _add(self, history: Sequence[int], start: int, stop: int) -> None:
        """``add`` for the n-grams starting at ``start`` .. ``stop - 1`` (each followed by
        a token in ``history``), in order: a later n-gram in the same slot wins."""
        if stop <= start:
            return
        n = self.n
        tokens = np.asarray(history[start : stop + n], dtype=np.int64) & self._mask
        count = stop - start
        h = np.zeros(count, dtype=np.int64)
        for k, p in enumerate(self._powers):  # each term < 2^44, the sum masked each step
            h = (h + tokens[k : k + count] * p) & self._mask
        follow = np.asarray(history[start + n : stop + n], dtype=np.int32)
        # the last occurrence of each slot: first in the reversed order
        slots, first = np.unique(h[::-1], return_index=True)
        entries = self.entries
        self.used += int(np.count_nonzero(entries[slots] == _EMPTY))
        entries[slots] = follow[::-1][first]

    def _begin(self, prompt: Sequence[int]) -> None:
        self._last = 0
        if len(prompt) < self.n:
            return
        self._add(prompt, 0, len(prompt) - self.n)
        self._last = len(prompt) - self.n
        if self.used > _OCCUPANCY * self.size:
            self.reset()

    def _draft(self, history: list[int], sampled: int) -> list[int]:
        """``draft_one``: the draft after ``history`` + ``sampled`` (before the server cuts
        it to the tokens left)."""
        n, cur = self.n, len(history)
        if cur < n:
            return []
        if self._last + _CHUNK < cur:
            self._add(history, self._last, cur - n)
            self._last = cur - n
        entries = self.entries
        window = [*history[cur - n + 1 :], sampled]
        h = self._hash(window)
        top = self._powers[0]
        draft: list[int] = []
        for i in range(self.n_max):
            token = int(entries[h])
            if token == _EMPTY:
                return [] if i < self.n_min else draft
            draft.append(token)
            window.append(token)
            h = ((h - window[i] * top) * self._mult + token) & self._mask
        return draft

    def _accept(self, accepted: int, drafted: int) -> None:
        if accepted / drafted < _LOW_ACCEPTANCE:
            self._low += 1
            if self._low >= _LOW_STREAK:
                self.reset()
                self._low = 0
                self._last = 0
        else:
            self._low = 0

    def replay(
        self, prompt: Sequence[int], output: Sequence[int], max_tokens: int | None = None
    ) -> tuple[int, int]:
        """(drafted, accepted) on one request, after the requests replayed before it;
        the request's prompt and output go into the table for the ones after."""
        self._begin(prompt)
        history = list(prompt)
        drafted = accepted = 0
        i, last = 0, len(output) - 1
        while i < last:
            cap = self.n_max if max_tokens is None else max_tokens - (i + 1) - 1
            full = self._draft(history, output[i]) if cap > 0 else []
            draft = full[:cap]
            k, most = 0, min(len(draft), last - i)
            while k < most and draft[k] == output[i + 1 + k]:
                k += 1
            if draft:
                self._accept(k, len(full))  # the streak counts the draft before the cut
            drafted += len(draft)
            accepted += k
            history.extend(output[i : i + 1 + k])
            i += k + 1
        return drafted, accepted
