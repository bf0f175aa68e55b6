"""Verify cost and MTP drafting on the hybrid recurrent MoE, next to its attention-only twin.

Writes (once, into the cache) the synthetic ``qwen35moe`` hybrid (``tuner synth-moe --arch
qwen35moe --mtp-layers 1``: three gated-DeltaNet layers to one attention layer, routed and
shared experts, one MTP block) at the chosen scale, and its ``qwen3moe`` twin (the same
width, heads and routed experts, every layer attending). For each, with no speculation: one
decode step and ``T(n)``, the time to check n new tokens on a cached prefix relative to one
step (``tuner calibrate``'s method).

Then ``draft-mtp`` on the hybrid at forced acceptance (``--spec-synth-rates``: position i
accepted with probability alpha^(i+1); the output is noise, the acceptance is what we set):
measured decode speedup over no speculation, next to three predictions: the tuner's speedup
model from the GGUF facts alone (MoE verify growth, recurrent restore and replay; drafting
from the MTP head counted free), the same model with the measured ``T(n)``, and plain
Leviathan on the measured ``T(n)``. At alpha = 1 nothing is rejected, so the gap there is the
MTP head's own cost; how the gap grows as alpha falls is the cost of a rejected draft.

Scales: ``tiny`` (seconds on a CPU) and ``a3b``, the shape of Qwen3.6-35B-A3B at its full
depth (40 trunk layers, 30 recurrent and 10 attending, plus its MTP block; hidden 2048,
experts of 512 with 8 routed and a shared one, 16 query heads of 256 over 2 KV heads, gated
DeltaNet with 16 key and 32 value heads of 128), F16, with 64 routed experts per layer instead
of 256 to keep the file at about 21 GB: n tokens touch nearly as many distinct experts of 64
as of 256 for the n <= 4 an MTP round checks (26.5 against 30.6 at n = 4), and the full depth
keeps the MTP block's share of a step (one layer plus the output head) what it is in the real
model, which a shallow copy would not.

Usage: python benchmarks/hybrid_verify.py [--scale tiny|a3b] [--repeats 3] [--out F.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import emit  # noqa: E402
from benchmarks.moe_verify import _tok_s  # noqa: E402
from tuner.calibrate import decode_step_ms, temporary_server, verify_curve  # noqa: E402
from tuner.model.envelope import cost_model_from_facts  # noqa: E402
from tuner.model.gguf_facts import read_facts  # noqa: E402
from tuner.model.speedup import CostModel, interpolated_curve, speedup  # noqa: E402
from tuner.settings import load_settings  # noqa: E402
from tuner.synthetic.hybrid import HybridShape, write_qwen35moe  # noqa: E402
from tuner.synthetic.moe import SynthSpec, write_moe  # noqa: E402
from tuner.upstream.launch import prepare  # noqa: E402
from tuner.upstream.provision import default_vocab  # noqa: E402

TINY = SynthSpec(
    experts=16, active=4, layers=4, hidden=256, expert_ffn=128, heads=4, kv_heads=2, head_dim=64
)
A3B = SynthSpec(
    experts=64, active=8, layers=40, hidden=2048, expert_ffn=512, heads=16, kv_heads=2, head_dim=256
)
SCALES = {
    "tiny": (TINY, HybridShape(state_size=32, key_heads=2, value_heads=4, shared_ffn=128)),
    "a3b": (A3B, HybridShape(state_size=128, key_heads=16, value_heads=32, shared_ffn=512)),
}
# a3b with 16 routed experts per layer (8 GB): eight instances fit one H100 at once, as the
# tuner bench's static arms and daemon need (device/hybrid_tuner_check.sh)
SCALES["a3b16"] = (replace(A3B, experts=16), SCALES["a3b"][1])
NS = (1, 2, 3, 4, 6, 8, 12, 16)
# (alpha, draft length): all accepted, then ever more rejected
MTP_CASES = [(1.0, 1), (1.0, 3), (0.8, 1), (0.8, 3), (0.5, 1), (0.5, 3), (0.2, 3)]


def model_file(cache: Path, scale: str, name: str) -> Path:
    """The hybrid or its twin at this scale, written into the cache once."""
    spec, shape = SCALES[scale]
    path = cache / "synth" / f"synth-qwen35moe-{scale}-{name}.gguf"
    if not path.is_file():
        print(f"writing {path}", file=sys.stderr, flush=True)
        vocab = default_vocab(cache, "qwen35")
        if name == "hybrid":
            write_qwen35moe(path, vocab, spec, shape)
        else:
            write_moe(path, vocab, spec)
    return path


async def _plain(run: Any, path: Path, name: str, repeats: int) -> dict[str, Any]:
    """Decode step, ``T(n)`` and decode speed without speculation."""
    print(f"measuring {name}", file=sys.stderr, flush=True)
    async with run(path, ["--spec-type", "none"], name) as client:
        step = await decode_step_ms(client, repeats)
        raw = await verify_curve(client, NS, repeats)
        base = (await _tok_s(client))["tok_s"]
    facts = read_facts(path)
    model = cost_model_from_facts(facts)
    return {
        "file": path.name,
        "bytes": facts.total_bytes,
        "recurrent_layers": facts.recurrent_layers,
        "state_ratio": round(facts.state_ratio, 4),
        "decode_ms": round(step, 3),
        "tok_s": base,
        "verify_measured": [(n, round(ms / step, 3)) for n, ms in raw],
        "verify_predicted": [(n, round(model.verify(n), 3)) for n, _ in raw],
    }


async def measure(scale: str, repeats: int, twin: bool, out: Path | None) -> dict[str, Any]:
    """The hybrid first (plain, then MTP at forced acceptance), its twin last; each stage's
    figures are written to ``out`` as soon as they are measured, so a run cut short by a time
    limit still leaves what it measured."""
    settings = load_settings()
    prepared = prepare(settings)
    run = partial(temporary_server, prepared.binary, settings, prepared.capabilities)
    result: dict[str, Any] = {"scale": scale, "spec": repr(SCALES[scale]), "targets": {}}
    hybrid = model_file(settings.cache_dir, scale, "hybrid")
    plain = result["targets"]["hybrid"] = await _plain(run, hybrid, "hybrid", repeats)
    emit(result, out, quiet=True)
    model = cost_model_from_facts(read_facts(hybrid))
    curve = interpolated_curve([(n, t) for n, t in plain["verify_measured"]])
    measured_model, leviathan = replace(model, verify=curve), CostModel(verify=curve)
    rows = result["mtp_forced_acceptance"] = []
    for alpha, gamma in MTP_CASES:
        rates = ",".join(f"{alpha ** (i + 1):.4f}" for i in range(gamma))
        flags = [
            "--spec-type",
            "draft-mtp",
            "--spec-draft-n-max",
            str(gamma),
            "--spec-draft-p-min",
            "0",
            "--spec-synth-rates",
            rates,
        ]
        async with run(hybrid, flags, "hybrid-mtp") as client:
            got = await _tok_s(client)
        rows.append(
            {
                "alpha": alpha,
                "gamma": gamma,
                "alpha_measured": round(got["accepted"] / max(got["drafted"], 1), 3),
                "speedup_measured": round(got["tok_s"] / plain["tok_s"], 3),
                "predicted_model": round(speedup(alpha, gamma, model), 3),
                "predicted_model_measured_curve": round(speedup(alpha, gamma, measured_model), 3),
                "predicted_leviathan_measured_curve": round(speedup(alpha, gamma, leviathan), 3),
            }
        )
        print(f"mtp alpha={alpha} gamma={gamma}: {rows[-1]}", file=sys.stderr, flush=True)
        emit(result, out, quiet=True)
    if twin:
        path = model_file(settings.cache_dir, scale, "twin")
        result["targets"]["twin"] = await _plain(run, path, "twin", repeats)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="tiny")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-twin", action="store_true", help="the hybrid only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    emit(asyncio.run(measure(args.scale, args.repeats, not args.no_twin, args.out)), args.out)


if __name__ == "__main__":
    main()
