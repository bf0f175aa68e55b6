"""The tuner's declarative defaults: ``policies/tuning.toml``, validated.

Search spaces, exploration budget, guard thresholds, the prior's acceptance
guesses, and user overrides (pin a class to a variant, forbid spec types, force
speculation off). Overrides are looked up along the class's fallback chain, so
an override for ``code`` covers ``code/echo/greedy``.
"""

from __future__ import annotations

import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tuner.classify.classes import parents
from tuner.errors import ConfigError
from tuner.tuning.variants import PARAMS, parse_name

__all__ = ["Budget", "Guard", "Override", "Prior", "TuningConfig", "load_tuning"]

ParamValue = int | float


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    explore_share: float = Field(0.01, ge=0.0, le=1.0)
    trial_requests: int = Field(6, ge=1)
    min_trial_requests: int = Field(3, ge=1)
    max_trials: int = Field(12, ge=0)
    patience: int = Field(4, ge=0)
    min_class_requests: int = Field(8, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Budget:
        if self.min_trial_requests > self.trial_requests:
            raise ValueError("min_trial_requests must not exceed trial_requests")
        return self


class Guard(_Strict):
    confidence: float = Field(0.90, gt=0.5, lt=1.0)
    min_gain: float = Field(1.02, ge=1.0)
    drift_window: int = Field(24, ge=4)
    control_share: float = Field(0.5, ge=0.0, le=1.0)
    speedup_from: Literal["counts", "timing"] = "counts"
    replay: bool = True  # counts mode: every answer measures every ngram-simple variant
    replay_mod: bool = True  # ... and, through a simulated table, every ngram-mod variant
    # > 0: an inexactly replayed (ngram-mod) variant's replays count until it has served this
    # many requests of a class; from then on only what it served does (0: always both)
    confirm_served: int = Field(0, ge=0)
    # counts mode, > 0: a trial interleaves controls only while its class has fewer
    # baseline requests than this (0: always, as with timing; 6 measured no better)
    trial_controls_until: int = Field(0, ge=0)
    # with trial_controls_until: count the baseline requests of all traffic (the root level)
    # instead of the class's own; a class without two of its own is measured against its
    # nearest level's (3.5 % slower side by side, with explore_share 0.01; 0.01 alone won)
    controls_pooled: bool = False
    # counts mode: the plain decode speed a drafted token is priced against: "fitted", one
    # plain step's time fitted on all traffic's requests, speculative ones included
    # (Calibration.step_time), so only the first two requests of all traffic run without
    # speculation to anchor it; "controls", each class's nearest level's baseline requests
    # (trials interleave controls, converged classes send one per drift_window requests).
    # Side by side "fitted" / "controls": 1.011, 1.029 and 1.019 on three seeds, 0.978 on a
    # shorter fourth, 0.961 before a stalled request's weight was capped (BENCHMARKS.md)
    baseline: Literal["controls", "fitted"] = "fitted"
    # with replay: trials also for the variants replays measure exactly (false: ngram-simple
    # untried once drafts are calibrated; measured no better side by side, BENCHMARKS.md)
    trial_replayed: bool = True
    # what a trial must not lie below to go on: "baseline" (after min_trial_requests it stops
    # when its interval lies below 1) or "policy" (below the speedup the class is served now;
    # and, with replay, an exactly replayed variant whose replayed interval lies below that
    # is not tried at all; measured no better side by side, BENCHMARKS.md)
    trial_bar: Literal["baseline", "policy"] = "baseline"
    # counts mode: the cost a variant's own drafted-token cost is shrunk toward (all of it,
    # before it has served): the one pooled over every variant ("all"), or its spec type's,
    # itself shrunk toward that ("spec_type": measured 0.996 and 1.074 x slower side by
    # side; it crowned ngram-mod max64 variants that lost, BENCHMARKS.md), or that of the
    # variants of its draft length, itself shrunk toward that ("draft_length": a round's
    # overhead is spread over fewer tokens in a short draft; on Gemma an m8 drafted token
    # cost 0.53-0.66 of a step where m16 and max16 ones cost 0.38-0.47; side by side 1.029,
    # 0.982, 1.003 and 0.966 of "all" on four seeds, BENCHMARKS.md)
    cost_pool: Literal["all", "spec_type", "draft_length"] = "all"
    # counts mode: price a variant's drafted tokens in a class by its requests in that class
    # (and the classes under it), shrunk toward its cost over all traffic, instead of by
    # that cost alone (an ngram-simple lookup scans the whole context each round, so its
    # drafted token cost more where prompts are long: 0.37-0.50 of a step by class on
    # Gemma, where ngram-mod's cost 0.35-0.36 in every class; side by side on three seeds
    # 1.0085, 1.0049 and 1.015 [1.00, 1.03] by time, 0.992, 1.003 and 1.020 by counts: the
    # default since, BENCHMARKS.md)
    class_cost: bool = True
    # counts mode with class_cost: price a variant that served little in a class at its cost
    # over all traffic times what the variants of its spec type that served there cost
    # over theirs (Calibration.class_factors), not at its cost over all traffic alone; two
    # identical daemons of one bench run each rated its own class's variant 5-20 % above the
    # other's in 6 of 10 and 10 of 11 classes they chose apart (benchmarks/lock_in.py);
    # side by side on one seed 1.002 [0.99, 1.01], still locking in: an option, BENCHMARKS.md
    class_factor: bool = False
    # counts mode: before its study's next trial, or once its search is over, a class gives a
    # trial's worth of requests to a variant it has served fewer than that many times when its
    # speedup interval there reaches above the held variant's speedup (its best rival first; inside
    # the explore budget, not told to the study): a variant that never served in a class is priced
    # there at its cost over all traffic, and where that overstates it the class never serves it to
    # learn otherwise (two identical daemons held ngram-simple n6.m8 and n6.m16 in the same greedy
    # classes, neither having served the other's, and n6.m16 ran 6-7 % faster there,
    # benchmarks/lock_in.py); side by side over 300 prompts 0.975 [0.96, 0.99] of off (it fired in
    # one class and moved it to a slower variant): an option, BENCHMARKS.md
    revisit: bool = False
    # counts mode: leave a request that waited for its llama-server instance to load (its
    # upstream time beyond its prompt and decode time over half a second, engine.LOAD_MS)
    # out of the drafted-token cost: that first decode of a fresh instance ran slower (one
    # Gemma request 36 % slower than the same request on a warm instance), and a variant that
    # had served only that request was priced 30 % too high in every class for the rest of
    # the run, so it never served again to correct it; side by side on three seeds 1.013,
    # 1.008 and 0.982 by time: off by default, BENCHMARKS.md)
    skip_loading: bool = False
    # counts mode with replay: until a trial's worth of speculative requests has been served
    # (a drafted token's cost is still the cost model's guess), a request whose class runs
    # no speculation only for lack of evidence (no policy settled at any level, no verdict)
    # runs the replayed variant with the highest lower bound on all traffic's counts (its
    # speedup above 1 on at least two requests) instead of none: a fresh daemon otherwise
    # ran 3-8 of its first 20 requests plain on Gemma (1-5 s of a 390-request run); side by
    # side on five 48-request seeds 0.957, 1.072, 1.025, 1.041 and 1.028 by time, and 1.016
    # [1.00, 1.03] over 390 requests: the default since, BENCHMARKS.md
    opening: bool = True
    # counts mode: what a drafted token costs before served drafts price it: "verify", the
    # cost model's extra verify time per drafted token (at 16 drafts), standard error 0.25;
    # "checks", the cost the calibration profile's variant checks measured on this model and
    # machine (profile.drafted_token_cost; "verify" where no profile has checks), standard
    # error 0.1. On Gemma "verify" reads 0.18 of a step and "checks" 0.42, where served
    # drafts cost 0.35-0.55; side by side on a Xeon "checks" read 1.004 of "verify" by time
    # over five 48-request seeds (geometric mean), 0.992 [0.97, 1.01] over 120 and 0.959
    # [0.93, 0.98] over 447 of a 520-request run: an option (BENCHMARKS.md)
    cost_prior: Literal["verify", "checks"] = "verify"
    # among the variants that clear the guard in a class, which one to join unless another's
    # lower bound lies above its speedup there (as the current policy is kept): "off" (none),
    # "served": the stateful one (ngram-mod) that serves the most traffic, whose table has
    # learned from more answers (measured 0.944 side by side: classes stayed on the first
    # leader, a slower variant, BENCHMARKS.md), "root": the one all traffic's policy runs
    # (chosen on the most evidence; one variant for all traffic keeps one table warm),
    # "one": no class exploits a stateful variant but one, the one that ran fastest on all
    # traffic's replays (each replayed through a table fed by all traffic, as that one
    # instance's table then is), joined as above, changed only while it has served fewer
    # than drift_window requests, to one that ran min_gain faster on the same requests (the
    # paired interval's lower end). true and false read as "served" and "off"
    consolidate: Literal["off", "served", "root", "one"] = "off"
    # counts mode with replay: a class leaves its variant (or the one it would join) for
    # another when, on its last drift_window requests replayed under both, the other ran
    # min_gain faster (the paired interval's lower end) instead of when the other's own
    # lower bound lies above the held one's speedup (the spread between prompts cancels in
    # a paired comparison; measured 1.003 side by side, BENCHMARKS.md)
    paired: bool = False
    # counts mode with replay, router: after each answered request, feed its prompt and
    # answer (one prompt-only request, n_predict 1) to every loaded ngram-mod instance some
    # class exploits that did not serve it, so its table learns from all traffic, as a single
    # static instance's does (its prompt processing is charged to the request in the bench;
    # measured 0.988 [0.97, 1.00] side by side, 1.009 on decode time alone, BENCHMARKS.md)
    warm_tables: bool = False

    @field_validator("consolidate", mode="before")
    @classmethod
    def _consolidate_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return "served" if value else "off"
        return value


class Prior(_Strict):
    alpha_echo: float = Field(0.70, ge=0.0, lt=1.0)
    alpha_fresh: float = Field(0.30, ge=0.0, lt=1.0)
    sampled_scale: float = Field(0.80, ge=0.0, le=1.0)
    enqueue: int = Field(3, ge=0)
    ngram_match: float = Field(0.15, gt=0.0, le=1.0)
    ngram_copy_tokens: float = Field(16.0, ge=1.0)
    alpha_scale: dict[str, float] = Field(default_factory=dict)
    check_order: bool = False


class Single(_Strict):
    """One variant loaded at a time (router capacity 1): see ``tuner.tuning.single``."""

    horizon_s: float = Field(600.0, gt=0.0)
    window: int = Field(8, ge=1)
    # share of requests (and of the horizon's decoding) exploration windows may take; its own
    # key: the budget's lower default was measured with every variant loaded, not with reloads
    explore_share: float = Field(0.03, ge=0.0, le=1.0)


class Offline(_Strict):
    """Idle-time tuning on a sample of recent prompts: see ``tuner.tuning.offline``."""

    enabled: bool = False
    idle_s: float = Field(120.0, gt=0.0)
    samples: int = Field(8, ge=1, le=64)
    max_prompt_bytes: int = Field(32_768, ge=256)
    max_tokens: int = Field(128, ge=1)
    pairs: int = Field(8, ge=1)


class Override(_Strict):
    pin: str | None = None
    off: bool = False
    forbid: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _known(self) -> Override:
        if self.pin is not None:
            parse_name(self.pin)  # ValueError names what is wrong
        unknown = [t for t in self.forbid if t not in PARAMS]
        if unknown:
            raise ValueError(f"forbid: unknown spec type {unknown[0]!r}")
        return self


class TuningConfig(_Strict):
    budget: Budget = Budget()
    guard: Guard = Guard()
    prior: Prior = Prior()
    single: Single = Single()
    offline: Offline = Offline()
    search: dict[str, dict[str, list[ParamValue]]] = Field(default_factory=dict)
    overrides: dict[str, Override] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _non_empty(self) -> TuningConfig:
        for spec_type, space in self.search.items():
            for param, values in space.items():
                if not values:
                    raise ValueError(f"search.{spec_type}.{param}: give at least one value")
        return self

    def override_for(self, class_key: str) -> Override:
        """The override that applies to a class: its own, else the nearest parent's.

        ``forbid`` lists add up along the chain; ``pin`` and ``off`` come from the
        most specific entry that sets them.
        """
        pin: str | None = None
        off: bool | None = None
        forbid: list[str] = []
        for key in dict.fromkeys(parents(class_key)):
            found = self.overrides.get(key)
            if found is None:
                continue
            forbid.extend(found.forbid)
            if pin is None and found.pin is not None:
                pin = found.pin
            if off is None and (found.off or found.pin is not None):
                off = found.off
        return Override(pin=pin, off=bool(off), forbid=tuple(dict.fromkeys(forbid)))


def load_tuning(path: Path | None = None) -> TuningConfig:
    """Read and validate a tuning TOML; the shipped defaults when ``path`` is None."""
    try:
        if path is None:
            text = files("tuner.data").joinpath("tuning.toml").read_text(encoding="utf-8")
        else:
            text = path.read_text(encoding="utf-8")
        data: dict[str, Any] = tomllib.loads(text)
        return TuningConfig.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"cannot read the tuning file {path}: {exc}") from exc
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise ConfigError(f"invalid tuning file {path or 'tuning.toml'}: {exc}") from exc
