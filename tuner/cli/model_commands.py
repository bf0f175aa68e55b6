"""``tuner synth-moe`` and ``tuner derive-draft``: the model files experiments run on.

Random-weight targets show costs at any shape; a draft cut from the real target shows
``draft-simple`` with real acceptance where no second real model is at hand offline.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.cli.commands import settings_from_args
from tuner.errors import ConfigError

__all__ = ["add_model_commands", "cmd_derive_draft", "cmd_synth"]


def add_model_commands(sub: Any, positive: Callable[[str], int]) -> None:
    """Register both commands on ``sub`` (argparse's subparsers action)."""
    synth = sub.add_parser("synth-moe", help="write a random-weight small-active MoE GGUF")
    synth.add_argument("out", help="the GGUF file to write")
    synth.add_argument("--experts", type=positive, default=128, help="routed experts per layer")
    synth.add_argument("--active", type=positive, default=8, help="experts routed per token")
    synth.add_argument("--layers", type=positive, default=8, help="transformer blocks (8)")
    synth.add_argument("--hidden", type=positive, default=512, help="embedding width")
    synth.add_argument(
        "--expert-ffn", type=positive, default=512, dest="expert_ffn", help="one expert's FFN width"
    )
    synth.add_argument(
        "--dense",
        action="store_true",
        help="the dense twin: one FFN as wide as the active experts together",
    )
    synth.add_argument(
        "--arch",
        choices=["qwen3moe", "qwen35moe"],
        default="qwen3moe",
        help="qwen35moe: the hybrid (recurrent and attention layers, a shared expert)",
    )
    synth.add_argument(
        "--mtp-layers",
        type=int,
        choices=[0, 1],
        default=0,
        dest="mtp_layers",
        help="MTP (next-n) blocks after the trunk, for --spec-type draft-mtp (qwen35moe)",
    )
    synth.add_argument(
        "--attention-only",
        action="store_true",
        dest="attention_only",
        help="the hybrid's twin: the same layers and routed experts, every layer attending "
        "(written as qwen3moe: this llama.cpp runs no qwen35moe without recurrent layers)",
    )
    synth.add_argument(
        "--vocab", help="tokenizer GGUF (default: llama.cpp's llama-spm, or qwen35 for qwen35moe)"
    )
    synth.add_argument("--seed", type=int, default=0, help="seed of the random weights (0)")
    synth.set_defaults(func=cmd_synth)

    derive = sub.add_parser(
        "derive-draft", help="write a same-vocabulary draft: some of a model's own blocks"
    )
    derive.add_argument("out", help="the draft GGUF to write")
    derive.add_argument("--model", help="the target GGUF to cut (default: the configured model)")
    derive.add_argument(
        "--layers",
        required=True,
        help="blocks to keep, in order, as N-M,N,... (e.g. 0-3,16,17: the first four and last two)",
    )
    derive.add_argument(
        "--embedding",
        choices=["q4_0", "q8_0"],
        help="store the token embedding (the tied output head) at this type",
    )
    derive.set_defaults(func=cmd_derive_draft)


def cmd_synth(args: argparse.Namespace) -> int:
    """Write a random-weight small-active MoE GGUF (its dense twin, or the hybrid recurrent
    ``qwen35moe`` with MTP blocks) for experiments."""
    from tuner.synthetic.hybrid import HybridShape, write_qwen35moe
    from tuner.synthetic.moe import SynthSpec, write_moe
    from tuner.upstream.provision import default_vocab

    hybrid = args.arch == "qwen35moe"
    if not hybrid and (args.mtp_layers or args.attention_only):
        raise ConfigError("--mtp-layers and --attention-only need --arch qwen35moe")
    if args.attention_only and args.mtp_layers:
        raise ConfigError("the attention-only twin has no MTP block (drop --mtp-layers)")
    if hybrid and args.dense:
        raise ConfigError("--dense is for qwen3moe; the hybrid's twin is --attention-only")
    try:
        spec = SynthSpec(
            experts=args.experts,
            active=args.active,
            layers=args.layers,
            hidden=args.hidden,
            expert_ffn=args.expert_ffn,
            seed=args.seed,
        )
        shape = HybridShape(mtp_layers=args.mtp_layers)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    vocab = Path(args.vocab) if args.vocab else None
    if vocab is None:
        cache = settings_from_args(args).cache_dir
        vocab = default_vocab(cache, "qwen35" if hybrid else "llama-spm")
    if hybrid and not args.attention_only:
        path = write_qwen35moe(Path(args.out), vocab, spec, shape)
    else:  # this build cannot run a qwen35moe without recurrent layers: the twin is qwen3moe
        path = write_moe(Path(args.out), vocab, spec, dense=args.dense)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB)")
    return 0


def cmd_derive_draft(args: argparse.Namespace) -> int:
    """Cut a draft for ``draft-simple`` from the target's own file."""
    from tuner.model.gguf_facts import read_facts
    from tuner.synthetic.draft import derive_draft, parse_layers
    from tuner.upstream.launch import resolve_model

    source, _ = resolve_model(settings_from_args(args))  # --model, else configured or default
    try:
        layers = parse_layers(args.layers, read_facts(source).n_layers)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        draft = derive_draft(source, Path(args.out), layers, args.embedding)
    except OSError as exc:
        raise ConfigError(f"cannot write {args.out}: {exc.strerror or exc}") from exc
    share = draft.bytes / draft.source_bytes
    print(
        f"wrote {draft.path}: {len(draft.layers)} of {draft.source_layers} blocks "
        f"({','.join(map(str, draft.layers))}), {draft.bytes / 2**20:.0f} MiB of weights "
        f"({share:.0%} of the target's)"
    )
    return 0
