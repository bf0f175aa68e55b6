"""The engine choice: the fastest measured engine serves unless the serving one is within
the margin; the file it is kept in is typed, and valid for one model, machine and builds."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tuner.engines.choice import (
    MARGIN,
    EngineChoice,
    EngineResult,
    choose,
    load_choice,
    new_choice,
    save_choice,
)
from tuner.upstream.sources import ENGINES, EngineName

speeds = st.one_of(st.none(), st.floats(min_value=1.0, max_value=500.0))


def _results(a: float | None, b: float | None) -> tuple[EngineResult, ...]:
    return tuple(
        EngineResult(engine=e, build="abc", tok_s=s, setting="none")
        if s is not None
        else EngineResult(engine=e, build="abc", unavailable="cannot serve this model")
        for e, s in zip(ENGINES, (a, b), strict=True)
    )


@given(speeds, speeds, st.sampled_from((None, *ENGINES)))
def test_the_choice_is_the_fastest_or_the_serving_one_within_the_margin(
    a: float | None, b: float | None, serving: EngineName | None
) -> None:
    results = _results(a, b)
    measured = {r.engine: r.tok_s for r in results if r.tok_s is not None}
    if not measured:
        try:
            choose(results, serving)
        except ValueError:
            return
        raise AssertionError("chose an engine none of which was measured")
    engine, why = choose(results, serving)
    assert engine in measured
    fastest = max(measured.values())
    if measured[engine] < fastest:  # kept though slower: only the serving one, within the margin
        assert engine == serving and measured[engine] * (1 + MARGIN) >= fastest
        assert "kept" in why
    if len(measured) == 1:
        assert "the only engine" in why and "cannot serve this model" in why


def test_a_clearly_faster_engine_replaces_the_serving_one() -> None:
    engine, why = choose(_results(100.0, 140.0), "llama.cpp")
    assert engine == "ik_llama.cpp"
    assert "140.0" in why and "llama.cpp 100.0" in why
    assert choose(_results(100.0, 102.0), "llama.cpp")[0] == "llama.cpp"
    assert choose(_results(100.0, 102.0), None)[0] == "ik_llama.cpp"


def _choice(**update: object) -> EngineChoice:
    base = new_choice("gemma-abc", "hw1", _results(100.0, 140.0), "llama.cpp")
    return base.model_copy(update=update)


def test_a_choice_is_valid_for_its_model_machine_and_builds_only() -> None:
    choice = _choice()
    builds: dict[EngineName, str | None] = {"llama.cpp": "abc", "ik_llama.cpp": "abc"}
    assert choice.valid_for("gemma-abc", "hw1", builds)
    assert not choice.valid_for("other-model", "hw1", builds)
    assert not choice.valid_for("gemma-abc", "hw2", builds)
    assert not choice.valid_for("gemma-abc", "hw1", {**builds, "ik_llama.cpp": "newer"})
    # an engine built since: measured again
    only_one = choice.model_copy(
        update={"results": (choice.results[0], EngineResult(engine="ik_llama.cpp"))}
    )
    assert not only_one.valid_for("gemma-abc", "hw1", builds)


def test_the_choice_file_round_trips_and_a_bad_one_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    assert load_choice(path) is None
    choice = _choice()
    save_choice(path, choice)
    assert load_choice(path) == choice
    path.write_text('{"version": 2, "engine": "llama.cpp"}')
    assert load_choice(path) is None
    path.write_text("not json")
    assert load_choice(path) is None
