"""Variants: one llama-server speculative configuration each, and how to render it.

A variant is a spec type with one value per parameter. Its ``name`` is stable and
readable (``ngram-simple.n3.m16``); it names the router preset, the records, the
report rows and the metrics labels. ``flags`` renders it for the installed
build, in that build's dialect (``tuner.upstream.dialects``). ``request_fields`` gives
the draft settings an engine that honours them takes with each request instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.upstream.capabilities import Capabilities
from tuner.upstream.dialects import AUTOTUNE, MAINLINE, STAGE_ONLY, launch_flags

__all__ = [
    "AUTOTUNE",
    "BASELINE",
    "PARAMS",
    "Variant",
    "autotune_space",
    "fit_synthetic",
    "grid",
    "parse_name",
    "presets_ini",
    "request_fields",
    "unavailable",
]

ParamValue = int | float

# spec type -> parameter -> the short label a variant's name gives it (the flags each build
# takes for it: ``tuner.upstream.dialects``)
_LABELS = {
    "size_n": "n",
    "size_m": "m",
    "min_hits": "h",
    "autotune": "auto",
    "n_match": "match",
    "n_max": "max",
    "n_min": "min",
    "p_min": "p",
    "min_match": "len",
    "max_depth": "depth",
}
PARAMS: dict[str, dict[str, str]] = {
    kind: {param: _LABELS[param] for param in params}
    for kind, params in {**MAINLINE, **STAGE_ONLY}.items()
}
PER_REQUEST = ("n_max", "n_min", "p_min")
# the n-gram types ik_llama.cpp's autotune tunes: those with an ``autotune`` parameter
AUTOTUNED = tuple(kind for kind, params in PARAMS.items() if "autotune" in params)
AUTOTUNE_MAX = 16  # the most tokens its autotune lets a round draft
# Defaults of the current build, used for the nominal draft length of a variant.
_DEFAULT_DRAFT = {"ngram-mod": 64, "ngram-cache": 8, "draft": 3, "ngram": 48, "suffix": 16}
NEEDS_DRAFT_MODEL = frozenset({"draft-simple", "draft-eagle3", "draft-dflash"})


def _label(value: ParamValue) -> str:
    """``3`` -> ``3``; ``0.75`` -> ``75`` (a probability as a percentage)."""
    if isinstance(value, float) and not value.is_integer():
        return f"{round(value * 100):d}"
    return str(int(value))


@dataclass(frozen=True, slots=True, order=True)
class Variant:
    """One speculative configuration: a spec type and its parameters."""

    spec_type: str
    params: tuple[tuple[str, ParamValue], ...] = ()

    @classmethod
    def of(cls, spec_type: str, params: Mapping[str, ParamValue] | None = None) -> Variant:
        known = PARAMS.get(spec_type)
        if known is None:
            raise ValueError(f"unknown spec type {spec_type!r}")
        params = dict(params or {})
        unknown = set(params) - set(known)
        if unknown:
            raise ValueError(f"{spec_type} has no parameter {sorted(unknown)[0]!r}")
        if not params.get("autotune", 1):
            del params["autotune"]  # off: the variant as it was
        elif "autotune" in params:
            params = {p: v for p, v in params.items() if p not in PER_REQUEST}  # it tunes them
        if spec_type == "ngram-mod" and "n_max" in params and "n_min" not in params:
            params["n_min"] = max(1, int(params["n_max"]) * 3 // 4)
        ordered = tuple((p, params[p]) for p in known if p in params)
        return cls(spec_type, ordered)

    @property
    def name(self) -> str:
        labels = PARAMS[self.spec_type]
        parts = [self.spec_type]
        for param, value in self.params:
            n_max = self.param("n_max")
            derived = n_max is not None and value == max(1, int(n_max) * 3 // 4)
            if self.spec_type == "ngram-mod" and param == "n_min" and derived:
                continue  # the value derived from n_max
            parts.append(f"{labels[param]}{_label(value)}")
        return ".".join(parts)

    @property
    def speculative(self) -> bool:
        return self.spec_type != "none"

    @property
    def copies(self) -> bool:
        """An n-gram or suffix type: drafts by copying earlier text (no draft model)."""
        return self.spec_type.startswith("ngram-") or self.spec_type == "suffix"

    @property
    def autotuned(self) -> bool:
        """The engine tunes its draft settings per step (``--spec-autotune``): its drafts
        change every call, so no replay prices it; it is measured by serving it."""
        return bool(self.param("autotune"))

    @property
    def needs_draft_model(self) -> bool:
        return self.spec_type in NEEDS_DRAFT_MODEL

    def param(self, name: str, default: ParamValue | None = None) -> ParamValue | None:
        return dict(self.params).get(name, default)

    @property
    def draft_length(self) -> int:
        """The most tokens one round may draft (the gamma the speedup model uses)."""
        if not self.speculative:
            return 0
        if self.spec_type.startswith("ngram-") and self.spec_type not in (
            "ngram-mod",
            "ngram-cache",
        ):
            return int(self.param("size_m", _DEFAULT_DRAFT["ngram"]) or 0)
        if self.autotuned and self.spec_type == "ngram-mod":
            return AUTOTUNE_MAX
        if self.spec_type in ("ngram-mod", "ngram-cache", "suffix"):
            return int(self.param("n_max", _DEFAULT_DRAFT[self.spec_type]) or 0)
        return int(self.param("n_max", _DEFAULT_DRAFT["draft"]) or 0)

    def flags(
        self, caps: Capabilities, draft_model: Path | None = None, *, per_request: bool = False
    ) -> list[str]:
        """Command-line flags for this variant on the given build; with ``per_request``
        (an engine that takes them with each request) without the ``request_fields``.

        Raises ``ValueError`` when the build cannot run it (unknown spec type, or a
        draft-model type without a draft model).
        """
        if self.needs_draft_model and draft_model is None:
            raise ValueError(f"{self.name} needs a draft model (TUNER_DRAFT_MODEL)")
        if not caps.supports_spec_type(self.spec_type):
            raise ValueError(f"this llama-server build has no spec type {self.spec_type!r}")
        if self.autotuned and not _autotunes(caps):
            raise ValueError(f"this llama-server build has no {AUTOTUNE}")
        draft = ["-md", str(draft_model)] if self.needs_draft_model and draft_model else []
        return launch_flags(
            caps,
            self.spec_type,
            self.params,
            draft=draft,
            autotuned=self.autotuned,
            draft_settings=None if per_request else _draft_settings(self),
        )


BASELINE = Variant("none")


def _draft_settings(variant: Variant) -> dict[str, ParamValue]:
    """n_max / n_min / p_min as an engine that reads them per slot takes them: an n-gram
    type's copied run (``size_m``) is its draft length there."""
    if not variant.speculative:
        return {"n_max": 0}
    if variant.autotuned:
        return {}  # the engine's autotune overwrites a slot's settings every step
    settings = {k: v for k, v in variant.params if k in PER_REQUEST}
    if variant.copies and "n_max" not in settings:
        settings["n_max"] = variant.draft_length
    return settings


def parse_name(name: str) -> Variant:
    """The variant a name stands for (inverse of ``Variant.name``).

    >>> parse_name("ngram-simple.n3.m16") == Variant.of("ngram-simple", {"size_n": 3, "size_m": 16})
    True
    """
    spec_type, *parts = name.split(".")
    by_label = {label: param for param, label in PARAMS.get(spec_type, {}).items()}
    params: dict[str, ParamValue] = {}
    for part in parts:
        label = part.rstrip("0123456789")
        digits = part[len(label) :]
        if label not in by_label or not digits:
            raise ValueError(f"not a variant name: {name!r}")
        params[by_label[label]] = int(digits) / 100 if label == "p" else int(digits)
    return Variant.of(spec_type, params)


def unavailable(
    spec_type: str, caps: Capabilities, *, draft: str | None = None, mtp_layers: int = 0
) -> str | None:
    """Why this build, model and draft cannot run a spec type; None when they can.
    ``draft``: the spec type the configured draft model serves (``draft_type``), None
    without one."""
    if spec_type not in PARAMS:
        return "not a spec type spec-tuner knows"
    if not caps.supports_spec_type(spec_type):
        return "not in this llama-server build"
    if spec_type in NEEDS_DRAFT_MODEL and draft is None:
        return "needs a draft model (TUNER_DRAFT_MODEL)"
    if spec_type in NEEDS_DRAFT_MODEL and spec_type != draft:
        return f"the configured draft is a {draft} model"
    if spec_type == "draft-mtp" and mtp_layers < 1:
        return "the target has no MTP (next-n) layers"
    return None


def grid(
    space: Mapping[str, Mapping[str, Sequence[ParamValue]]],
    caps: Capabilities,
    *,
    draft: str | None = None,
    mtp_layers: int = 0,
    forbid: Iterable[str] = (),
) -> list[Variant]:
    """Every variant of a search space this build, target and draft can run, baseline first
    (``draft``: the configured draft's spec type; ``draft-mtp`` only on a target with
    ``mtp_layers`` next-n layers)."""
    forbidden = set(forbid)
    out = [BASELINE]
    for spec_type, params in autotune_space(space, caps).items():
        if spec_type in forbidden or spec_type == "none":
            continue
        if unavailable(spec_type, caps, draft=draft, mtp_layers=mtp_layers):
            continue
        names = list(params)
        for values in itertools.product(*(params[n] for n in names)):
            variant = Variant.of(spec_type, dict(zip(names, values, strict=True)))
            if variant not in out:
                out.append(variant)
    return out


def _autotunes(caps: Capabilities) -> bool:
    """The build tunes the draft settings per step itself: ik_llama.cpp's ``--spec-autotune``."""
    return caps.autotune and caps.engine == "ik_llama.cpp"


def autotune_space(
    space: Mapping[str, Mapping[str, Sequence[ParamValue]]], caps: Capabilities
) -> dict[str, dict[str, list[ParamValue]]]:
    """The search space with the engine's own per-step tuning as one more setting of each
    n-gram type it tunes (``autotune`` 0 or 1), where the build has it (ik_llama.cpp); on a
    build without it only ``autotune = 0`` is kept, as a type the build lacks is skipped."""
    out = {
        kind: {p: list(values) for p, values in params.items()} for kind, params in space.items()
    }
    has = _autotunes(caps)
    for kind in AUTOTUNED:
        if kind in out and has:
            out[kind].setdefault("autotune", [0, 1])
        elif kind in out and "autotune" in out[kind]:
            out[kind]["autotune"] = [0]
    return out


def presets_ini(
    variants: Sequence[Variant],
    caps: Capabilities,
    *,
    shared: Sequence[str],
    draft_model: Path | None = None,
    speculative: Sequence[str] = (),
) -> str:
    """A router-mode presets file: ``shared`` flags in ``[*]``, one section per variant.

    ``speculative`` flags go into every speculative variant's section (not ``none``'s).

    Keys are long flag names without dashes; a flag without a value becomes ``true``.
    """

    def section(flags: Sequence[str]) -> list[str]:
        lines, i = [], 0
        while i < len(flags):
            key = flags[i].lstrip("-")
            if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
                lines.append(f"{key} = {flags[i + 1]}")
                i += 2
            else:
                lines.append(f"{key} = true")
                i += 1
        return lines

    out = ["version = 1", "", "[*]", *section(_long(shared)), ""]
    for variant in variants:
        extra = fit_synthetic(speculative, variant.draft_length) if variant.speculative else []
        flags = variant.flags(caps, draft_model) + extra
        out += [f"[{variant.name}]", *section(_long(flags)), ""]
    return "\n".join(out)


def fit_synthetic(flags: Sequence[str], n_max: int) -> list[str]:
    """``flags`` with ``--spec-synth-rates`` (one acceptance probability per drafted
    position) fitted to a variant drafting at most ``n_max`` tokens, as llama-server wants
    exactly that many: cut, or carried on at the last two rates' ratio, the first's taken
    over 1 (one value ``alpha`` keeps each drafted token with probability ``alpha`` given
    the ones before it, ``alpha^(i+1)`` at position i, at any length).

    >>> fit_synthetic(["--spec-synth-rates", "0.5,0.25,0.125"], 2)
    ['--spec-synth-rates', '0.5,0.25']
    >>> fit_synthetic(["--threads", "2", "--spec-synth-rates", "0.8"], 3)
    ['--threads', '2', '--spec-synth-rates', '0.8,0.64,0.512']
    """
    out = list(flags)
    for i, flag in enumerate(out[:-1]):
        if flag != "--spec-synth-rates":
            continue
        try:
            rates = [float(r) for r in out[i + 1].split(",")]
        except ValueError:
            continue  # llama-server names what is wrong with it when it starts
        before = rates[-2] if len(rates) > 1 else 1.0
        ratio = rates[-1] / before if before > 0 else 1.0
        while len(rates) < n_max:
            rates.append(rates[-1] * ratio)
        out[i + 1] = ",".join(f"{r:.6g}" for r in rates[: max(1, n_max)])
    return out


_SHORT = {"-m": "--model", "-md": "--spec-draft-model", "-c": "--ctx-size", "-t": "--threads"}


def _long(flags: Sequence[str]) -> list[str]:
    return [_SHORT.get(f, f) for f in flags]


def request_fields(variant: Variant) -> dict[str, object]:
    """Per-request draft settings, as flat ``speculative.*`` keys: the way both engines'
    servers read them (a nested ``{"speculative": {...}}`` is ignored silently)."""
    return {f"speculative.{k}": v for k, v in _draft_settings(variant).items()}
