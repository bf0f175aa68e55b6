"""Which instance holds which prefix."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tuner.sessions.index import COMMON, PrefixIndex
from tuner.sessions.prefix import BLOCK_CHARS, prompt_of

SYSTEM = "You are a careful coding agent. Answer briefly. " * 12  # > 2 blocks


def _chat(*messages: str, system: str = SYSTEM, **extra: object) -> dict[str, object]:
    rendered = [{"role": "system", "content": system}]
    rendered += [{"role": "user", "content": m} for m in messages]
    return {"messages": rendered, **extra}


def test_a_conversation_continues_where_it_was_served() -> None:
    index = PrefixIndex()
    turn1 = prompt_of(_chat("first question " * 30))
    assert index.locate(turn1) is None
    index.remember(turn1, "ngram-mod")
    held = index.locate(prompt_of(_chat("first question " * 30, "second")))
    assert held is not None and held.variant == "ngram-mod" and held.continuing
    assert held.chars("ngram-mod") == len(turn1.blocks) * BLOCK_CHARS
    assert held.chars("none") == 0


def test_the_longest_match_wins_and_of_equals_the_latest() -> None:
    index = PrefixIndex()
    short, long = prompt_of(_chat("a" * 300)), prompt_of(_chat("a" * 900))
    index.remember(short, "none")
    index.remember(long, "ngram-mod")
    held = index.locate(prompt_of(_chat("a" * 900, "next")))
    assert held is not None and held.variant == "ngram-mod"
    assert held.chars("none") == len(short.blocks) * BLOCK_CHARS
    index.remember(long, "none")  # served again elsewhere: both hold it, the latest wins
    held = index.locate(prompt_of(_chat("a" * 900, "next")))
    assert held is not None and held.variant == "none"


def test_a_system_prompt_every_conversation_shares_is_no_continuation() -> None:
    """After COMMON conversations continued the shared system prompt differently, a new
    one that shares only it is new (though the instances do hold its blocks)."""
    index = PrefixIndex()
    for i in range(COMMON):
        index.remember(prompt_of(_chat(f"conversation {i} " * 40)), "ngram-mod")
    new = index.locate(prompt_of(_chat("something else entirely " * 30)))
    assert new is not None and not new.continuing
    assert new.chars("ngram-mod") >= 2 * BLOCK_CHARS  # the shared blocks are still cached
    again = index.locate(prompt_of(_chat("conversation 1 " * 40, "go on")))
    assert again is not None and again.continuing


def test_a_session_id_names_the_instance_and_marks_a_continuation() -> None:
    index = PrefixIndex()
    index.remember(prompt_of({"prompt": "short", "user": "alice"}), "ngram-simple.n3.m8")
    held = index.locate(prompt_of({"prompt": "rewritten history", "user": "alice"}))
    assert held is not None and held.variant == "ngram-simple.n3.m8" and held.continuing
    assert held.chars("ngram-simple.n3.m8") == 0  # nothing of this text is cached
    assert index.locate(prompt_of({"prompt": "rewritten history", "user": "bob"})) is None


def test_a_failed_instance_is_forgotten() -> None:
    index = PrefixIndex()
    prompt = prompt_of({"prompt": "x" * 1000, "user": "alice"})
    index.remember(prompt, "ngram-mod")
    index.remember(prompt_of({"prompt": "x" * 600}), "none")
    index.forget("ngram-mod")
    held = index.locate(prompt)
    assert held is not None and held.variant == "none" and "ngram-mod" not in held.cached


@given(st.lists(st.integers(0, 30), min_size=1, max_size=60), st.integers(1, 40))
def test_the_index_stays_within_its_bound(sizes: list[int], bound: int) -> None:
    index = PrefixIndex(max_blocks=bound)
    for i, blocks in enumerate(sizes):
        index.remember(prompt_of({"prompt": f"{i}:" + "y" * blocks * BLOCK_CHARS}), f"v{i % 3}")
        assert len(index) <= bound


@given(st.lists(st.sampled_from(["none", "a", "b"]), min_size=1, max_size=8))
def test_a_located_instance_held_every_matched_block(servers: list[str]) -> None:
    """Each prompt extends the last; the located variant is the one that served the deepest
    prompt it matches, and what it holds is never more than the prompt."""
    index, text = PrefixIndex(), ""
    for i, variant in enumerate(servers):
        text += f"turn {i} " * 40
        index.remember(prompt_of({"prompt": text}), variant)
    final = prompt_of({"prompt": text + "next"})
    held = index.locate(final)
    assert held is not None and held.variant == servers[-1]
    assert held.chars(servers[-1]) == len(final.blocks) * BLOCK_CHARS
    assert all(n <= final.chars for n in held.cached.values())


def test_a_new_conversation_sharing_only_the_system_prompt_is_new() -> None:
    """The second agent session shares the first one's system prompt but none of its
    history: it is new (free to take a trial), though the instance holds the shared part."""
    index = PrefixIndex()
    index.remember(prompt_of(_chat("the first session's file " * 40)), "none")
    second = index.locate(prompt_of(_chat("the second session's file " * 40)))
    assert second is not None and not second.continuing
    assert second.chars("none") >= 2 * BLOCK_CHARS
    first_again = index.locate(prompt_of(_chat("the first session's file " * 40, "next")))
    assert first_again is not None and first_again.continuing


def test_the_same_prompt_sent_again_is_a_request_of_its_own() -> None:
    """A retry or a batch job re-sends a prompt unchanged: it is no later turn (it may be
    explored), though the instance that served it still holds it."""
    index = PrefixIndex()
    prompt = prompt_of({"prompt": "Rewrite this function. " * 40})
    index.remember(prompt, "none")
    again = index.locate(prompt)
    assert again is not None and not again.continuing and again.chars("none") > 0
    longer = index.locate(prompt_of({"prompt": "Rewrite this function. " * 40 + "Now rename."}))
    assert longer is not None and longer.continuing
