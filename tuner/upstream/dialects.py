"""How a speculative setting is spelt on each llama-server build's command line.

- Mainline builds with ``--spec-type``: ``--spec-type T`` and one ``--spec-<T>-<param>``
  (or ``--spec-draft-*``) flag per parameter.
- ik_llama.cpp 55d3c05: ``--spec-type T``, one ``--spec-ngram-size-n`` for every n-gram
  type (ngram-mod's match length too), the draft settings as ``--draft-max`` and friends,
  and its own per-step tuning as ``--spec-autotune``; a draft model is ``-md`` alone (its
  ``--spec-type`` names only the draftless types).
- ik_llama.cpp from June 2026 (8337e4c): one ``--spec-type TYPE:key=value,...`` per stage,
  its own type names (``draft``, ``mtp``, ``ngram-mod``) and keys (``ngram_size_n``,
  ``n_max``, ``p_min``); the per-type flags and ``--draft-*`` are refused.
- Mainline builds from before ``--spec-type``: a draft model was the only kind, set by
  ``-md`` with ``--draft-max`` and friends.

``launch_flags`` takes a setting as plain data (spec type, parameters), so this module
knows nothing of how the tuner names or searches them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tuner.upstream.capabilities import Capabilities

__all__ = ["AUTOTUNE", "MAINLINE", "STAGE_ONLY", "launch_flags"]

Value = int | float

AUTOTUNE = "--spec-autotune"  # ik_llama.cpp: the engine tunes n_max / n_min / p_min per step
_NGRAM = ("ngram-simple", "ngram-map-k", "ngram-map-k4v")
_DRAFT = ("draft-simple", "draft-mtp", "draft-eagle3", "draft-dflash")
# mainline with --spec-type: spec type -> parameter -> flag
MAINLINE: dict[str, dict[str, str]] = {
    "none": {},
    **{
        kind: {
            "size_n": f"--spec-{kind}-size-n",
            "size_m": f"--spec-{kind}-size-m",
            "min_hits": f"--spec-{kind}-min-hits",
            **({"autotune": AUTOTUNE} if kind == "ngram-simple" else {}),
        }
        for kind in _NGRAM
    },
    "ngram-mod": {
        "n_match": "--spec-ngram-mod-n-match",
        "n_max": "--spec-ngram-mod-n-max",
        "n_min": "--spec-ngram-mod-n-min",
        "autotune": AUTOTUNE,
    },
    "ngram-cache": {},
    **{
        kind: {
            "n_max": "--spec-draft-n-max",
            "n_min": "--spec-draft-n-min",
            "p_min": "--spec-draft-p-min",
        }
        for kind in _DRAFT
    },
}
_OLD_DRAFT = {"n_max": "--draft-max", "n_min": "--draft-min", "p_min": "--draft-p-min"}
_IK_NGRAM = {
    "size_n": "--spec-ngram-size-n",
    "size_m": "--spec-ngram-size-m",
    "min_hits": "--spec-ngram-min-hits",
    "n_match": "--spec-ngram-size-n",
}


# ik_llama.cpp's stage names where they differ from spec-tuner's (mainline's) spec types
_STAGE_NAMES = {
    "draft-simple": "draft",
    "draft-mtp": "mtp",
    "draft-eagle3": "eagle3",
    "draft-dflash": "dflash",
}
_STAGE_KEYS = {
    "size_n": "ngram_size_n",
    "size_m": "ngram_size_m",
    "min_hits": "ngram_min_hits",
    "n_match": "ngram_size_n",
    "min_match": "suffix_min_match_len",
    "max_depth": "suffix_max_depth",
}
# spec types only the stage dialect has (ik_llama.cpp since June 2026): their parameters.
# ``suffix`` drafts from a suffix tree of the context; its structure is set at launch, its
# n_max / n_min may come with each request
STAGE_ONLY: dict[str, tuple[str, ...]] = {"suffix": ("min_match", "max_depth", "n_max", "n_min")}


def _stage(
    spec_type: str, params: Sequence[tuple[str, Value]], settings: Mapping[str, Value]
) -> str:
    """``TYPE:key=value,...`` of ik_llama.cpp's ``--spec-type`` stage.

    >>> _stage("ngram-mod", [("n_match", 24)], {"n_max": 16, "n_min": 12})
    'ngram-mod:ngram_size_n=24,n_max=16,n_min=12'
    """
    keys = {_STAGE_KEYS[p]: v for p, v in params if p in _STAGE_KEYS} | dict(settings)
    name = _STAGE_NAMES.get(spec_type, spec_type)
    return name + (":" + ",".join(f"{k}={v}" for k, v in keys.items()) if keys else "")


def launch_flags(
    caps: Capabilities,
    spec_type: str,
    params: Sequence[tuple[str, Value]],
    *,
    draft: Sequence[str] = (),
    autotuned: bool = False,
    draft_settings: Mapping[str, Value] | None = None,
) -> list[str]:
    """The flags of one setting on this build. ``draft``: the draft model's flags, where
    the setting has one; ``draft_settings``: n_max / n_min / p_min as ik_llama.cpp takes
    them at launch (None: they go with each request instead).

    >>> from tuner.upstream.capabilities import parse_capabilities
    >>> mainline = parse_capabilities("--spec-type TYPE  draft type")
    >>> launch_flags(mainline, "ngram-mod", [("n_match", 24)])
    ['--spec-type', 'ngram-mod', '--spec-ngram-mod-n-match', '24']
    """
    if caps.stages:
        settings = {} if autotuned or spec_type == "none" else (draft_settings or {})
        tuned = [AUTOTUNE] if autotuned else []
        return ["--spec-type", _stage(spec_type, params, settings), *tuned, *draft]
    if caps.engine == "ik_llama.cpp":
        out = [] if spec_type == "draft-simple" else ["--spec-type", spec_type]
        for param, value in params:
            if param in _IK_NGRAM:
                out += [_IK_NGRAM[param], str(value)]
        if autotuned:
            return [*out, AUTOTUNE, *draft]  # it sets the draft settings itself, every step
        for param, value in (draft_settings or {}).items():
            out += [_OLD_DRAFT[param], str(value)]
        return [*out, *draft]
    if caps.has_flag("--spec-type"):
        out = ["--spec-type", spec_type]
        for param, value in params:
            out += [MAINLINE[spec_type][param], str(value)]
        return [*out, *draft]
    if spec_type == "none":  # before --spec-type: no draft model meant no speculation
        return []
    out = list(draft)
    for param, value in params:
        out += [_OLD_DRAFT[param], str(value)]
    return out
