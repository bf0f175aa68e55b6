"""The synthetic MoE writer on a tiny vocabulary (llama-server runs it in tests/integration)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from tuner.model.gguf_facts import read_facts
from tuner.synthetic.moe import SynthSpec, write_moe

TINY = SynthSpec(
    experts=8, active=2, layers=2, hidden=64, expert_ffn=32, heads=2, kv_heads=1, head_dim=32
)


def test_moe_file_has_the_shape_and_the_tokenizer(vocab: Path, tmp_path: Path) -> None:
    path = write_moe(tmp_path / "m.gguf", vocab, TINY)
    facts = read_facts(path)
    assert facts.is_moe and facts.expert_count == 8 and facts.expert_used == 2
    assert facts.architecture == "qwen3moe"
    reader = gguf.GGUFReader(path)
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == 100
    assert reader.fields["tokenizer.ggml.bos_token_id"].contents() == 1
    tensors = {t.name: t for t in reader.tensors}
    # ggml order: {n_embd, n_ff_exp, n_expert}
    assert list(tensors["blk.0.ffn_gate_exps.weight"].shape) == [64, 32, 8]
    assert list(tensors["token_embd.weight"].shape) == [64, 100]
    assert not list(tmp_path.glob("*.tmp"))


def test_dense_twin_has_the_active_width_and_no_experts(vocab: Path, tmp_path: Path) -> None:
    path = write_moe(tmp_path / "d.gguf", vocab, TINY, dense=True)
    facts = read_facts(path)
    assert not facts.is_moe and facts.architecture == "qwen3"
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert list(tensors["blk.1.ffn_up.weight"].shape) == [64, 2 * 32]


def test_same_seed_same_weights(vocab: Path, tmp_path: Path) -> None:
    a = write_moe(tmp_path / "a.gguf", vocab, TINY)
    b = write_moe(tmp_path / "b.gguf", vocab, TINY)
    c = write_moe(tmp_path / "c.gguf", vocab, replace(TINY, seed=1))

    def embedding(path: Path) -> np.ndarray:  # type: ignore[type-arg]
        tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
        return np.asarray(tensors["token_embd.weight"].data)

    weights = [embedding(p) for p in (a, b, c)]
    assert np.array_equal(weights[0], weights[1]) and not np.array_equal(weights[0], weights[2])


@pytest.mark.parametrize(
    "bad", [{"active": 0}, {"active": 9}, {"heads": 3, "kv_heads": 2}, {"layers": 0}]
)
def test_impossible_shapes_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        SynthSpec(**{"experts": 8, "active": 2, **bad})


def test_the_hybrid_has_recurrent_attention_expert_and_mtp_layers(
    vocab: Path, tmp_path: Path
) -> None:
    """Every fourth trunk layer attends, the others are recurrent; the MTP block follows."""
    from tuner.synthetic.hybrid import HybridShape, write_qwen35moe

    spec = replace(TINY, layers=8)
    shape = HybridShape(mtp_layers=1, state_size=16, key_heads=2, value_heads=4, shared_ffn=32)
    facts = read_facts(write_qwen35moe(tmp_path / "h.gguf", vocab, spec, shape))
    assert (facts.architecture, facts.n_layers, facts.nextn_layers) == ("qwen35moe", 9, 1)
    assert facts.recurrent_layers == 6 and facts.is_moe and facts.expert_count == 8
    # llama.cpp's state for gated delta net: conv (d_conv - 1) x conv_dim, plus d_state x d_inner
    assert facts.recurrent_state_bytes == 4 * 6 * (3 * (2 * 32 + 64) + 16 * 64)
    tensors = {t.name: t for t in gguf.GGUFReader(tmp_path / "h.gguf").tensors}
    assert "blk.3.attn_q.weight" in tensors and "blk.3.ssm_a" not in tensors
    assert list(tensors["blk.3.attn_q.weight"].shape) == [64, 2 * 2 * 32]  # Q and its gate
    assert list(tensors["blk.0.ssm_conv1d.weight"].shape) == [4, 2 * 32 + 64]
    assert tensors["blk.0.ssm_conv1d.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert list(tensors["blk.8.nextn.eh_proj.weight"].shape) == [2 * 64, 64]


def test_the_hybrid_refuses_shapes_llama_cpp_cannot_run() -> None:
    from tuner.synthetic.hybrid import HybridShape

    with pytest.raises(ValueError, match="one MTP block"):
        HybridShape(mtp_layers=2)
    with pytest.raises(ValueError, match="attention_every >= 2"):
        HybridShape(attention_every=1)
