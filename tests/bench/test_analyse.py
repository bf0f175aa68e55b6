"""The bench summary on rows whose true ratios are known."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.bench.analyse import SCHEMA, FinalPolicy, summarize
from tuner.bench.compare import same_work
from tuner.bench.rows import check_row

# two classes of two items each; per item (tokens, ms) for each static arm
CLASSES = ["code", "code", "prose", "prose"]
MS = {  # 100 tokens each: tok/s = 100000 / ms
    "none": [1000, 1000, 1000, 1000],
    "fast-code": [500, 500, 1100, 1100],  # 2x on code, 0.91x on prose
    "meh": [900, 900, 950, 950],  # small gain everywhere
}


def static_rows(repeats: int = 2) -> list[dict[str, Any]]:
    rows = []
    for arm, values in MS.items():
        for item, ms in enumerate(values):
            for r in range(repeats):
                rows.append({"arm": arm, "item": item, "tokens": 100, "ms": ms + r, "repeat": r})
    return rows


def tuner_row(item: int, variant: str, role: str = "exploit") -> dict[str, Any]:
    ms = MS[variant][item] if variant in MS else 1000
    return {"arm": "tuner", "item": item, "tokens": 100, "ms": ms, "variant": variant, "role": role}


def test_static_ratios_oracles_and_best_single_arm() -> None:
    s = summarize(static_rows(), CLASSES)
    assert s["schema"] == SCHEMA and s["errors"] == 0 and s["targets"] is None
    code, prose = s["classes"]["code"], s["classes"]["prose"]
    assert code["oracle"] == "fast-code" and code["oracle_ratio"] == pytest.approx(2.0, rel=0.01)
    assert prose["oracle"] == "meh" and prose["oracle_ratio"] == pytest.approx(1000 / 950, rel=0.01)
    overall = s["overall"]
    # fast-code over all four items: 400 tokens in 3.2 s vs 4.0 s
    assert overall["arms"]["fast-code"]["ratio"] == pytest.approx(4.0 / 3.2, rel=0.01)
    assert overall["best_static"] == "fast-code"
    assert overall["oracle_ratio"] == pytest.approx(4.0 / (1.0 + 1.9), rel=0.01)
    assert overall["per_prompt_oracle_ratio"] == pytest.approx(overall["oracle_ratio"], rel=0.01)


def test_a_class_where_every_arm_loses_has_baseline_as_its_oracle() -> None:
    rows = [r for r in static_rows() if r["arm"] != "meh"]
    s = summarize(rows, CLASSES)
    assert s["classes"]["prose"]["oracle"] == "none"
    assert s["classes"]["prose"]["oracle_ratio"] == 1.0


def test_tuner_ratio_convergence_and_targets() -> None:
    rows = static_rows()
    # code: two exploit requests on baseline, a trial, then fast-code for good
    rows += [tuner_row(0, "none"), tuner_row(1, "none"), tuner_row(0, "fast-code", "trial")]
    rows += [tuner_row(i % 2, "fast-code") for i in range(10)]
    # prose: baseline throughout (a control among them)
    rows += [tuner_row(2, "none"), tuner_row(3, "none", "control"), tuner_row(2, "none")]
    s = summarize(
        rows,
        CLASSES,
        final_policies={"code": FinalPolicy("fast-code"), "prose": FinalPolicy("none")},
    )
    code, prose = s["classes"]["code"], s["classes"]["prose"]
    assert code["converged_after"] == 2 and code["converged"]
    assert code["tuner_ratio_after_convergence"] == pytest.approx(2.0, rel=0.01)
    assert code["tuner_vs_oracle_after_convergence"] == pytest.approx(1.0, rel=0.01)
    assert code["tuner_roles"] == {"exploit": 12, "trial": 1}
    assert prose["converged_after"] == 0
    assert prose["tuner_ratio_after_convergence"] == pytest.approx(1.0, rel=0.01)
    t = s["targets"]
    assert t["requests_to_converge"] == {
        "value": 2,
        "target": "<= 100",
        "met": True,
        "unconverged_classes": [],
    }
    # prose stays at baseline where its oracle is 1.05x: 0.97 of the oracle not reached
    assert t["worst_class_after_convergence"]["met"]
    # the worst class is named, with the requests its figure rests on and their interval
    assert t["worst_class_after_convergence"]["class"] == "prose"
    assert t["worst_class_after_convergence"]["requests"] == 3
    assert prose["tuner_requests_after_convergence"] == 3
    assert code["tuner_requests_after_convergence"] == 11
    low, high = code["tuner_interval_after_convergence"]
    assert low <= code["tuner_ratio_after_convergence"] <= high
    overall = s["overall"]
    assert overall["tuner_requests"] == 16
    # after convergence: code 11 requests at 2x (1 trial + 10), prose 3 at 1x
    late_tok, late_time = 14 * 100, 11 * 500 + 3 * 1000
    base_time = 14 * 1000
    assert overall["tuner_ratio_after_convergence"] == pytest.approx(
        (late_tok / late_time) / (late_tok / base_time), rel=0.01
    )
    assert t["tuner_vs_oracle_after_convergence"]["value"] < 1.0


def test_a_class_that_never_settles_fails_the_convergence_target() -> None:
    rows = static_rows()
    rows += [tuner_row(0, v) for v in ["none", "fast-code", "none", "meh"]]
    s = summarize(rows, CLASSES, final_policies={"code": FinalPolicy("fast-code")})
    code = s["classes"]["code"]
    assert code["converged_after"] == 4 and not code["converged"]
    assert not s["targets"]["requests_to_converge"]["met"]
    assert s["targets"]["requests_to_converge"]["unconverged_classes"] == ["code"]


def test_a_daemon_with_classes_split_by_form_converges_per_form_class() -> None:
    """The daemon's classes are finer than the bench's (``[split] form``): each row is
    judged against the final policy of the daemon class that served it. The chat share
    settled on ``meh``, the completions on ``fast-code``; judged by the shared class's
    policy alone, every chat request would count as unconverged."""
    rows = static_rows()
    plan = [("code/prompt", "none"), ("code/messages", "fast-code"), ("code/prompt", "meh")]
    plan += [("code/prompt", "fast-code"), ("code/messages", "meh")] * 4
    for n, (leaf, variant) in enumerate(plan):
        rows.append(tuner_row(n % 2, variant) | {"daemon_class": leaf})
    finals = {
        "code/prompt": FinalPolicy("fast-code"),
        "code/messages": FinalPolicy("meh", reason="measured"),
        "code": FinalPolicy("fast-code"),
    }
    code = summarize(rows, CLASSES, final_policies=finals)["classes"]["code"]
    assert code["converged_after"] == 3 and code["converged"]
    assert code["final_variant"] == "messages: meh; prompt: fast-code"
    assert code["final_reason"] == "messages: measured; prompt: "
    # one form unsettled: the bench class has not converged
    finals["code/messages"] = FinalPolicy("meh", settled=False)
    assert not summarize(rows, CLASSES, final_policies=finals)["classes"]["code"]["converged"]
    # rows without a daemon class are judged by the bench class's policy, as before
    plain = [{k: v for k, v in r.items() if k != "daemon_class"} for r in rows]
    code = summarize(plain, CLASSES, final_policies=finals)["classes"]["code"]
    assert code["converged_after"] == len(plan) and code["final_variant"] == "fast-code"


def test_failed_requests_are_counted_and_left_out() -> None:
    rows = [*static_rows(), {"arm": "none", "item": 0, "error": "boom"}]
    s = summarize(rows, CLASSES)
    assert s["errors"] == 1 and s["requests"] == len(rows)


def test_without_a_baseline_there_is_nothing_to_compare() -> None:
    rows = [r for r in static_rows() if r["arm"] != "none"]
    with pytest.raises(ValueError, match="baseline"):
        summarize(rows, CLASSES)


def test_a_class_still_off_for_want_of_evidence_has_not_converged() -> None:
    rows = [*static_rows(), *(tuner_row(2, "none") for _ in range(5))]
    unsettled = {"prose": FinalPolicy("none", settled=False, reason="no evidence yet")}
    s = summarize(rows, CLASSES, final_policies=unsettled)
    prose = s["classes"]["prose"]
    assert prose["converged_after"] == 0 and not prose["converged"]
    assert prose["final_reason"] == "no evidence yet"
    assert s["targets"]["requests_to_converge"]["unconverged_classes"] == ["prose"]
    settled = {"prose": FinalPolicy("none", settled=True, reason="kill switch")}
    assert summarize(rows, CLASSES, final_policies=settled)["classes"]["prose"]["converged"]


def test_without_static_arms_the_oracle_target_is_not_judged() -> None:
    """With ``--matrix none`` the per-class oracle is baseline itself: a tuner at 2x of it is
    no finding, so that target is left out; the targets against baseline still stand."""
    rows = [r for r in static_rows() if r["arm"] == "none"]
    rows += [tuner_row(i % 2, "fast-code") for i in range(6)]
    rows += [tuner_row(2 + i % 2, "fast-code") for i in range(6)]
    s = summarize(rows, CLASSES, final_policies={"code": FinalPolicy("fast-code")})
    assert s["overall"]["best_static"] is None
    targets = s["targets"]
    assert "tuner_vs_oracle_after_convergence" not in targets
    assert "tuner_vs_best_static_whole_run" not in targets
    # prose read 0.91x of baseline under fast-code: that target is judged, and missed
    worst = targets["worst_class_after_convergence"]
    assert worst["class"] == "prose" and worst["value"] == pytest.approx(1 / 1.1, rel=0.01)
    assert not worst["met"] and targets["requests_to_converge"]["met"]


def test_a_challenger_is_summarised_like_the_tuner_and_compared_pair_by_pair() -> None:
    """The tuner serves code fast-code from its third request; the challenger stays at
    baseline. Both see the same items in the same order (``repeat`` pairs them)."""
    rows = static_rows()
    stream = [0, 1, 2, 3] * 3
    for k, item in enumerate(stream):
        variant = "fast-code" if CLASSES[item] == "code" and k >= 2 else "none"
        rows.append(tuner_row(item, variant) | {"repeat": k})
        rows.append(tuner_row(item, "none") | {"arm": "challenger", "repeat": k})
    s = summarize(
        rows,
        CLASSES,
        final_policies={"code": FinalPolicy("fast-code"), "prose": FinalPolicy("none")},
        challenger_policies={"code": FinalPolicy("none"), "prose": FinalPolicy("none")},
    )
    overall, code = s["overall"], s["classes"]["code"]
    # the challenger is no static arm, and it does not change the tuner's figures
    assert "challenger" not in overall["arms"] and "challenger" not in s["static_arms"]
    assert (
        overall["tuner_ratio"]
        == summarize(
            [r for r in rows if r["arm"] != "challenger"],
            CLASSES,
            final_policies={"code": FinalPolicy("fast-code"), "prose": FinalPolicy("none")},
        )["overall"]["tuner_ratio"]
    )
    assert overall["challenger_ratio"] == pytest.approx(1.0, rel=0.01)
    assert code["challenger_ratio"] == pytest.approx(1.0, rel=0.01)
    assert code["challenger_final_variant"] == "none" and code["final_variant"] == "fast-code"
    assert overall["side_by_side_pairs"] == len(stream)
    # the same 1200 tokens: the tuner in tuner_s seconds, the challenger in 12
    tuner_s = sum(0.5 if CLASSES[i] == "code" and k >= 2 else 1.0 for k, i in enumerate(stream))
    assert overall["challenger_vs_tuner"] == pytest.approx(tuner_s / 12.0, rel=0.01)
    low, high = overall["challenger_vs_tuner_interval"]
    assert low <= overall["challenger_vs_tuner"] <= high < 1.0
    assert overall["challenger_vs_best_static"] == pytest.approx(
        overall["challenger_ratio"] / overall["best_static_ratio"], rel=0.01
    )
    # the targets judged on the challenger: at baseline where code's oracle is 2x
    theirs, ours = s["challenger_targets"], s["targets"]
    assert theirs["tuner_vs_best_static_whole_run"]["value"] == overall["challenger_vs_best_static"]
    assert theirs["worst_class_after_convergence"]["class"] == "code"
    assert theirs["worst_class_after_convergence"]["value"] == pytest.approx(1.0, rel=0.01)
    # at baseline after convergence: 12 s where the oracle took 6 x 0.5 + 6 x 0.95 s
    assert theirs["tuner_vs_oracle_after_convergence"]["value"] == pytest.approx(8.7 / 12, abs=0.01)
    assert not theirs["tuner_vs_oracle_after_convergence"]["met"]
    assert ours["tuner_vs_oracle_after_convergence"]["value"] > 0.95


def test_side_by_side_by_counts_prices_both_daemons_at_one_cost_per_variant() -> None:
    """Both daemons serve the same variant with the same counts, but the challenger's
    requests ran in slower minutes (every other one 30 % longer): by timing it reads slower,
    by counts the pairs are equal. Then the challenger accepts more drafts on code: by counts
    it reads faster, priced at the cost the variant's requests measured (0.25 of a step)."""
    rows = [r for r in static_rows() if r["arm"] == "none"]  # 10 ms a plain token
    stream = [0, 1, 2, 3] * 4

    def daemon(arm: str, k: int, item: int, accepted: int, ms: float) -> dict[str, Any]:
        return {
            "arm": arm,
            "item": item,
            "repeat": k,
            "tokens": 100,
            "ms": ms,
            "variant": "v",
            "role": "exploit",
            "drafted": 80,
            "accepted": accepted,
        }

    def steps(accepted: int) -> float:  # (n - a + c d) steps of 10 ms, c = 0.25
        return 10 * (100 - accepted + 0.25 * 80)

    for k, item in enumerate(stream):
        rows.append(daemon("tuner", k, item, 40, steps(40)))
        rows.append(daemon("challenger", k, item, 40, steps(40) * (1.3 if k % 2 else 1.0)))
    overall = summarize(rows, CLASSES)["overall"]
    assert overall["challenger_vs_tuner"] < 0.9
    assert overall["challenger_vs_tuner_by_counts"] == pytest.approx(1.0, abs=1e-3)
    # the slow minutes raise the fitted cost, alike for both: equal counts stay equal
    low, high = overall["challenger_vs_tuner_by_counts_interval"]
    assert low == pytest.approx(1.0, abs=1e-3) and high == pytest.approx(1.0, abs=1e-3)

    rows = [r for r in rows if r["arm"] == "none"]
    for k, item in enumerate(stream):
        more = 60 if CLASSES[item] == "code" else 40
        rows.append(daemon("tuner", k, item, 40, steps(40)))
        rows.append(daemon("challenger", k, item, more, steps(more)))
    overall = summarize(rows, CLASSES)["overall"]
    # code: 8 pairs at 80 against 100 steps; prose: 8 pairs at 80 each
    expected = (16 * 80) / (8 * 60 + 8 * 80)
    assert overall["challenger_vs_tuner_by_counts"] == pytest.approx(expected, rel=1e-3)
    assert overall["challenger_vs_tuner"] == pytest.approx(expected, rel=1e-3)


def test_a_run_without_a_challenger_has_no_challenger_fields() -> None:
    rows = [*static_rows(), tuner_row(0, "fast-code"), tuner_row(2, "none")]
    s = summarize(rows, CLASSES)
    assert not [k for k in s["overall"] if k.startswith(("challenger", "side_by_side"))]
    assert s["challenger_targets"] is None
    assert not [k for c in s["classes"].values() for k in c if k.startswith("challenger")]


def test_after_convergence_the_oracle_is_priced_on_the_same_occurrences() -> None:
    """An n-gram table drafts an item's answer the second time it sees it: the oracle arm's
    second request of item 0 ran twice as fast as its first. The tuner converged after its
    first request and served its second as fast as the oracle's second: level with the
    oracle, not 1.33x it (which the oracle's mean over both requests would say)."""
    rows = [r for r in static_rows(repeats=1) if r["item"] == 0]
    rows.append({"arm": "fast-code", "item": 0, "tokens": 100, "ms": 250, "repeat": 1})
    first = tuner_row(0, "none")
    second = tuner_row(0, "fast-code") | {"ms": 250}
    s = summarize(
        [*rows, first, second], CLASSES[:1], final_policies={"code": FinalPolicy("fast-code")}
    )
    code = s["classes"]["code"]
    assert code["converged_after"] == 1 and code["oracle_ratio"] == pytest.approx(
        1000 / 375, rel=1e-3
    )
    assert code["oracle_ratio_after_convergence"] == pytest.approx(4.0)
    assert code["tuner_vs_oracle_after_convergence"] == pytest.approx(1.0)
    assert s["overall"]["oracle_ratio_after_convergence"] == pytest.approx(4.0)


@settings(max_examples=40, deadline=None)
@given(
    factor=st.floats(0.5, 2.0),
    jitter=st.lists(st.floats(0.9, 1.1), min_size=4, max_size=4),
)
def test_same_work_reads_how_much_longer_identical_work_took(
    factor: float, jitter: list[float]
) -> None:
    rows = static_rows(repeats=1)
    for item, j in enumerate(jitter):  # the same work as the fast-code arm, `factor` x as long
        ms = MS["fast-code"][item] * factor * j
        rows.append({**tuner_row(item, "fast-code"), "ms": ms, "drafted": 0, "accepted": 0})
    # other work: a request that drafted, where the static arm did not, is left out
    rows.append({**tuner_row(0, "fast-code"), "ms": 99999.0, "drafted": 10, "accepted": 5})
    found = same_work(rows, "tuner")
    assert found is not None and found["pairs"] == 4
    expected = factor * math.exp(statistics.fmean(math.log(j) for j in jitter))
    assert found["time_ratio"] == pytest.approx(expected, rel=1e-3)
    low, high = found["interval"]
    assert low <= found["time_ratio"] <= high
    assert set(found["by_variant"]) == {"fast-code"}
    extra = sum(MS["fast-code"][i] * (factor * j - 1) for i, j in enumerate(jitter)) / 1000
    assert found["extra_seconds"] == pytest.approx(extra, abs=0.06)


def test_the_summary_says_what_identical_work_took_for_each_daemon() -> None:
    rows = [*static_rows(repeats=1), {**tuner_row(0, "fast-code"), "ms": 550.0, "repeat": 1}]
    rows.append({**tuner_row(1, "none"), "arm": "challenger", "repeat": 0})
    rows.append({**tuner_row(1, "none"), "repeat": 0})
    overall = summarize(rows, CLASSES)["overall"]
    assert overall["tuner_same_work"]["pairs"] == 2
    assert overall["tuner_same_work"]["by_variant"]["fast-code"]["time_ratio"] == 1.1
    assert overall["tuner_same_work"]["by_variant"]["fast-code"]["interval"] is None
    assert overall["challenger_same_work"]["time_ratio"] == 1.0
    # a daemon that never did what a static arm did has nothing to say
    only_other = [*static_rows(repeats=1), {**tuner_row(0, "other"), "ms": 700.0}]
    assert summarize(only_other, CLASSES)["overall"]["tuner_same_work"] is None


def test_the_rows_the_bench_writes_pass_the_row_check() -> None:
    """Rows a real run wrote (tests/data/bench_rows.jsonl) and rows made here."""
    rows_file = Path(__file__).parents[1] / "data" / "bench_rows.jsonl"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert {r["arm"] for r in rows} >= {"none", "tuner", "challenger"}
    mine = [*static_rows(), tuner_row(0, "good"), {"arm": "none", "item": 1, "error": "boom"}]
    for row in mine:
        row.setdefault("class", CLASSES[int(row["item"])])
    for row in rows + mine:
        assert check_row(row) is None, row


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"item": None}, "no 'item'"),
        ({"item": "3"}, "'item' is '3', not int"),
        ({"item": True}, "'item' is True"),
        ({"item": -1}, "below 0"),
        ({"arm": 7}, "'arm' is 7, not str"),
        ({"class": None}, "no 'class'"),
        ({"tokens": None}, "no 'tokens'"),
        ({"ms": "fast"}, "'ms' is 'fast', not int or float"),
        ({"drafted": [1]}, "'drafted' is [1]"),
        ({"repeat": 0.5}, "'repeat' is 0.5, not int"),
        ({"variant": 3}, "'variant' is 3, not str"),
        ({"t": "x"}, "'t' is 'x', not int or float"),
        ({"id": 4}, "'id' is 4, not str"),
    ],
)
def test_a_row_missing_or_mistyping_a_field_says_which(
    change: dict[str, Any], problem: str
) -> None:
    row = {"arm": "none", "item": 0, "class": "code", "tokens": 10, "ms": 5.0, "repeat": 0}
    row = {k: v for k, v in (row | change).items() if v is not None}
    found = check_row(row)
    assert found is not None and problem in found


def test_a_failed_row_needs_no_timings_and_a_non_object_is_named() -> None:
    assert check_row({"arm": "none", "item": 0, "class": "code", "error": "timeout"}) is None
    assert check_row({"arm": "none", "item": 0, "class": "code", "ms": None, "tokens": 3}) == (
        "no 'ms'"
    )
    assert check_row([1, 2]) == "not an object: list"


def test_against_the_best_static_arm_by_counts_drops_the_instances_speed() -> None:
    """Baseline 10 ms a token; the static arm drafts 50 and accepts 40 of 100 tokens in
    700 ms (60 steps and 50 drafted tokens at 0.2 of a step). A tuner doing the same on an
    instance 20 % slower reads 0.83 of it whole-run but 1.0 by counts; a challenger that
    accepts all 50 at the same drafted-token cost reads 70 / 60 both ways."""
    rows: list[dict[str, Any]] = []
    for item in range(4):
        rows.append({"arm": "none", "item": item, "tokens": 100, "ms": 1000.0, "repeat": 0})
        counts = {"tokens": 100, "drafted": 50, "accepted": 40, "repeat": 0}
        rows.append({"arm": "mod", "item": item, "ms": 700.0, "variant": "mod"} | counts)
        rows.append({**tuner_row(item, "mod"), "ms": 840.0} | counts)
        rows.append(
            {**tuner_row(item, "simple"), "arm": "challenger", "ms": 600.0}
            | counts
            | {"accepted": 50}
        )
    overall = summarize(rows, CLASSES)["overall"]
    assert overall["tuner_vs_best_static"] == pytest.approx(700 / 840, abs=1e-4)
    assert overall["tuner_vs_best_static_by_counts"] == 1.0
    assert overall["challenger_vs_best_static"] == pytest.approx(70 / 60, abs=1e-4)
    assert overall["challenger_vs_best_static_by_counts"] == pytest.approx(70 / 60, abs=1e-4)
    assert "tuner_vs_best_static_by_counts" not in summarize(static_rows(), CLASSES)["overall"]
