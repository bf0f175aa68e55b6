"""Random-weight GGUF targets for controlled experiments: a small-active MoE and its dense twin.

``write_moe`` writes a ``qwen3moe`` model (the Qwen3 MoE architecture: E routed
experts per layer, k of them per token) that llama.cpp loads and runs; ``dense=True``
writes a ``qwen3`` model whose feed-forward width is ``k * expert_ffn``: the same
active weights per token, no routing. The tokenizer (vocabulary, scores, types,
special ids) is copied from a tokenizer-only GGUF such as llama.cpp's
``models/ggml-vocab-llama-spm.gguf``; ``vocab_from_sdist`` takes it out of the
cached llama.cpp sources.

What such a model can show: how the cost of verifying a batch of n tokens grows with n
when each token routes to different experts (memory traffic and compute are real);
whether the speedup model's MoE term predicts it; and that the tuner's kill switch
keeps such a target at baseline. What it cannot show: acceptance. Its output is noise,
so n-gram and draft acceptance on it says nothing about a trained model; use measured
alpha from a real model with this cost curve instead.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SynthSpec", "Writer", "vocab_from_sdist", "write_moe"]

VOCAB_MEMBER = "vendor/llama.cpp/models/ggml-vocab-{name}.gguf"
SHARE_ABOVE = 2**22  # elements: larger tensors of one shape share their values


@dataclass(frozen=True, slots=True)
class SynthSpec:
    """Shape of the synthetic target (defaults: ~1.7 GB F16, 128 experts, 8 routed)."""

    experts: int = 128
    active: int = 8
    layers: int = 8
    hidden: int = 512
    expert_ffn: int = 512
    heads: int = 8
    kv_heads: int = 4
    head_dim: int = 64
    context: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if self.experts and not 0 < self.active <= self.experts:
            raise ValueError(f"need 0 < active <= experts, got {self.active} of {self.experts}")
        if self.heads % self.kv_heads:
            raise ValueError("heads must be a multiple of kv_heads")
        for name in ("layers", "hidden", "expert_ffn", "heads", "head_dim", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


def vocab_from_sdist(sdist: Path, dest_dir: Path, name: str = "llama-spm") -> Path:
    """Extract ``ggml-vocab-<name>.gguf`` from the llama-cpp-python sdist (once)."""
    dest = dest_dir / f"ggml-vocab-{name}.gguf"
    if dest.is_file():
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as archive:
        member = next(
            (m for m in archive.getmembers() if m.name.endswith(VOCAB_MEMBER.format(name=name))),
            None,
        )
        if member is None:
            raise FileNotFoundError(f"{sdist.name} has no ggml-vocab-{name}.gguf")
        source = archive.extractfile(member)
        assert source is not None
        tmp = dest.with_suffix(".tmp")
        tmp.write_bytes(source.read())
        tmp.replace(dest)
    return dest


def _tokenizer_fields(vocab: Path) -> list[tuple[str, Any, Any]]:
    """``(key, value, sub_type)`` for every ``tokenizer.*`` field of a GGUF."""
    import gguf

    reader = gguf.GGUFReader(vocab)
    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        types = field.types
        if types[0] == gguf.GGUFValueType.ARRAY:
            out.append((key, field.contents(), types[1]))
        else:
            out.append((key, field.contents(), types[0]))
    return out


def _vocab_size(fields: list[tuple[str, Any, Any]]) -> int:
    tokens = next((v for k, v, _ in fields if k == "tokenizer.ggml.tokens"), None)
    if not tokens:
        raise ValueError("the vocabulary file has no tokenizer.ggml.tokens")
    return len(tokens)


class Writer:
    """A GGUF being written: the shape's header keys, the copied tokenizer, random tensors."""

    def __init__(self, tmp: Path, arch: str, name: str, spec: SynthSpec, vocab: Path) -> None:
        import gguf

        fields = _tokenizer_fields(vocab)
        self.n_vocab = _vocab_size(fields)
        self.spec = spec
        self.rng = np.random.default_rng(spec.seed)
        self.shared: dict[tuple[tuple[int, ...], float], np.ndarray[Any, Any]] = {}
        self.out = gguf.GGUFWriter(str(tmp), arch)
        w = self.out
        w.add_name(f"spec-tuner synthetic {arch} ({name}, random weights)")
        w.add_context_length(spec.context)
        w.add_embedding_length(spec.hidden)
        w.add_head_count(spec.heads)
        w.add_head_count_kv(spec.kv_heads)
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
        w.add_rope_freq_base(1_000_000.0)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        for key, value, sub_type in fields:
            if isinstance(value, list):
                w.add_array(key, value)
            elif sub_type == gguf.GGUFValueType.STRING:
                w.add_string(key, value)
            elif sub_type == gguf.GGUFValueType.BOOL:
                w.add_bool(key, bool(value))
            elif sub_type == gguf.GGUFValueType.FLOAT32:
                w.add_float32(key, float(value))
            else:
                w.add_uint32(key, int(value))

    def matrix(self, name: str, *shape: int, scale: float = 0.02) -> None:
        """An F16 tensor; numpy's shape is llama.cpp's reversed ({ne0, ne1} = (ne1, ne0)).

        A large shape's values are drawn once and shared by every tensor of that shape (the
        layers' experts, say): what is measured is cost, never output, and drawing tens of GB
        of normals would take minutes where writing them takes seconds."""
        shared = self.shared.get((shape, scale)) if np.prod(shape) > SHARE_ABOVE else None
        if shared is None:
            values = self.rng.standard_normal(shape, dtype=np.float32) * scale
            shared = values.astype(np.float16)
            if np.prod(shape) > SHARE_ABOVE:
                self.shared[(shape, scale)] = shared
        self.out.add_tensor(name, shared)

    def f32(self, name: str, values: np.ndarray[Any, Any]) -> None:
        self.out.add_tensor(name, values.astype(np.float32))

    def norm(self, name: str, n: int) -> None:
        self.f32(name, np.ones(n))

    def embeddings(self) -> None:
        h = self.spec.hidden
        self.matrix("token_embd.weight", self.n_vocab, h)
        self.norm("output_norm.weight", h)
        self.matrix("output.weight", self.n_vocab, h)

    def attention(self, b: str, *, gated: bool = False) -> None:
        """Q (twice as wide where the arch gates its attention output), K, V, output, norms."""
        spec, h = self.spec, self.spec.hidden
        q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        self.matrix(b + "attn_q.weight", 2 * q if gated else q, h)
        self.matrix(b + "attn_k.weight", kv, h)
        self.matrix(b + "attn_v.weight", kv, h)
        self.matrix(b + "attn_output.weight", h, q)
        self.norm(b + "attn_q_norm.weight", spec.head_dim)
        self.norm(b + "attn_k_norm.weight", spec.head_dim)

    def experts(self, b: str) -> None:
        e, f, h = self.spec.experts, self.spec.expert_ffn, self.spec.hidden
        gate = self.rng.standard_normal((e, h), dtype=np.float32) * 0.5
        self.f32(b + "ffn_gate_inp.weight", gate.astype(np.float16))
        self.matrix(b + "ffn_gate_exps.weight", e, f, h)
        self.matrix(b + "ffn_up_exps.weight", e, f, h)
        self.matrix(b + "ffn_down_exps.weight", e, h, f)

    def finish(self, tmp: Path, path: Path) -> Path:
        self.out.write_header_to_file()
        self.out.write_kv_data_to_file()
        self.out.write_tensors_to_file()
        self.out.close()
        tmp.replace(path)
        return path


def write_moe(
    path: Path, vocab: Path, spec: SynthSpec = SynthSpec(), *, dense: bool = False
) -> Path:
    """Write the random-weight model to ``path`` (F16 matrices, F32 norms); returns ``path``."""
    arch = "qwen3" if dense else "qwen3moe"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    kind = "dense twin" if dense else f"{spec.experts} experts, {spec.active} routed"
    w = Writer(tmp, arch, kind, spec, vocab)
    w.out.add_block_count(spec.layers)
    if dense:
        w.out.add_feed_forward_length(spec.active * spec.expert_ffn)
    else:
        w.out.add_feed_forward_length(spec.expert_ffn)
        w.out.add_expert_count(spec.experts)
        w.out.add_expert_used_count(spec.active)
        w.out.add_expert_feed_forward_length(spec.expert_ffn)
    w.embeddings()
    for i in range(spec.layers):
        b = f"blk.{i}."
        w.norm(b + "attn_norm.weight", spec.hidden)
        w.attention(b)
        w.norm(b + "ffn_norm.weight", spec.hidden)
        if dense:
            ffn = spec.active * spec.expert_ffn
            w.matrix(b + "ffn_gate.weight", ffn, spec.hidden)
            w.matrix(b + "ffn_up.weight", ffn, spec.hidden)
            w.matrix(b + "ffn_down.weight", spec.hidden, ffn)
        else:
            w.experts(b)
    return w.finish(tmp, path)
