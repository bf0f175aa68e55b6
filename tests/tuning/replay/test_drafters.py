"""Replaying n-gram drafters from token ids (``tuner.tuning.replay.drafters``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.tuning.replay.drafters import ModDrafter, draft_simple, mod_index, replay_simple


def _reference(
    prompt: Sequence[int], output: Sequence[int], n: int, m: int, max_tokens: int | None
) -> tuple[int, int]:
    """The server's loop written plainly, with the drafter's own backwards scan."""
    history, i, drafted, accepted, last = list(prompt), 0, 0, 0, len(output) - 1
    while i < last:
        cap = m if max_tokens is None else min(m, max_tokens - i - 2)
        draft = draft_simple(history, output[i], n, m)[:cap] if cap > 0 else []
        k = 0
        while k < min(len(draft), last - i) and draft[k] == output[i + 1 + k]:
            k += 1
        drafted, accepted = drafted + len(draft), accepted + k
        history += output[i : i + 1 + k]
        i += k + 1
    return drafted, accepted


tokens = st.lists(st.integers(0, 3), max_size=120)


@settings(max_examples=300, deadline=None)
@given(tokens, tokens, st.integers(1, 6), st.integers(1, 12), st.none() | st.integers(1, 140))
def test_the_indexed_replay_is_the_scan(
    prompt: list[int], output: list[int], n: int, m: int, max_tokens: int | None
) -> None:
    found = replay_simple(prompt, output, n, m, max_tokens)
    assert found == _reference(prompt, output, n, m, max_tokens)
    drafted, accepted = found
    assert 0 <= accepted <= drafted
    assert accepted <= max(len(output) - 1, 0)


def test_an_answer_that_copies_the_prompt_is_drafted_and_accepted() -> None:
    body = list(range(100, 160))
    prompt = [1, *body, 7, 8]  # the answer repeats ``body``
    drafted, accepted = replay_simple(prompt, body, size_n=3, size_m=16)
    assert accepted >= len(body) - 8 and drafted - accepted <= 16
    # nothing to copy: no drafts at all
    assert replay_simple(list(range(1000, 1100)), list(range(2000, 2060)), 3, 16) == (0, 0)


def test_drafts_stop_short_of_max_tokens() -> None:
    body = list(range(100, 160))
    prompt = [1, *body, 7, 8]
    free = replay_simple(prompt, body, 3, 16)
    capped = replay_simple(prompt, body[:20], 3, 16, max_tokens=20)
    assert capped[0] <= 18 and capped[1] <= 18 and free[0] > capped[0]


def test_draft_simple_matches_the_latest_earlier_occurrence() -> None:
    history = [0, 5, 6, 1, 2, 5, 6, 3, 4, 9, 9, 9, 5]
    # pattern (5, 6): latest earlier match at 5 -> copies what followed it there
    assert draft_simple(history, 6, size_n=2, size_m=4) == [3, 4, 9, 9]
    assert draft_simple(history, 7, size_n=2, size_m=4) == []  # no match
    assert draft_simple(history, 6, size_n=2, size_m=20) == []  # history too short for m


class _ModReference:
    """``common_speculative_impl_ngram_mod`` on one slot, written as the C++ is: a list
    table, ``mod_index`` per lookup, ``add`` one n-gram at a time."""

    def __init__(self, n: int, n_max: int, n_min: int, size: int) -> None:
        self.n, self.n_max, self.n_min, self.size = n, n_max, n_min, size
        self.entries, self.used, self.low, self.last = [-1] * size, 0, 0, 0

    def add(self, tokens: Sequence[int]) -> None:
        i = mod_index(tokens, self.n, self.size)
        self.used += self.entries[i] == -1
        self.entries[i] = tokens[self.n]

    def reset(self) -> None:
        self.entries, self.used = [-1] * self.size, 0

    def begin(self, prompt: list[int]) -> None:
        self.last = 0
        if len(prompt) < self.n:
            return
        for i in range(len(prompt) - self.n):
            self.add(prompt[i:])
        self.last = len(prompt) - self.n
        if self.used / self.size > 0.25:
            self.reset()

    def draft(self, history: list[int], sampled: int) -> list[int]:
        n, cur = self.n, len(history)
        if cur < n:
            return []
        if self.last + 32 < cur:
            for i in range(self.last, cur - n):
                self.add(history[i:])
            self.last = cur - n
        result = [*history[cur - n + 1 :], sampled]
        for i in range(self.n_max):
            token = self.entries[mod_index(result[i:], n, self.size)]
            if token == -1:
                if i < self.n_min:
                    return []
                break
            result.append(token)
        return result[n:]

    def replay(
        self, prompt: list[int], output: list[int], max_tokens: int | None
    ) -> tuple[int, int]:
        self.begin(prompt)
        history, i, drafted, accepted, last = list(prompt), 0, 0, 0, len(output) - 1
        while i < last:
            cap = self.n_max if max_tokens is None else max_tokens - i - 2
            full = self.draft(history, output[i]) if cap > 0 else []
            draft = full[:cap]
            k = 0
            while k < min(len(draft), last - i) and draft[k] == output[i + 1 + k]:
                k += 1
            if draft:
                if k / len(full) < 0.25:
                    self.low += 1
                    if self.low >= 5:
                        self.reset()
                        self.low, self.last = 0, 0
                else:
                    self.low = 0
            drafted, accepted = drafted + len(draft), accepted + k
            history += output[i : i + 1 + k]
            i += k + 1
        return drafted, accepted


requests = st.lists(
    st.tuples(tokens, tokens, st.none() | st.integers(1, 140)), min_size=1, max_size=4
)


@settings(max_examples=200, deadline=None)
@given(
    requests,
    st.integers(1, 5),
    st.integers(1, 12),
    st.integers(0, 12),
    st.sampled_from([8, 64, 1 << 12]),
    st.integers(0, 1 << 20),
)
def test_the_mod_replay_is_the_drafter_written_plainly(
    sequence: list[tuple[list[int], list[int], int | None]],
    n: int,
    n_max: int,
    n_min: int,
    size: int,
    offset: int,
) -> None:
    """Across a sequence of requests (the table carries over), with tiny tables (slots
    collide, the occupancy reset fires) and large token ids (the hash's arithmetic)."""
    fast, slow = ModDrafter(n, n_max, n_min, size), _ModReference(n, n_max, n_min, size)
    for prompt, output, max_tokens in sequence:
        prompt, output = [t + offset for t in prompt], [t + offset for t in output]
        assert fast.replay(prompt, output, max_tokens) == slow.replay(prompt, output, max_tokens)
        assert fast.used == slow.used
        assert fast.entries.tolist() == slow.entries


def test_mod_remembers_earlier_requests() -> None:
    """What one request generated is drafted in the next one that repeats it (but its
    last chunk: n-grams are added 32 at a time while drafting, none after the answer)."""
    drafter = ModDrafter(n_match=4, n_max=16, n_min=4)
    answer = list(range(1000, 1100))
    first = drafter.replay([1, 2, 3, 4, 5], answer)
    again = drafter.replay([1, 2, 3, 4, 5], answer)
    assert first == (0, 0)
    assert len(answer) - 40 <= again[1] <= len(answer) - 16 and again[0] - again[1] <= 16
    assert ModDrafter(4, 16, 4).replay([1, 2, 3, 4, 5], answer) == (0, 0)  # a fresh table


def test_mod_drafts_nothing_below_n_min() -> None:
    body = list(range(100, 120))
    prompt = [1, *body, 7, 8]
    assert ModDrafter(3, 16, 12).replay(prompt, body)[0] > 0
    # the copy runs out after 20 tokens: a minimum of 32 found is never met
    assert ModDrafter(3, 64, 32).replay(prompt, body) == (0, 0)


def test_mod_index_is_the_cpp_hash() -> None:
    c = 6364136223846793005
    expected = ((((5 * c) + 7) * c + 9) % (1 << 64)) % (4 * 1024 * 1024)
    assert mod_index([5, 7, 9, 11], 3) == expected
    with pytest.raises(ValueError):
        ModDrafter(3, 8, 4, size=100)
