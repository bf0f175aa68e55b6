"""Replaying ngram-simple's drafts from token ids (``tuner.tuning.shadow``)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.tuning.shadow import draft_simple, replay_simple


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
