"""A prompt's leading blocks: a growing conversation keeps its earlier blocks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tuner.sessions.prefix import BLOCK_CHARS, prompt_of, prompt_text

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=3 * BLOCK_CHARS)


@given(TEXT, TEXT)
def test_a_prompt_that_grows_keeps_its_full_blocks(head: str, tail: str) -> None:
    first, second = prompt_of({"prompt": head}), prompt_of({"prompt": head + tail})
    assert len(first.blocks) == len(head) // BLOCK_CHARS
    assert second.blocks[: len(first.blocks)] == first.blocks


@given(TEXT, TEXT)
def test_a_block_digest_covers_everything_before_it(a: str, b: str) -> None:
    """Two prompts share block i's digest only where they share the text up to its end."""
    x, y = prompt_of({"prompt": a}), prompt_of({"prompt": b})
    for i, (dx, dy) in enumerate(zip(x.blocks, y.blocks, strict=False)):
        same = a[: (i + 1) * BLOCK_CHARS] == b[: (i + 1) * BLOCK_CHARS]
        assert (dx == dy) == same


def test_a_chat_turn_extends_the_previous_turns_text() -> None:
    system = {"role": "system", "content": "You are terse. " * 40}
    turn1 = [system, {"role": "user", "content": "Explain this:\n" + "x = 1\n" * 80}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "It sets x.", "tool_calls": [{"id": "c1"}]},
        {"role": "user", "content": [{"type": "text", "text": "And now?"}]},
    ]
    first, second = prompt_text({"messages": turn1}), prompt_text({"messages": turn2})
    assert second.startswith(first) and len(second) > len(first)
    tools = [{"type": "function", "function": {"name": "read"}}]
    assert prompt_text({"messages": turn1, "tools": tools}).endswith(first)


def test_the_session_id_and_answer_limit_come_from_the_request() -> None:
    body = {"prompt": "hi", "user": "u1", "prompt_cache_key": "conv-7", "max_tokens": 64}
    assert prompt_of(body).session == "conv-7"
    assert prompt_of(body, "from-header").session == "from-header"
    assert prompt_of({"prompt": "hi", "user": "u1"}).session == "u1"
    assert prompt_of({"prompt": "hi", "user": ""}).session is None
    assert prompt_of(body).max_tokens == 64
    assert prompt_of({"prompt": "hi", "max_completion_tokens": 9}).max_tokens == 9
    assert prompt_of({"prompt": [1, 2, 3], "n_predict": -1}).max_tokens is None
