"""Which engine serves: what was measured of each, the choice made from it, and the file
that keeps both (``engines.json`` in the state dir, valid for one model file, machine and
set of engine builds).

``choose`` is pure: measurements in, the engine and why out. An engine is only left for
another that measured clearly faster (``MARGIN``): two engines within the noise of one
short calibration run are not worth a switch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from tuner.atomic import write_atomic
from tuner.logs import get_logger
from tuner.upstream.sources import EngineName

__all__ = [
    "CHOICE_FILE",
    "LOADED_CLIENTS",
    "MARGIN",
    "EngineChoice",
    "EngineResult",
    "choose",
    "load_choice",
    "only_engine_for",
    "save_choice",
    "under_load",
]

log = get_logger(__name__)

CHOICE_FILE = "engines.json"
MARGIN = 0.03  # the faster engine must be this much faster to replace the serving one
LOADED_CLIENTS = 4  # the measurement's clients at once: agents' sub-agents, a few apps


class EngineResult(BaseModel):
    """One engine on this model and machine: its tokens per second on the calibration
    set at its best setting, or why it was not measured."""

    model_config = ConfigDict(frozen=True)

    engine: EngineName
    build: str | None = None  # the binary's commit
    tok_s: float | None = None  # generated tokens over prefill and decode time, best setting
    setting: str | None = None  # the variant that gave ``tok_s``
    prompt_tok_s: float | None = None  # prefill without speculation
    decode_tok_s: float | None = None  # decode without speculation
    settings: dict[str, float] = {}  # every setting measured: tok/s
    # the best setting's generated tokens per wall second with clients at once
    # (LOADED_CLIENTS); None in a measurement made before it was taken
    loaded_tok_s: float | None = None
    loaded_setting: str | None = None
    unavailable: str | None = None  # why not measured (not built, cannot load the model ...)

    @property
    def measured(self) -> bool:
        return self.tok_s is not None and self.unavailable is None


class EngineChoice(BaseModel):
    """The persisted choice (version 1)."""

    model_config = ConfigDict(frozen=True)

    version: Literal[1] = 1
    model_key: str
    hardware_key: str
    measured_at: float
    results: tuple[EngineResult, ...]
    engine: EngineName
    why: str

    def builds(self) -> dict[str, str | None]:
        """The builds measured or tried (an engine not built then has no build)."""
        return {r.engine: r.build for r in self.results if r.build is not None}

    def valid_for(
        self, model_key: str, hardware_key: str, builds: dict[EngineName, str | None]
    ) -> bool:
        """Made on this model and machine, with these engines' builds: measured engines
        unchanged, and no engine available now that was not then."""
        if (self.model_key, self.hardware_key) != (model_key, hardware_key):
            return False
        return self.builds() == dict(builds)


def choose(results: tuple[EngineResult, ...], serving: EngineName | None) -> tuple[EngineName, str]:
    """The engine to serve on and why. Raises ``ValueError`` when none was measured.

    >>> a = EngineResult(engine="llama.cpp", tok_s=100.0, setting="ngram-mod")
    >>> b = EngineResult(engine="ik_llama.cpp", tok_s=150.0, setting="ngram-simple.n3.m16")
    >>> choose((a, b), "llama.cpp")
    ('ik_llama.cpp', 'measured fastest: 150.0 tok/s (ngram-simple.n3.m16) against llama.cpp 100.0')
    >>> choose((a, b.model_copy(update={"tok_s": 102.0})), "llama.cpp")[0]
    'llama.cpp'
    """
    measured = sorted(
        (r for r in results if r.measured), key=lambda r: r.tok_s or 0.0, reverse=True
    )
    if not measured:
        raise ValueError("no engine was measured")
    best, *others = measured
    why_not = {r.engine: r.unavailable for r in results if not r.measured}
    if not others:
        reasons = "; ".join(f"{e}: {w}" for e, w in why_not.items())
        return best.engine, f"the only engine that runs here ({reasons})" if reasons else ""
    held = next((r for r in measured if r.engine == serving), None)
    if (
        held is not None
        and held is not best
        and (held.tok_s or 0.0) * (1 + MARGIN) >= (best.tok_s or 0.0)
    ):
        return held.engine, (
            f"within {MARGIN:.0%} of the fastest ({best.engine} {best.tok_s:.1f} tok/s, "
            f"{held.engine} {held.tok_s:.1f}): kept"
        )
    against = ", ".join(f"{r.engine} {r.tok_s:.1f}" for r in others)
    return (
        best.engine,
        f"measured fastest: {best.tok_s:.1f} tok/s ({best.setting}) against {against}"
        + under_load(measured),
    )


def under_load(measured: list[EngineResult]) -> str:
    """What the figures with clients at once add to a choice made at one client.

    >>> a = EngineResult(engine="llama.cpp", tok_s=100.0, loaded_tok_s=190.0)
    >>> b = EngineResult(engine="ik_llama.cpp", tok_s=150.0, loaded_tok_s=160.0)
    >>> under_load([b, a])
    '; with 4 clients at once llama.cpp is faster (190.0 tok/s against ik_llama.cpp 160.0)'
    >>> under_load([b, a.model_copy(update={"loaded_tok_s": 120.0})])
    '; also with 4 clients at once (160.0 tok/s against llama.cpp 120.0)'
    >>> under_load([b, a.model_copy(update={"loaded_tok_s": None})])
    ''
    """
    if any(r.loaded_tok_s is None for r in measured):
        return ""
    first, *rest = sorted(measured, key=lambda r: r.loaded_tok_s or 0.0, reverse=True)
    against = ", ".join(f"{r.engine} {r.loaded_tok_s:.1f}" for r in rest)
    figures = f"{first.loaded_tok_s:.1f} tok/s against {against}"
    if first.engine == measured[0].engine:
        return f"; also with {LOADED_CLIENTS} clients at once ({figures})"
    return f"; with {LOADED_CLIENTS} clients at once {first.engine} is faster ({figures})"


def only_engine_for(
    needs: Mapping[str, str], supports: Mapping[EngineName, frozenset[str]]
) -> tuple[EngineName, str] | None:
    """Where the model or its draft can be drafted with in a way only one engine can
    (``needs``: spec type -> what of the model or draft asks for it), that engine and why;
    None where every engine runs all of them.

    >>> only_engine_for({"draft-mtp": "the model has MTP (next-n) layers"},
    ...     {"llama.cpp": frozenset({"draft-mtp"}), "ik_llama.cpp": frozenset()})[1]
    'the model has MTP (next-n) layers, which only llama.cpp drafts with (draft-mtp)'
    """
    for spec_type, what in needs.items():
        able = [engine for engine, types in supports.items() if spec_type in types]
        if len(able) == 1 and len(supports) > 1:
            return able[0], f"{what}, which only {able[0]} drafts with ({spec_type})"
    return None


def load_choice(path: Path) -> EngineChoice | None:
    """The persisted choice, or None when absent, unreadable or of another version."""
    try:
        return EngineChoice.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError, ValueError) as exc:
        log.warning("engine_choice_unreadable", path=str(path), error=str(exc)[:300])
        return None


def save_choice(path: Path, choice: EngineChoice) -> None:
    write_atomic(path, choice.model_dump_json(indent=1) + "\n")


def new_choice(
    model_key: str,
    hardware_key: str,
    results: tuple[EngineResult, ...],
    serving: EngineName | None,
    decided: tuple[EngineName, str] | None = None,
) -> EngineChoice:
    """The choice from these results (``decided``: the engine and why, where it was not
    measured but forced, ``only_engine_for``)."""
    engine, why = decided or choose(results, serving)
    return EngineChoice(
        model_key=model_key,
        hardware_key=hardware_key,
        measured_at=time.time(),
        results=results,
        engine=engine,
        why=why,
    )
