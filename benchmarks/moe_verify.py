"""How verify cost grows with draft length on a small-active MoE, next to its dense twin.

Writes (once, into the cache) the synthetic ``qwen3moe`` target (``tuner synth-moe``
defaults: 128 experts, 8 routed, 8 layers, hidden 512) and its dense twin (one FFN as
wide as the 8 active experts: the same active weights per token). For each, with no
speculation: one decode step, and ``T(n)``, the time to process n new tokens on a
cached prefix relative to one decode step (``tuner calibrate``'s method). Then the
speedup model's MoE curve for the same file (from its GGUF facts alone), and what the
measured curves mean: predicted speedups of n-gram drafting (cost ~0) at a few
acceptances and draft lengths, dense versus MoE.

Then speculation at a *known* acceptance: a tiny random dense draft (same tokenizer) drafts
``gamma`` tokens every step (``draft-simple``, n-min = n-max) and llama-server's
benchmarking switch ``--spec-synth-rates`` accepts position i with probability alpha^(i+1)
(output is not valid text; acceptance is what we set). Measured decode speedup over no
speculation on both targets, next to Leviathan with the measured curve and the measured
draft cost c (draft step / target step).

Usage: python benchmarks/moe_verify.py [--repeats 3] [--out F.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import emit  # noqa: E402
from tuner.calibrate import decode_step_ms, post_json, temporary_server, verify_curve  # noqa: E402
from tuner.model.envelope import cost_model_from_facts  # noqa: E402
from tuner.model.gguf_facts import read_facts  # noqa: E402
from tuner.model.speedup import CostModel, interpolated_curve, speedup  # noqa: E402
from tuner.settings import load_settings  # noqa: E402
from tuner.synthetic.moe import SynthSpec, write_moe  # noqa: E402
from tuner.upstream.launch import prepare  # noqa: E402
from tuner.upstream.provision import default_vocab  # noqa: E402

NS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)
CASES = [(0.5, 4), (0.7, 4), (0.7, 8), (0.8, 4), (0.8, 8), (0.9, 8), (0.9, 16)]


SYNTH_CASES = [(0.6, 2), (0.6, 4), (0.8, 2), (0.8, 4), (0.8, 8), (0.95, 8)]
DRAFT = SynthSpec(
    experts=2, active=1, layers=2, hidden=256, expert_ffn=512, heads=4, kv_heads=2, head_dim=64
)


async def _tok_s(client: Any, n: int = 128) -> dict[str, float]:
    out = []
    for seed in (1, 2):
        body = {
            "prompt": f"{seed}. Once upon a time",
            "n_predict": n,
            "ignore_eos": True,
            "temperature": 0,
            "cache_prompt": False,
        }
        out.append((await post_json(client, "/completion", body))["timings"])
    tokens = sum(t["predicted_n"] for t in out)
    return {
        "tok_s": round(1000 * tokens / sum(t["predicted_ms"] for t in out), 2),
        "drafted": sum(t.get("draft_n", 0) for t in out),
        "accepted": sum(t.get("draft_n_accepted", 0) for t in out),
    }


async def synthetic_acceptance(
    settings: Any, prepared: Any, targets: dict[str, Path], curves: dict[str, Any]
) -> dict[str, Any]:
    draft = settings.cache_dir / "synth" / "synth-draft-tiny.gguf"
    if not draft.is_file():
        write_moe(draft, default_vocab(settings.cache_dir), DRAFT, dense=True)
    caps = prepared.capabilities
    run = partial(temporary_server, prepared.binary, settings, caps)
    async with run(draft, ["--spec-type", "none"], "draft") as client:
        draft_tok_s = (await _tok_s(client))["tok_s"]
    out: dict[str, Any] = {"draft_tok_s": draft_tok_s, "targets": {}}
    for name, path in targets.items():
        async with run(path, ["--spec-type", "none"], f"{name}-none") as client:
            base = (await _tok_s(client))["tok_s"]
        c = base / draft_tok_s
        rows = []
        for alpha, gamma in SYNTH_CASES:
            rates = ",".join(f"{alpha ** (i + 1):.4f}" for i in range(gamma))
            flags = [
                "--spec-type",
                "draft-simple",
                "-md",
                str(draft),
                "--spec-draft-n-max",
                str(gamma),
                "--spec-draft-n-min",
                str(gamma),
                "--spec-draft-p-min",
                "0",
                "--spec-synth-rates",
                rates,
            ]
            async with run(path, flags, f"{name}-synth") as client:
                got = await _tok_s(client)
            cost = CostModel(draft_step=c, verify=curves[name])
            rows.append(
                {
                    "alpha": alpha,
                    "gamma": gamma,
                    "alpha_measured": round(got["accepted"] / got["drafted"], 3)
                    if got["drafted"]
                    else None,
                    "speedup_measured": round(got["tok_s"] / base, 3),
                    "speedup_predicted": round(speedup(alpha, gamma, cost), 3),
                }
            )
            print(f"{name} alpha={alpha} gamma={gamma}: {rows[-1]}", file=sys.stderr, flush=True)
        out["targets"][name] = {"base_tok_s": base, "c": round(c, 3), "cases": rows}
    return out


def models(cache: Path) -> dict[str, Path]:
    vocab = default_vocab(cache)
    out = {}
    for name, dense in (("moe", False), ("dense", True)):
        path = cache / "synth" / f"synth-{name}-e128-k8.gguf"
        if not path.is_file():
            print(f"writing {path}", file=sys.stderr, flush=True)
            write_moe(path, vocab, SynthSpec(), dense=dense)
        out[name] = path
    return out


async def measure(repeats: int) -> dict[str, Any]:
    settings = load_settings()
    prepared = prepare(settings)
    result: dict[str, Any] = {"spec": repr(SynthSpec()), "targets": {}}
    curves = {}
    targets = models(settings.cache_dir)
    for name, path in targets.items():
        print(f"measuring {name}", file=sys.stderr, flush=True)
        flags = ["--spec-type", "none"]
        caps = prepared.capabilities
        async with temporary_server(prepared.binary, settings, caps, path, flags, name) as client:
            step = await decode_step_ms(client, repeats)
            raw = await verify_curve(client, NS, repeats)
        curve = [(n, round(ms / step, 3)) for n, ms in raw]
        curves[name] = interpolated_curve(curve)
        facts = read_facts(path)
        entry: dict[str, Any] = {
            "file": path.name,
            "decode_ms": round(step, 3),
            "tok_s": round(1000 / step, 1),
            "verify_measured": curve,
        }
        if facts.is_moe:
            model = cost_model_from_facts(facts)
            entry["routed_expert_share"] = round(facts.expert_fraction, 3)
            entry["verify_predicted"] = [(n, round(model.verify(n), 3)) for n, _ in curve]
        result["targets"][name] = entry
    moe_cost = cost_model_from_facts(read_facts(targets["moe"]))
    predicted = []
    for alpha, gamma in CASES:
        row: dict[str, Any] = {"alpha": alpha, "gamma": gamma}
        for name, verify in curves.items():
            row[name] = round(speedup(alpha, gamma, CostModel(verify=verify)), 3)
        row["moe_model_from_facts"] = round(speedup(alpha, gamma, moe_cost), 3)
        predicted.append(row)
    result["predicted_speedup_ngram"] = predicted
    result["synthetic_acceptance"] = await synthetic_acceptance(settings, prepared, targets, curves)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = asyncio.run(measure(args.repeats))
    emit(result, args.out)


if __name__ == "__main__":
    main()
