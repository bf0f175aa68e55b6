"""The pricing check: the tuner's speedups beside the static arms' (``tuner.bench.beliefs``)."""

from __future__ import annotations

import math
import statistics

from hypothesis import given
from hypothesis import strategies as st

from tuner.bench.beliefs import beliefs, lock_in, markdown_rows


def arm(ratio: float, low: float, high: float) -> dict[str, object]:
    return {"ratio": ratio, "interval": [low, high]}


CLASSES = {
    "code": {"prompts": 30, "arms": {"a": arm(1.5, 1.4, 1.6), "b": arm(1.2, 1.1, 1.3)}},
    "text": {"prompts": 10, "arms": {"a": arm(1.0, 0.9, 1.1), "none": arm(1.0, 1.0, 1.0)}},
    "data": {"prompts": 5, "arms": {"a": arm(1.1, 1.0, 1.2)}},
}


def test_pairs_only_where_both_have_a_figure_and_the_error_weighs_prompts() -> None:
    speedups = {
        "code": {"a": [1.53, 1.4, 1.6], "b": [1.38, 1.3, 1.4]},
        "text": {"a": [0.9, 0.8, 1.0]},
    }
    found = beliefs(CLASSES, speedups)
    assert found is not None
    assert [(r["class"], r["variant"]) for r in found["rows"]] == [
        ("code", "a"),
        ("code", "b"),
        ("text", "a"),
    ]
    assert found["within_tolerance"] == 1  # code/a at 1.02; code/b 1.15, text/a 0.90
    assert found["inside_interval"] == 2  # code/b's 1.38 is above its 1.3
    logs = [30 * math.log(1.02), 30 * math.log(1.15), 10 * -math.log(0.9)]
    assert found["mean_error"] == round(math.expm1(sum(abs(x) for x in logs) / 70), 4)
    assert found["median_ratio"] == 1.02
    table = "\n".join(markdown_rows(found))
    assert "| code | b | 30 | 1.380x | 1.200x [1.10, 1.30] | 1.150 |" in table


def test_nothing_to_compare_is_none() -> None:
    assert beliefs(CLASSES, {}) is None
    assert beliefs(CLASSES, {"code": {"c": [1.0, 1.0, 1.0]}}) is None
    assert beliefs(CLASSES, {"data": {"a": [1.1, 1, 1.2]}}, min_prompts=6) is None


@given(st.floats(0.2, 5.0), st.floats(0.2, 5.0))
def test_a_prediction_equal_to_time_has_no_error(measured: float, scale: float) -> None:
    classes = {"k": {"prompts": 3, "arms": {"v": arm(measured, measured / 2, measured * 2)}}}
    exact = beliefs(classes, {"k": {"v": [measured, 0, 9]}})
    off = beliefs(classes, {"k": {"v": [measured * scale, 0, 9]}})
    assert exact is not None and off is not None
    assert exact["mean_error"] == 0 and exact["within_tolerance"] == 1
    assert off["mean_error"] >= 0 and (off["within_tolerance"] == 1) == (abs(scale - 1) <= 0.03)


def test_lock_in_compares_the_held_variant_with_the_best_priced_and_the_best_static() -> None:
    classes = {
        "code": {
            "tuner_requests": 40,
            "final_variant": "b",
            "oracle_ratio": 1.5,
            "arms": {"a": arm(1.5, 1.4, 1.6), "b": arm(1.2, 1.1, 1.3)},
        },
        "text": {
            "tuner_requests": 25,
            "final_variant": "none",
            "oracle_ratio": 1.1,
            "arms": {"a": arm(1.1, 1.0, 1.2)},
        },
        "young": {"tuner_requests": 20, "final_variant": "a", "arms": {}},
        "odd": {"tuner_requests": 50, "final_variant": "messages: a; prompt: b", "arms": {}},
    }
    speedups = {
        "code": {"a": [1.44, 1, 2], "b": [1.2, 1, 2]},
        "text": {"a": [0.95, 0, 2]},
        "young": {"a": [1.0, 1, 1]},
    }
    rows = {r["class"]: r for r in lock_in(classes, speedups)}
    assert set(rows) == {"code", "text"}  # 20 requests or fewer, or no single variant: left out
    assert (rows["code"]["best_priced"], rows["code"]["own_gap"]) == ("a", 1.2)
    assert rows["code"]["static_gap"] == 1.25
    assert (rows["text"]["best_priced"], rows["text"]["own_gap"]) == ("none", 1.0)
    assert rows["text"]["static_gap"] == 1.1  # none measures 1.0 by definition


def test_the_noise_floor_says_what_a_predictor_with_no_error_would_reach() -> None:
    speedups = {"code": {"a": [1.5, 1.4, 1.6]}, "text": {"a": [1.0, 0.9, 1.1]}}
    assert beliefs(CLASSES, speedups)["noise_floor"] is None  # type: ignore[index]
    found = beliefs(CLASSES, speedups, request_sd=0.05)
    assert found is not None
    floor = found["noise_floor"]
    # a class's ratio over n prompts varies by 0.05 * sqrt(2 / n): 30 prompts, then 10
    normal = statistics.NormalDist()
    chances = [2 * normal.cdf(math.log(1.03) / (0.05 * math.sqrt(2 / n))) - 1 for n in (30, 10)]
    assert floor["expected_within"] == round(sum(chances), 1)
    assert floor["all_within"] == round(chances[0] * chances[1], 2)
    assert "Timing noise alone (one request's decode time varies by 5.0%)" in "\n".join(
        markdown_rows(found)
    )


@given(st.integers(1, 500), st.floats(0.001, 0.5))
def test_more_prompts_or_less_noise_never_lowers_the_floor(prompts: int, sd: float) -> None:
    from tuner.bench.beliefs import noise_floor

    here = noise_floor([{"prompts": prompts}], sd)["expected_within"]
    assert noise_floor([{"prompts": prompts * 2}], sd)["expected_within"] >= here
    assert noise_floor([{"prompts": prompts}], sd / 2)["expected_within"] >= here
    assert 0 <= here <= 1
