"""Write small GGUF files with the ``gguf`` package, for the introspection tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter


def write_gguf(
    path: Path,
    arch: str,
    *,
    kv: dict[str, Any] | None = None,
    tensors: dict[str, tuple[int, ...]] | None = None,
    tokens: list[str] | None = None,
    bos: int = 1,
    eos: int = 2,
) -> Path:
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(4)
    writer.add_embedding_length(8)
    writer.add_context_length(512)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens or [f"t{i}" for i in range(300)])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(True)
    for key, value in (kv or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    for name, shape in (tensors or {"token_embd.weight": (300, 8)}).items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def moe(path: Path, experts: int = 16, used: int = 2) -> Path:
    """A dense part of 4 small tensors plus routed experts in two layers."""
    tensors = {
        "token_embd.weight": (300, 8),
        "output.weight": (300, 8),
        "blk.0.attn_q.weight": (8, 8),
        "blk.1.attn_q.weight": (8, 8),
        "blk.0.ffn_gate_exps.weight": (experts, 16, 8),
        "blk.0.ffn_down_exps.weight": (experts, 8, 16),
        "blk.1.ffn_gate_exps.weight": (experts, 16, 8),
        "blk.1.ffn_down_exps.weight": (experts, 8, 16),
        "blk.0.ffn_gate_shexp.weight": (16, 8),
    }
    kv = {"qwen3moe.expert_count": experts, "qwen3moe.expert_used_count": used}
    return write_gguf(path, "qwen3moe", kv=kv, tensors=tensors)


def hybrid(path: Path) -> Path:
    """Layers 0-2 recurrent (ssm tensors), layer 3 full attention."""
    tensors = {"token_embd.weight": (300, 8), "blk.3.attn_q.weight": (8, 8)}
    for layer in range(3):
        tensors[f"blk.{layer}.ssm_conv1d.weight"] = (4, 64)
        tensors[f"blk.{layer}.ssm_a"] = (4,)
    kv = {
        "qwen3next.ssm.conv_kernel": 4,
        "qwen3next.ssm.inner_size": 32,
        "qwen3next.ssm.state_size": 8,
        "qwen3next.ssm.group_count": 2,
        "qwen3next.full_attention_interval": 4,
        "qwen3next.nextn_predict_layers": 1,
    }
    return write_gguf(path, "qwen3next", kv=kv, tensors=tensors)
