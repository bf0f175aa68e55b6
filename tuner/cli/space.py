"""The search space as ``tuner variants`` shows it, before anything runs.

Each variant the daemon would search on this build, target and draft, with the speedup
the prior predicts for it on each kind of class (echo or fresh text, greedy or sampled);
and each spec type left out, with why: not in the tuning file, forbidden for every class,
not in this build, no draft model, or no MTP layers in the target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tuner.daemon.plan import (
    default_cost,
    draft_kind,
    machine_profile,
    search_variants,
    tuning_config,
)
from tuner.model.gguf_facts import ModelFacts
from tuner.model.speedup import CostModel
from tuner.settings import Settings
from tuner.tables import text_table
from tuner.tuning.config import TuningConfig
from tuner.tuning.policy.prior import rank
from tuner.tuning.variants import PARAMS, Variant, unavailable
from tuner.upstream.capabilities import Capabilities

__all__ = ["KINDS", "SpaceView", "as_json", "as_table", "show_space", "space_view"]

# a kind of class -> a class key the prior reads it from (only echo and sampled matter)
KINDS = {
    "echo greedy": "any/echo/greedy",
    "echo sampled": "any/echo/sampled",
    "fresh greedy": "any/fresh/greedy",
    "fresh sampled": "any/fresh/sampled",
}


@dataclass(frozen=True, slots=True)
class SpaceView:
    model: str
    mtp_layers: int
    draft: str | None
    variants: tuple[tuple[Variant, dict[str, float]], ...]  # predicted speedup per kind
    absent: dict[str, str]  # spec type -> why it is not searched


def space_view(
    config: TuningConfig,
    caps: Capabilities,
    variants: list[Variant],
    facts: ModelFacts,
    draft: ModelFacts | None,
    cost: CostModel,
) -> SpaceView:
    """What ``variants`` (the daemon's search) holds and lacks, with the prior's predictions."""
    views = {
        kind: rank(key, variants, config.prior, cost, cost.draft_step)
        for kind, key in KINDS.items()
    }
    rows = tuple(
        (v, {kind: round(view.predicted(v.name) or 0.0, 3) for kind, view in views.items()})
        for v in variants
        if v.speculative
    )
    searched = {v.spec_type for v in variants}
    forbidden = set(config.override_for("all").forbid)
    kind = draft_kind(draft)
    absent: dict[str, str] = {}
    for spec_type in PARAMS:
        if spec_type == "none" or spec_type in searched:
            continue
        if spec_type not in config.search:
            absent[spec_type] = "not in the tuning file's search"
        elif spec_type in forbidden:
            absent[spec_type] = "forbidden for every class ([overrides.all])"
        else:
            why = unavailable(spec_type, caps, draft=kind, mtp_layers=facts.nextn_layers)
            absent[spec_type] = why or "not searched"
    return SpaceView(
        facts.name or facts.architecture,
        facts.nextn_layers,
        None if draft is None else draft.path,
        rows,
        absent,
    )


def as_json(view: SpaceView) -> str:
    document = {
        "model": view.model,
        "mtp_layers": view.mtp_layers,
        "draft": view.draft,
        "variants": [
            {
                "name": v.name,
                "spec_type": v.spec_type,
                "params": dict(v.params),
                "draft_length": v.draft_length,
                "predicted": predicted,
            }
            for v, predicted in view.variants
        ],
        "absent": view.absent,
    }
    return json.dumps(document, indent=2) + "\n"


def as_table(view: SpaceView) -> str:
    head = f"{view.model}: {len(view.variants)} speculative variants besides none"
    head += f" (MTP layers: {view.mtp_layers}; draft: {view.draft or 'none'})\n"
    head += (
        "predicted speedup from the prior, before any request is measured: it assumes an "
        "acceptance per kind of text (the tuning file's [prior]) and orders the first "
        "trials; measurements replace it from the first requests, and on fresh text they "
        "usually read lower, often no gain at all\n\n"
    )
    rows = [[v.name, *(predicted[k] for k in KINDS)] for v, predicted in view.variants]
    body = text_table(["variant", *KINDS], rows) + "\n"
    gone = "".join(f"  {t}: {why}\n" for t, why in view.absent.items())
    return head + body + ("\nnot searched:\n" + gone if gone else "")


def show_space(settings: Settings, fmt: str = "table") -> str:
    """``tuner variants``: the configured model, draft and tuning file on this machine's
    llama-server (a draft that cannot pair with the target is refused, as at start)."""
    from tuner.model.gguf_facts import read_facts
    from tuner.profiles import fingerprint_key, hardware_fingerprint
    from tuner.upstream.launch import prepare

    config = tuning_config(settings)  # a bad tuning file is refused before the build
    prepared = prepare(settings)
    facts = read_facts(prepared.model)
    draft = read_facts(prepared.draft) if prepared.draft else None
    profile = machine_profile(facts, settings, fingerprint_key(hardware_fingerprint()))
    caps = prepared.capabilities
    variants = search_variants(config, caps, draft_kind(draft), facts.nextn_layers)
    cost = default_cost(facts, draft, profile)
    view = space_view(config, caps, variants, facts, draft, cost)
    return as_json(view) if fmt == "json" else as_table(view)
