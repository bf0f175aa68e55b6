"""The synthetic MoE writer on a tiny vocabulary (llama-server runs it in tests/integration)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from tuner.model.gguf_facts import read_facts
from tuner.model.synth import SynthSpec, write_moe

TINY = SynthSpec(experts=8, active=2, layers=2, hidden=64, expert_ffn=32, heads=2, kv_heads=1,
                 head_dim=32)  # fmt: skip


@pytest.fixture
def vocab(tmp_path: Path) -> Path:
    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}" for i in range(100)])
    writer.add_token_scores([0.0] * 100)
    writer.add_token_types([1] * 100)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


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
