"""GGUF introspection on synthetic files (MoE, hybrid recurrent, mismatched draft) and Gemma."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFReader

from tests.model.synthetic_gguf import hybrid, moe, write_gguf
from tuner.errors import ConfigError
from tuner.model.gguf_facts import draft_compatibility, read_facts
from tuner.model.gguf_header import read_header

F32 = 4


def test_moe_bytes_per_token_counts_only_the_routed_experts_in_use(tmp_path: Path) -> None:
    facts = read_facts(moe(tmp_path / "moe.gguf", experts=16, used=2))
    assert facts.is_moe and facts.expert_count == 16 and facts.expert_used == 2
    per_layer_experts = 2 * 16 * 16 * 8 * F32
    assert facts.expert_bytes == 2 * per_layer_experts
    embd = 300 * 8 * F32
    dense = embd + 2 * 8 * 8 * F32 + 16 * 8 * F32  # output head, attention, shared expert
    assert not facts.tied_output
    assert facts.bytes_per_token == dense + facts.expert_bytes * 2 // 16
    assert facts.total_bytes == dense + embd + facts.expert_bytes
    assert facts.expert_fraction == pytest.approx((facts.expert_bytes / 8) / facts.bytes_per_token)
    assert 0 < facts.active_fraction < 1


def test_hybrid_recurrent_state_follows_llama_cpp(tmp_path: Path) -> None:
    facts = read_facts(hybrid(tmp_path / "hybrid.gguf"))
    assert facts.recurrent_layers == 3 and facts.is_hybrid_recurrent
    conv = (4 - 1) * (32 + 2 * 2 * 8)
    ssm = 8 * 32
    assert facts.recurrent_state_bytes == F32 * (conv + ssm) * 3
    assert facts.nextn_layers == 1
    assert facts.tied_output  # no output.weight: the head reads token_embd every token
    assert facts.bytes_per_token == facts.total_bytes


def test_dense_model_is_not_moe(tmp_path: Path) -> None:
    facts = read_facts(write_gguf(tmp_path / "d.gguf", "llama"))
    assert not facts.is_moe and facts.expert_fraction == 0 and facts.state_ratio == 0


def test_draft_with_other_tokens_is_incompatible(tmp_path: Path) -> None:
    target = read_facts(write_gguf(tmp_path / "t.gguf", "llama"))
    tokens = [f"t{i}" for i in range(300)]
    tokens[7] = "other"
    renamed = read_facts(write_gguf(tmp_path / "d1.gguf", "llama", tokens=tokens))
    result = draft_compatibility(target, renamed)
    assert not result.compatible and "token 7" in result.explain()
    small = read_facts(write_gguf(tmp_path / "d2.gguf", "llama", tokens=tokens[:100]))
    assert "differ by 200" in draft_compatibility(target, small).explain()
    other_eos = read_facts(write_gguf(tmp_path / "d3.gguf", "llama", eos=9))
    assert "EOS" in draft_compatibility(target, other_eos).explain()
    assert draft_compatibility(target, target).compatible


def test_special_ids_matter_only_where_the_token_is_added(tmp_path: Path) -> None:
    """llama.cpp's rule: the add flags must agree; the ids only where the token is added."""
    target = read_facts(
        write_gguf(tmp_path / "t.gguf", "llama", kv={"tokenizer.ggml.add_eos_token": 0})
    )
    no_eos = {"tokenizer.ggml.add_eos_token": 0}
    other_eos = read_facts(write_gguf(tmp_path / "d1.gguf", "llama", eos=9, kv=no_eos))
    assert draft_compatibility(target, other_eos).compatible
    adds_eos = read_facts(
        write_gguf(tmp_path / "d2.gguf", "llama", kv={"tokenizer.ggml.add_eos_token": 1})
    )
    assert (
        "the draft adds the EOS token, the target omits it"
        in draft_compatibility(target, adds_eos).explain()
    )
    other_bos = read_facts(write_gguf(tmp_path / "d3.gguf", "llama", bos=7, kv=no_eos))
    assert (
        "BOS token 7 differs from the target's 1"
        in draft_compatibility(target, other_bos).explain()
    )


def test_tokens_before_id_5_may_differ(tmp_path: Path) -> None:
    """llama.cpp starts its token check at id 5 (special tokens often differ)."""
    tokens = [f"t{i}" for i in range(300)]
    tokens[3] = "<special>"
    target = read_facts(write_gguf(tmp_path / "t.gguf", "llama"))
    draft = read_facts(write_gguf(tmp_path / "d.gguf", "llama", tokens=tokens))
    assert draft_compatibility(target, draft).compatible


@pytest.mark.parametrize("maker", [moe, hybrid])
def test_header_reader_agrees_with_gguf_reader(tmp_path: Path, maker) -> None:  # type: ignore[no-untyped-def]
    path = maker(tmp_path / "x.gguf")
    ours = read_header(path)
    theirs = GGUFReader(path)
    assert [(t.name, t.n_bytes) for t in ours.tensors] == [
        (t.name, int(t.n_bytes)) for t in theirs.tensors
    ]
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        assert ours.metadata[key] == field.contents(), key


def test_not_a_gguf_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ConfigError):
        read_facts(bad)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(moe(tmp_path / "m.gguf").read_bytes()[:200])
    with pytest.raises(ConfigError):
        read_facts(truncated)


@pytest.mark.llama
def test_real_gemma_facts() -> None:
    from tuner.upstream.launch import default_model_path

    facts = read_facts(default_model_path())
    assert facts.architecture == "gemma3" and facts.n_layers == 18
    assert facts.vocab_size == 262144 and not facts.is_moe and facts.tied_output
    assert facts.total_bytes == 246_587_904  # sum of the tensor sizes GGUFReader reports
    assert facts.total_params == 268_098_176
