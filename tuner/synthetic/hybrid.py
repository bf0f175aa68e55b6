"""A random-weight ``qwen35moe`` target: the Qwen3.5/3.6-A3B family in small.

Gated DeltaNet (recurrent) layers interleaved with gated attention layers (every
``full_attention_interval``-th layer attends), routed experts plus a shared expert in
every layer, and ``mtp_layers`` next-n (MTP) blocks after the trunk, which llama.cpp's
``--spec-type draft-mtp`` drafts with. Tensor names and shapes follow llama.cpp's loader
for the architecture (``src/models/qwen35moe.cpp``); the real model's ratios are kept
where the shapes allow (value heads twice the key heads, a head dimension equal to the
recurrent state size, a quarter of the head rotated). Output is noise: like the ``qwen3moe``
target, it shows costs (verify curve, recurrent-state rollback), never acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.synthetic.moe import SynthSpec, Writer

__all__ = ["HybridShape", "write_qwen35moe"]

ARCH = "qwen35moe"


@dataclass(frozen=True, slots=True)
class HybridShape:
    """What the hybrid adds to a ``SynthSpec``: its recurrent layers and MTP blocks."""

    mtp_layers: int = 1
    attention_every: int = 4  # Qwen3.5/3.6: 3 recurrent layers, then one attention layer
    state_size: int = 64  # per recurrent head (key and value head dimension)
    key_heads: int = 4
    value_heads: int = 8
    conv_kernel: int = 4
    shared_ffn: int = 512  # the shared expert's width

    def __post_init__(self) -> None:
        if not 0 <= self.mtp_layers <= 1:
            raise ValueError("llama.cpp's qwen35moe runs at most one MTP block")
        # every layer attending leaves the recurrent memory empty, which this build aborts on
        if self.attention_every < 2 or self.value_heads % self.key_heads:
            raise ValueError("need attention_every >= 2 and value_heads a multiple of key_heads")


def write_qwen35moe(path: Path, vocab: Path, spec: SynthSpec, shape: HybridShape) -> Path:
    """Write the hybrid to ``path`` (F16 matrices, F32 norms and recurrent scalars)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    kind = f"{spec.experts} experts, {spec.active} routed, {shape.mtp_layers} MTP"
    w = Writer(tmp, ARCH, kind, spec, vocab)
    out, h = w.out, spec.hidden
    out.add_block_count(spec.layers + shape.mtp_layers)  # the MTP blocks follow the trunk
    out.add_uint32(f"{ARCH}.nextn_predict_layers", shape.mtp_layers)
    out.add_feed_forward_length(spec.expert_ffn)
    out.add_expert_count(spec.experts)
    out.add_expert_used_count(spec.active)
    out.add_expert_feed_forward_length(spec.expert_ffn)
    out.add_uint32(f"{ARCH}.expert_shared_feed_forward_length", shape.shared_ffn)
    rotated = max(spec.head_dim // 4, 2)  # partial rotary, split into the mrope sections
    out.add_rope_dimension_count(rotated)
    half = rotated // 2
    out.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
    out.add_uint32(f"{ARCH}.full_attention_interval", shape.attention_every)
    value_dim = shape.state_size * shape.value_heads
    key_dim = shape.state_size * shape.key_heads
    out.add_ssm_conv_kernel(shape.conv_kernel)
    out.add_ssm_inner_size(value_dim)
    out.add_ssm_state_size(shape.state_size)
    out.add_ssm_time_step_rank(shape.value_heads)
    out.add_ssm_group_count(shape.key_heads)
    w.embeddings()
    for i in range(spec.layers + shape.mtp_layers):
        b = f"blk.{i}."
        w.norm(b + "attn_norm.weight", h)
        w.norm(b + "post_attention_norm.weight", h)
        if i >= spec.layers or (i + 1) % shape.attention_every == 0:
            w.attention(b, gated=True)
        else:
            w.matrix(b + "attn_qkv.weight", 2 * key_dim + value_dim, h)
            w.matrix(b + "attn_gate.weight", value_dim, h)
            conv = w.rng.standard_normal((2 * key_dim + value_dim, shape.conv_kernel)) * 0.02
            w.f32(b + "ssm_conv1d.weight", conv)  # llama.cpp's conv op reads F32 only
            w.f32(b + "ssm_dt.bias", np.zeros(shape.value_heads))
            w.f32(b + "ssm_a", -np.ones(shape.value_heads))  # decay, as the real A_log gives
            w.matrix(b + "ssm_beta.weight", shape.value_heads, h)
            w.matrix(b + "ssm_alpha.weight", shape.value_heads, h)
            w.norm(b + "ssm_norm.weight", shape.state_size)
            w.matrix(b + "ssm_out.weight", h, value_dim)
        w.experts(b)
        w.f32(b + "ffn_gate_inp_shexp.weight", np.zeros(h))
        w.matrix(b + "ffn_gate_shexp.weight", shape.shared_ffn, h)
        w.matrix(b + "ffn_up_shexp.weight", shape.shared_ffn, h)
        w.matrix(b + "ffn_down_shexp.weight", h, shape.shared_ffn)
        if i >= spec.layers:  # the MTP block's own projection and norms
            w.matrix(b + "nextn.eh_proj.weight", h, 2 * h)
            w.norm(b + "nextn.enorm.weight", h)
            w.norm(b + "nextn.hnorm.weight", h)
    return w.finish(tmp, path)
