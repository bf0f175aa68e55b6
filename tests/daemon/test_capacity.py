"""How many instances fit, and the context an unset ``ctx_size`` chooses."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from tuner.daemon.capacity import AUTO_CONTEXTS, context_size, instances_that_fit
from tuner.model.gguf_facts import ModelFacts

GIB = 2**30
FACTS = ModelFacts(
    path="/m.gguf",
    architecture="gemma3",
    name="gemma",
    n_layers=18,
    n_embd=640,
    context_length=32768,
    total_bytes=300 * 2**20,
    total_params=270_000_000,
    expert_count=0,
    expert_used=0,
    expert_shared=0,
    expert_bytes=0,
    embedding_bytes=0,
    tied_output=True,
    recurrent_layers=0,
    recurrent_state_bytes=0,
    nextn_layers=0,
    vocab_size=262144,
    tokenizer_model="llama",
    bos_id=2,
    eos_id=1,
    add_bos=True,
    add_eos=False,
    vocab_digest="",
    tokens=(),
)


def test_a_set_context_is_kept() -> None:
    assert context_size(FACTS, 2048, gpu=False, limit=6, available_ram=64 * GIB) == 2048


def test_a_small_model_with_room_gets_its_trained_context() -> None:
    assert context_size(FACTS, 0, gpu=False, limit=6, available_ram=24 * GIB) == 32768
    short = dataclasses.replace(FACTS, context_length=8192)
    assert context_size(short, 0, gpu=False, limit=6, available_ram=24 * GIB) == 8192
    tiny = dataclasses.replace(FACTS, context_length=2048)
    assert context_size(tiny, 0, gpu=False, limit=6, available_ram=24 * GIB) == 2048


@given(st.integers(1, 64), st.integers(1, 12), st.booleans())
def test_a_larger_context_never_costs_instances(ram_gib: int, limit: int, gpu: bool) -> None:
    """The chosen context loads as many instances as the smallest would, and is one of the
    choices (at most the model's)."""
    memory = {"available_ram": ram_gib * GIB, "free_gpu": ram_gib * GIB // 2}
    ctx = context_size(FACTS, 0, gpu=gpu, limit=limit, **memory)
    assert ctx in AUTO_CONTEXTS
    want = min(limit, 4)

    def fit(c: int) -> int:
        return instances_that_fit(FACTS, c, gpu=gpu, limit=want, **memory).instances

    assert fit(ctx) == fit(AUTO_CONTEXTS[-1])
    larger = [c for c in AUTO_CONTEXTS if c > ctx]
    assert all(fit(c) < fit(ctx) for c in larger)
