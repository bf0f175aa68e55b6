"""Render model facts, predictions and envelopes as text or JSON-ready dicts. Pure."""

from __future__ import annotations

from typing import Any

from tuner.model.envelope import Envelope
from tuner.model.gguf_facts import ModelFacts
from tuner.model.speedup import CostModel, speedup, verdict
from tuner.profiles import Profile
from tuner.tables import text_table

__all__ = ["envelope_text", "facts_dict", "facts_text", "gamma_table", "profile_text"]


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def facts_dict(facts: ModelFacts) -> dict[str, Any]:
    return {
        "path": facts.path,
        "architecture": facts.architecture,
        "name": facts.name,
        "layers": facts.n_layers,
        "params": facts.total_params,
        "bytes": facts.total_bytes,
        "bytes_per_token": facts.bytes_per_token,
        "active_fraction": round(facts.active_fraction, 4),
        "experts": facts.expert_count,
        "experts_used": facts.expert_used,
        "experts_shared": facts.expert_shared,
        "expert_fraction": round(facts.expert_fraction, 4),
        "recurrent_layers": facts.recurrent_layers,
        "recurrent_state_bytes": facts.recurrent_state_bytes,
        "mtp_layers": facts.nextn_layers,
        "vocab_size": facts.vocab_size,
        "tokenizer": facts.tokenizer_model,
        "tied_output": facts.tied_output,
    }


def facts_text(facts: ModelFacts) -> str:
    kind = "dense"
    if facts.is_moe:
        kind = f"MoE, {facts.expert_used} of {facts.expert_count} experts routed"
        if facts.expert_shared:
            kind += f" + {facts.expert_shared} shared"
    if facts.is_hybrid_recurrent:
        kind += f", hybrid: {facts.recurrent_layers} recurrent layers"
    rows = [
        ("model", f"{facts.name or '?'} ({facts.architecture}), {kind}"),
        ("size", f"{facts.total_params / 1e6:,.0f} M params, {_mib(facts.total_bytes)}"),
        ("read per token", f"{_mib(facts.bytes_per_token)} ({facts.active_fraction:.1%} of all)"),
        ("layers", str(facts.n_layers)),
        ("vocabulary", f"{facts.vocab_size} tokens ({facts.tokenizer_model})"),
    ]
    if facts.is_moe:
        rows.append(("routed-expert share", f"{facts.expert_fraction:.1%} of bytes per token"))
    if facts.is_hybrid_recurrent:
        rows.append(("recurrent state", f"{_mib(facts.recurrent_state_bytes)} per sequence"))
    if facts.nextn_layers:
        rows.append(("MTP heads", f"{facts.nextn_layers} (draft-mtp may apply)"))
    if facts.tied_output:
        rows.append(("output head", "tied to token embeddings (read in full every token)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def envelope_text(env: Envelope) -> str:
    headers = ["alpha \\ gamma", *[str(g) for g in env.gammas]]
    rows = [[f"{a:.2f}", *row] for a, row in zip(env.alphas, env.table, strict=True)]
    text = text_table(headers, rows)
    if env.break_even is None:
        return text + "\nspeculation cannot pay at any acceptance for this target"
    return text + f"\nbreak-even acceptance at the best draft length: {env.break_even:.2f}"


def gamma_table(alpha: float, cost: CostModel, gamma_max: int = 8) -> str:
    """Speedup over gamma for one acceptance, best marked, with the verdict."""
    best = verdict(alpha, cost, gamma_max)
    rows = []
    for g in range(1, gamma_max + 1):
        s = speedup(alpha, g, cost)
        rows.append([g, s, "best" if best.pays and g == best.gamma else ""])
    return text_table(["gamma", "speedup", "note"], rows) + "\n" + best.reason


def profile_text(profile: Profile) -> str:
    """The measured curve at a few points, and predicted versus measured per variant."""
    picks = {1, 2, 3, 4, 5, 8, 16, 32, 64}
    curve = text_table(
        ["n", "T(n) / decode step"], [[n, t] for n, t in profile.verify_curve if n in picks]
    )
    rows = [
        [
            c.variant,
            c.alpha,
            c.mean_draft,
            c.rounds,
            c.measured_speedup,
            c.predicted_speedup,
            c.predicted_speedup / c.measured_speedup
            if c.predicted_speedup and c.measured_speedup
            else None,
        ]
        for c in profile.checks
    ]
    checks = text_table(
        ["variant", "alpha", "draft/round", "rounds", "measured", "predicted", "pred/meas"], rows
    )
    head = (
        f"model {profile.model_name} on {profile.hardware.get('cpu')} "
        f"({profile.hardware.get('cores')} cores), build {profile.build}\n"
        f"decode step {profile.decode_ms:.2f} ms"
    )
    if profile.draft_cost is not None:
        head += f", draft step / target step c = {profile.draft_cost:.3f}"
    return f"{head}\n\nverify cost (prompt processing on a cached prefix):\n{curve}\n\n{checks}"
