"""Decide how the daemon tunes on this build and machine, and build the engine for it.

- Router mode (mainline builds): one preset per variant of the search space in a
  generated presets file; llama-server loads a preset on first use and keeps at
  most ``models_max`` loaded (least recently used goes), sized from free memory.
- Pool mode (engines without a router: ik_llama.cpp, mainline builds from before
  ``--spec-type`` with a draft model): the daemon's own pool runs one instance per
  set of launch flags, as many at once as the router would; where the engine honours
  per-request draft settings (probed), variants that differ only in them share one.
- Otherwise tuning is off and the daemon proxies a single instance (logged).
"""

from __future__ import annotations

import functools
import hashlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tuner.atomic import write_atomic
from tuner.classify.classes import load_definitions
from tuner.daemon.capacity import context_size, instances_that_fit
from tuner.extras import require
from tuner.logs import get_logger
from tuner.model.envelope import cost_model_from_facts
from tuner.model.gguf_facts import ModelFacts, draft_type, read_facts
from tuner.model.speedup import CostModel
from tuner.profiles import (
    Profile,
    fingerprint_key,
    hardware_fingerprint,
    load_profile,
    model_key,
    profile_dirs,
)
from tuner.settings import Settings
from tuner.tuning.config import TuningConfig, check_overrides, load_tuning
from tuner.tuning.pricing.prices import prior_cost
from tuner.tuning.runtime.engine import Engine
from tuner.tuning.runtime.policy_file import PolicyMeta, study_scope
from tuner.tuning.runtime.service import EngineFactory
from tuner.tuning.search.studies import StudyBook
from tuner.tuning.variants import (
    Variant,
    grid,
    parse_name,
    presets_ini,
    request_fields,
    unavailable,
)
from tuner.upstream.capabilities import Capabilities
from tuner.upstream.launch import Prepared, instance_argv, model_alias, serving_flags
from tuner.upstream.pool import Member
from tuner.upstream.probe import honours_request_fields

if TYPE_CHECKING:  # psycopg is the [fleet] extra: imported only for a fleet
    from tuner.fleet.sync import FleetSync

__all__ = [
    "TuningPlan",
    "default_cost",
    "draft_kind",
    "machine_profile",
    "plan_tuning",
    "pool_members",
    "search_variants",
    "shared_flags",
    "tuning_config",
    "write_presets",
]

log = get_logger(__name__)

# Reloading a model: reading its file again plus a fixed start-up, until measured.
RELOAD_BYTES_PER_S = 2 * 2**30
RELOAD_FIXED_S = 1.0

# Without a calibration profile, a dense target's verify pass of n tokens is assumed to cost
# 1 + 0.1 (n - 1) decode steps (``tuner calibrate`` measures the machine's own).
DEFAULT_VERIFY_SLOPE = 0.1


Mode = Literal["router", "pool"]


@dataclass(frozen=True, slots=True)
class TuningPlan:
    mode: Mode
    build_engine: EngineFactory  # wired by the service that runs it
    meta: PolicyMeta
    presets: Path | None  # the router's presets file (None: a pool)
    capacity: int
    gpu: bool  # a CUDA build: instances share a GPU, not the CPU cores
    reload_guess_s: float  # loading the model again, until a reload is measured
    fleet: FleetSync | None = None  # evidence shared on the fleet's database
    members: tuple[Member, ...] = ()  # pool mode: what each variant runs on

    @property
    def single(self) -> bool:
        """Only one variant fits at a time: one serves all traffic (``tuning.runtime.single``)."""
        return self.capacity == 1


def sized(settings: Settings, prepared: Prepared, facts: ModelFacts | None = None) -> Settings:
    """The settings with ``ctx_size`` resolved for this model and machine where it is 0
    (``capacity.context_size``); ``facts``: the model's, where the caller has read them."""
    if settings.ctx_size:
        return settings
    facts = facts or read_facts(prepared.model)
    ctx = context_size(facts, 0, gpu=prepared.gpu, limit=settings.max_instances)
    log.info("context_size", ctx_size=ctx, trained=facts.context_length)
    return settings.model_copy(update={"ctx_size": ctx})


def shared_flags(settings: Settings, caps: Capabilities, model: Path) -> list[str]:
    """Flags every preset shares (the ``[*]`` section)."""
    return ["--model", str(model), *serving_flags(settings, caps), *settings.server_args]


def write_presets(
    folder: Path, variants: Sequence[Variant], settings: Settings, prepared: Prepared
) -> Path:
    """The router's presets file: the shared flags, then one section per variant (with
    ``TUNER_SPEC_ARGS`` in every speculative one). Named by its content, so a router
    being replaced keeps reading its own while the new one starts."""
    caps = prepared.capabilities
    text = presets_ini(
        variants,
        caps,
        shared=shared_flags(settings, caps, prepared.model),
        draft_model=prepared.draft,
        speculative=settings.spec_args,
    )
    path = folder / f"presets-{hashlib.sha256(text.encode()).hexdigest()[:12]}.ini"
    write_atomic(path, text)
    return path


def machine_profile(facts: ModelFacts, settings: Settings, hardware_key: str) -> Profile | None:
    """The calibration profile of this model on this machine (``hardware_key``), if made."""
    return load_profile(profile_dirs(settings.state_dir), model_key(Path(facts.path)), hardware_key)


def default_cost(facts: ModelFacts, draft: ModelFacts | None, profile: Profile | None) -> CostModel:
    """The target's cost model: MoE and recurrent terms from its facts, verify curve from a
    calibration profile when one exists for this model and machine."""
    base = cost_model_from_facts(facts, draft)
    if facts.is_moe:
        return base
    verify = profile.verify if profile else (lambda n: 1.0 + DEFAULT_VERIFY_SLOPE * (n - 1))
    return replace(base, verify=verify)


def draft_kind(draft: ModelFacts | None) -> str | None:
    """The spec type the configured draft model serves; None without one."""
    return None if draft is None else draft_type(draft.architecture)


def search_variants(
    config: TuningConfig, caps: Capabilities, draft: str | None, mtp_layers: int
) -> list[Variant]:
    """The variants the daemon searches: the space this build, target and draft
    (``draft_kind``) can run, plus any pin outside it."""
    forbid = config.override_for("all").forbid
    variants = grid(config.search, caps, draft=draft, mtp_layers=mtp_layers, forbid=forbid)
    for override in config.overrides.values():
        if override.pin and override.pin not in {v.name for v in variants}:
            pinned = parse_name(override.pin)
            why = unavailable(pinned.spec_type, caps, draft=draft, mtp_layers=mtp_layers)
            if why is None:  # a pin outside the space still runs ...
                variants.append(pinned)
            else:  # ... where the build can run it at all
                log.warning("pin_unavailable", pin=override.pin, reason=why)
    return variants


# llama-server benchmarking flags that fix acceptance instead of checking the drafts
SYNTHETIC_ACCEPTANCE = ("--spec-synth-len", "--spec-synth-rates")


def tuning_config(settings: Settings) -> TuningConfig:
    """The tuning file, checked against the classes; replays off where ``spec_args``
    force acceptance."""
    config = load_tuning(settings.tuning_file)
    check_overrides(config, load_definitions(settings.classes_file))
    forced = [a for a in settings.spec_args if a.startswith(SYNTHETIC_ACCEPTANCE)]
    if forced and config.guard.replay:
        # the server accepts drafts at a forced rate whatever they say, so what a replay of
        # the answer's tokens would have accepted predicts nothing that variant will do
        log.warning("replay_off", reason="spec_args force acceptance", flags=forced)
        guard = config.guard.model_copy(update={"replay": False})
        config = config.model_copy(update={"guard": guard})
    return config


def plan_tuning(
    settings: Settings, prepared: Prepared, config: TuningConfig, facts: ModelFacts
) -> TuningPlan | None:
    """The tuning plan for this build (``facts``: its model's), or None when tuning is not
    possible (logged)."""
    caps, model, draft = prepared.capabilities, prepared.model, prepared.draft
    draft_facts = read_facts(draft) if draft else None
    kind = draft_kind(draft_facts)
    if caps.router and caps.has_flag("--spec-type"):
        mode: Mode = "router"
        variants = search_variants(config, caps, kind, facts.nextn_layers)
    elif caps.has_flag("--spec-type") or (caps.old_draft_flags and draft is not None):
        mode = "pool"
        variants = search_variants(config, caps, kind, facts.nextn_layers)
    else:
        log.warning(
            "tuning_off",
            reason="this llama-server has no --spec-type, and no draft model is configured "
            "for its draft flags",
        )
        return None
    fingerprint = hardware_fingerprint()  # NVML and /proc: read once for the profile and meta
    hardware_key = fingerprint_key(fingerprint)
    profile = machine_profile(facts, settings, hardware_key)
    cost = default_cost(facts, draft_facts, profile)
    meta: PolicyMeta = {
        "model": model_alias(settings, model),
        "model_key": model_key(model),
        "engine": caps.engine,
        "build": caps.commit,
        "hardware": fingerprint,
        "hardware_key": hardware_key,
        "variants": [v.name for v in variants],
    }
    gpu = prepared.gpu
    capacity = instances_that_fit(facts, settings.ctx_size, gpu=gpu, limit=settings.max_instances)
    presets = None
    if mode == "router":
        presets = write_presets(settings.state_dir / "router", variants, settings, prepared)
    members = pool_members(variants, settings, prepared) if mode == "pool" else ()
    scope = study_scope(meta)
    url = settings.storage_url
    fleet = None
    if url is None:
        studies = StudyBook(settings.state_dir / "studies.db", scope, seed=config.seed)
    else:  # one study per class for the fleet, of this build only
        scope = f"{meta['model_key']}@{meta['hardware_key']}@{caps.commit}"
        studies = StudyBook(url, scope, seed=config.seed)
        node = f"{socket.gethostname()}:{settings.state_dir.resolve()}"
        require("psycopg")
        from tuner.fleet.ledger import Ledger, redact
        from tuner.fleet.sync import FleetSync

        fleet = FleetSync(Ledger(url), scope, node)
        log.info("fleet_storage", url=redact(url), scope=scope, node=node)
    build = functools.partial(
        Engine,
        config,
        variants,
        studies,
        cost=cost,
        draft_step=cost.draft_step,
        publish=fleet.publish if fleet else None,
    )
    drafted_cost, drafted_cost_se = prior_cost(cost, cost.draft_step)
    log.info(
        "tuning_plan",
        mode=mode,
        variants=len(variants),
        loaded_at_once=capacity.instances,
        capacity=capacity.explain(),
        one_variant_at_a_time=capacity.instances == 1,
        pool_instances=len({m.flags for m in members}) if members else None,
        drafted_cost_prior=round(drafted_cost, 3),
        drafted_cost_prior_se=drafted_cost_se,
    )
    reload_guess = RELOAD_FIXED_S + facts.total_bytes / RELOAD_BYTES_PER_S
    return TuningPlan(
        mode, build, meta, presets, capacity.instances, gpu, reload_guess, fleet, members
    )


def pool_members(
    variants: Sequence[Variant],
    settings: Settings,
    prepared: Prepared,
    *,
    per_request: bool | None = None,
) -> tuple[Member, ...]:
    """What each variant runs on in the pool: its instance's launch flags and, where the
    engine honours them (``honours_request_fields``, asked when ``per_request`` is None),
    the draft settings each request adds, so that variants differing only in those share
    one instance (and its prompt cache)."""
    caps, draft = prepared.capabilities, prepared.draft
    if per_request is None:
        per_request = caps.has_flag("--spec-type") and _probe_fields(settings, prepared)
    members = []
    for variant in variants:
        flags = variant.flags(caps, draft, per_request=per_request)
        if variant.speculative:
            flags += settings.spec_args
        fields = request_fields(variant) if per_request and variant.speculative else {}
        members.append(Member(variant.name, tuple(flags), fields))
    return tuple(members)


def _probe_fields(settings: Settings, prepared: Prepared) -> bool:
    """Ask the binary (once per binary, kept in the state folder) with an n-gram instance."""
    caps = prepared.capabilities
    if not caps.supports_spec_type("ngram-simple"):
        return False
    probe = Variant.of("ngram-simple", {"size_n": 2, "size_m": 8})
    small = settings.model_copy(update={"ctx_size": 1024})
    argv = functools.partial(instance_argv, prepared, small, probe.flags(caps, per_request=True))
    return honours_request_fields(argv, prepared.binary, settings.state_dir)
