"""Facts about a model, read from its GGUF file with the ``gguf`` package.

``read_facts`` returns a ``ModelFacts``: architecture, sizes, experts, recurrent
layers and state, MTP (next-n) layers, vocabulary. From them the speedup model
derives the bytes a decoded token reads (dense part + the routed experts in
use), the share of those bytes that are routed experts, and the recurrent state
a rejected draft forces llama.cpp to restore. ``draft_compatibility`` applies
llama.cpp's own rule for pairing a draft with a target (same tokenizer type and
special tokens, vocab sizes within 128, identical token texts from id 5 on).
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.model.gguf_header import read_header

__all__ = [
    "DRAFT_ARCHS",
    "DraftCompatibility",
    "ModelFacts",
    "draft_compatibility",
    "draft_type",
    "read_facts",
]

_LAYER = re.compile(r"^blk\.(\d+)\.")
_EXPERT = re.compile(r"_exps\b|_exps\.")  # routed experts: ffn_{gate,up,down}_exps
_VOCAB_MAX_DIFF = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE in common/speculative.cpp
_VOCAB_CHECK_FROM = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID


# a draft GGUF's architecture -> the one spec type it serves (any other model: draft-simple)
DRAFT_ARCHS = {"eagle3": "draft-eagle3", "dflash": "draft-dflash"}


def draft_type(architecture: str) -> str:
    """The spec type a draft model of this GGUF architecture is run as.

    >>> draft_type("eagle3"), draft_type("gemma3")
    ('draft-eagle3', 'draft-simple')
    """
    return DRAFT_ARCHS.get(architecture, "draft-simple")


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the speedup model needs to know about one GGUF file."""

    path: str
    architecture: str
    name: str | None
    n_layers: int
    n_embd: int
    context_length: int | None
    total_bytes: int
    total_params: int
    expert_count: int  # 0 for dense models
    expert_used: int
    expert_shared: int
    expert_bytes: int  # all routed-expert tensors together
    embedding_bytes: int
    tied_output: bool  # output head reuses token_embd (read in full every token)
    recurrent_layers: int
    recurrent_state_bytes: int  # per sequence, all recurrent layers (f32 state)
    nextn_layers: int  # MTP heads
    vocab_size: int
    tokenizer_model: str | None
    bos_id: int | None
    eos_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    vocab_digest: str
    tokens: tuple[str, ...]
    fim: bool = False  # fill-in-the-middle tokens: llama-server's /infill can serve it

    @property
    def is_moe(self) -> bool:
        return self.expert_count > 1 and self.expert_used > 0

    @property
    def is_hybrid_recurrent(self) -> bool:
        return self.recurrent_layers > 0

    @property
    def bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: dense part, routed experts in use, output head."""
        dense = self.total_bytes - self.expert_bytes
        if not self.tied_output:
            dense -= self.embedding_bytes  # a row lookup, not a full read
        active_experts = (
            self.expert_bytes * self.expert_used // self.expert_count if self.is_moe else 0
        )
        return dense + active_experts

    @property
    def active_fraction(self) -> float:
        """Share of all weights a decode step reads."""
        return self.bytes_per_token / self.total_bytes if self.total_bytes else 1.0

    @property
    def expert_fraction(self) -> float:
        """Share of a decode step's bytes that are routed experts (grows with verify batch)."""
        if not self.is_moe or not self.bytes_per_token:
            return 0.0
        return (self.expert_bytes * self.expert_used / self.expert_count) / self.bytes_per_token

    @property
    def state_ratio(self) -> float:
        """Recurrent state bytes over bytes per token: a restore's cost in decode steps (approx)."""
        return self.recurrent_state_bytes / self.bytes_per_token if self.bytes_per_token else 0.0


def _int(meta: dict[str, Any], key: str, default: int = 0) -> int:
    value = meta.get(key)
    if isinstance(value, list):  # per-layer values (e.g. head counts): take the largest
        value = max(value) if value else None
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _recurrent_state(meta: dict[str, Any], arch: str, layers: int) -> int:
    """llama.cpp's n_embd_r + n_embd_s (Mamba-style conv + SSM state), f32, times layers."""
    d_conv = _int(meta, f"{arch}.ssm.conv_kernel")
    d_inner = _int(meta, f"{arch}.ssm.inner_size")
    d_state = _int(meta, f"{arch}.ssm.state_size")
    n_group = _int(meta, f"{arch}.ssm.group_count")
    conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    ssm = d_state * d_inner
    return 4 * (conv + ssm) * layers


def read_facts(path: Path) -> ModelFacts:
    """Read a GGUF file's metadata and tensor table (no weights are loaded)."""
    try:
        header = read_header(path)
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise ConfigError(f"cannot read GGUF {path}: {exc}") from exc
    meta = header.metadata
    arch = str(meta.get("general.architecture") or "unknown")
    total_bytes = expert_bytes = embedding_bytes = params = 0
    recurrent: set[int] = set()
    has_output = False
    for tensor in header.tensors:
        total_bytes += tensor.n_bytes
        params += tensor.n_elements
        if _EXPERT.search(tensor.name):
            expert_bytes += tensor.n_bytes
        if tensor.name.startswith("token_embd."):
            embedding_bytes += tensor.n_bytes
        if tensor.name.startswith("output.weight"):
            has_output = True
        layer = _LAYER.match(tensor.name)
        if layer and ".ssm_" in tensor.name:
            recurrent.add(int(layer.group(1)))
    raw_tokens = meta.get("tokenizer.ggml.tokens")
    tokens = tuple(str(t) for t in raw_tokens) if isinstance(raw_tokens, list) else ()
    add_bos, add_eos = (meta.get(f"tokenizer.ggml.add_{t}_token") for t in ("bos", "eos"))
    name, model = meta.get("general.name"), meta.get("tokenizer.ggml.model")
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    return ModelFacts(
        path=str(path),
        architecture=arch,
        name=str(name) if name is not None else None,
        n_layers=_int(meta, f"{arch}.block_count"),
        n_embd=_int(meta, f"{arch}.embedding_length"),
        context_length=_int(meta, f"{arch}.context_length") or None,
        total_bytes=total_bytes,
        total_params=params,
        expert_count=_int(meta, f"{arch}.expert_count"),
        expert_used=_int(meta, f"{arch}.expert_used_count"),
        expert_shared=_int(meta, f"{arch}.expert_shared_count"),
        expert_bytes=expert_bytes,
        embedding_bytes=embedding_bytes,
        tied_output=not has_output,
        recurrent_layers=len(recurrent),
        recurrent_state_bytes=_recurrent_state(meta, arch, len(recurrent)),
        nextn_layers=_int(meta, f"{arch}.nextn_predict_layers"),
        vocab_size=len(tokens),
        tokenizer_model=str(model) if model is not None else None,
        bos_id=int(bos) if isinstance(bos, int) else None,
        eos_id=int(eos) if isinstance(eos, int) else None,
        add_bos=bool(add_bos) if add_bos is not None else None,
        add_eos=bool(add_eos) if add_eos is not None else None,
        vocab_digest=hashlib.sha256("\x00".join(tokens).encode()).hexdigest()[:16],
        tokens=tokens,
        fim=has_fim(meta, tokens),
    )


# the token texts llama.cpp takes for fill-in-the-middle where the metadata names none
_FIM_TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "\u2581<PRE>",
            "<|fim\u2581begin|>", "<\uff5cfim\u2581begin\uff5c>", "<|code_prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "\u2581<SUF>",
            "<|fim\u2581hole|>", "<\uff5cfim\u2581hole\uff5c>", "<|code_suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "\u2581<MID>",
            "<|fim\u2581end|>", "<\uff5cfim\u2581end\uff5c>", "<|code_middle|>"),
}  # fmt: skip


def has_fim(meta: dict[str, Any], tokens: tuple[str, ...]) -> bool:
    """Whether a model has a prefix, a suffix and a middle token, named in its metadata or
    found in its vocabulary as llama.cpp finds them (it refuses ``/infill`` without them).

    >>> has_fim({}, ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")), has_fim({}, ("a",))
    (True, False)
    """
    if all(f"tokenizer.ggml.fim_{k}_token_id" in meta for k in _FIM_TEXTS):
        return True
    vocabulary = set(tokens)
    return all(not vocabulary.isdisjoint(texts) for texts in _FIM_TEXTS.values())


@dataclass(frozen=True, slots=True)
class DraftCompatibility:
    compatible: bool
    problems: tuple[str, ...]

    def explain(self) -> str:
        if self.compatible:
            return "draft and target vocabularies are compatible"
        return (
            "draft is NOT compatible with the target: "
            + "; ".join(self.problems)
            + ". llama-server refuses such a draft; pick one from the target's model family "
            "(same tokenizer and vocabulary)."
        )


def draft_compatibility(target: ModelFacts, draft: ModelFacts) -> DraftCompatibility:
    """llama.cpp's rule (common_speculative_are_compatible) for a draft model's vocabulary."""
    problems: list[str] = []
    if target.tokenizer_model != draft.tokenizer_model:
        problems.append(f"tokenizer type {draft.tokenizer_model!r} != {target.tokenizer_model!r}")
    for name, adds, ids in (
        ("BOS", (target.add_bos, draft.add_bos), (target.bos_id, draft.bos_id)),
        ("EOS", (target.add_eos, draft.add_eos), (target.eos_id, draft.eos_id)),
    ):
        # ids matter only where the token is added; a flag the file leaves out counts as set
        if adds[0] != adds[1]:
            verb = {True: "adds", False: "omits", None: "adds"}
            problems.append(
                f"the draft {verb[adds[1]]} the {name} token, the target {verb[adds[0]]} it"
            )
        elif adds[0] is not False and ids[0] != ids[1]:
            problems.append(f"{name} token {ids[1]} differs from the target's {ids[0]}")
    diff = abs(target.vocab_size - draft.vocab_size)
    if diff > _VOCAB_MAX_DIFF:
        problems.append(
            f"vocabulary sizes {draft.vocab_size} and {target.vocab_size} differ by {diff} "
            f"(more than {_VOCAB_MAX_DIFF})"
        )
    else:
        shared = min(target.vocab_size, draft.vocab_size)
        for i in range(_VOCAB_CHECK_FROM, shared):
            if target.tokens[i] != draft.tokens[i]:
                problems.append(
                    f"token {i} is {draft.tokens[i]!r} in the draft, "
                    f"{target.tokens[i]!r} in the target"
                )
                break
    return DraftCompatibility(not problems, tuple(problems))
