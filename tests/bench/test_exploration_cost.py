"""``benchmarks/exploration_cost.py``: a daemon's requests by role against the best static arm."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.exploration_cost import exploration_cost, static_ratios


def row(
    arm: str, pid: str, speed: float, role: str | None = None, variant: str = "none"
) -> dict[str, Any]:
    out: dict[str, Any] = {"arm": arm, "id": pid, "item": pid, "tokens": 100,
                           "ms": 1000 * 100 / speed, "variant": variant}  # fmt: skip
    return out | ({"role": role} if role else {})


def _run() -> list[dict[str, Any]]:
    rows = []
    for pid, base in (("a", 50.0), ("b", 100.0)):
        rows += [row("none", pid, base), row("none", pid, base)]
        rows += [row("good", pid, 2 * base), row("poor", pid, 1.2 * base)]
        rows += [row("tuner", pid, 2 * base, "exploit", "ngram-mod.x")]  # as good as static
        rows += [row("tuner", pid, base, "control")]  # costs half a request
        rows += [row("tuner", pid, base / 2, "trial", "ngram-map-k.y")]  # costs 3/4
    rows.append({"arm": "tuner", "id": "a", "tokens": 0, "ms": 0, "error": "boom"})
    return rows


def test_the_best_static_arm_is_the_reference_per_prompt() -> None:
    static, best = static_ratios(_run())
    assert best == "good" and static == {"a": pytest.approx(2.0), "b": pytest.approx(2.0)}


def test_losses_add_up_by_role_and_type() -> None:
    found = exploration_cost(_run())
    assert found["best_static"] == "good" and "challenger" not in found
    tuner = found["tuner"]
    assert tuner["requests"] == 6
    roles = tuner["roles"]
    assert roles["exploit"] == {
        "requests": 2, "speed": 2.0, "static": 2.0, "loss_requests": 0.0, "loss_seconds": 0.0
    }  # fmt: skip
    assert roles["control"]["loss_requests"] == pytest.approx(1.0)  # 2 x 0.5
    assert roles["trial"]["loss_requests"] == pytest.approx(1.5)  # 2 x 0.75
    # in time: a control of 100 tokens took 2 s (a) and 1 s (b) where the static arm took
    # 1 s and 0.5 s; a trial 4 s and 2 s: the slow prompt's loss weighs double
    assert roles["control"]["loss_seconds"] == pytest.approx(1.5)
    assert roles["trial"]["loss_seconds"] == pytest.approx(4.5)
    assert tuner["time_over_static"] == pytest.approx(4.5 / 10.5, abs=1e-3)
    assert tuner["trials_by_type"] == {"ngram-map-k": {"requests": 2, "speed_over_static": 0.25}}
    assert tuner["speed_over_static"] == pytest.approx((1 + 0.5 + 0.25) / 3, abs=1e-3)
    assert len(tuner["quarters"]) == 4
    opening = tuner["opening"]  # the first requests, by whether they speculated
    assert opening["plain"]["requests"] == 2 and opening["speculative"]["requests"] == 4
    assert opening["plain"]["loss_seconds"] == roles["control"]["loss_seconds"]


def test_a_run_without_static_arms_has_no_reference() -> None:
    assert exploration_cost([row("none", "a", 50.0), row("tuner", "a", 60.0, "exploit")]) == {
        "best_static": None
    }


def test_a_request_is_priced_against_the_static_arms_request_at_the_same_occurrence() -> None:
    """With repeated prompts every arm's later requests of a prompt run faster (its n-gram
    table has seen the answer): a daemon's first request is compared with the static arm's
    first, its second with the second; past the static arm's requests, with their mean."""
    rows = [row("none", "a", 50.0), row("good", "a", 60.0), row("good", "a", 140.0)]
    rows += [row("tuner", "a", 60.0, "exploit"), row("tuner", "a", 100.0, "exploit")]
    rows.append(row("tuner", "a", 100.0, "trial"))  # a third: against the mean, 2.0
    roles = exploration_cost(rows)["tuner"]["roles"]
    # the first as fast as the static arm's first; the second at 2.0 against its 2.8
    assert roles["exploit"]["loss_requests"] == pytest.approx(1 - 2.0 / 2.8, abs=0.05)
    assert roles["exploit"]["static"] == pytest.approx((1.2 + 2.8) / 2)
    assert roles["trial"]["static"] == pytest.approx(2.0)


def test_revisits_split_the_best_variants_requests_by_what_served_the_prompt_before() -> None:
    """The tuner serves the static arm's variant three times on prompt a: first, after itself,
    and after a control; the one after the control ran slower (its table missed an answer)."""
    rows = [row("none", "a", 50.0), row("good", "a", 100.0)]
    rows += [
        row("tuner", "a", 100.0, "exploit", "good"),
        row("tuner", "a", 100.0, "exploit", "good"),
    ]
    rows += [row("tuner", "a", 50.0, "control"), row("tuner", "a", 40.0, "exploit", "good")]
    found = exploration_cost(rows)["tuner"]["revisits"]
    assert set(found) == {"first", "same", "other"}
    assert found["first"]["requests"] == found["same"]["requests"] == 1
    assert found["same"]["loss_requests"] == 0.0
    assert found["other"] == {
        "requests": 1, "speed": 0.8, "static": 2.0, "loss_requests": 0.6, "loss_seconds": 1.5
    }  # fmt: skip


def test_served_quarters_compare_the_best_variants_own_requests_quarter_by_quarter() -> None:
    """Eight tuner requests, two per quarter: the static arm's variant at half the static
    arm's speed in the first quarter (a cold table), at its speed in the last; quarters
    where it served nothing else are None."""
    rows = [row("none", "a", 50.0), row("good", "a", 100.0)]
    rows += [row("tuner", "a", 50.0, "exploit", "good"), row("tuner", "a", 50.0, "control")]
    rows += [row("tuner", "a", 50.0, "control")] * 2
    rows += [row("tuner", "a", 50.0, "trial", "ngram-map-k.y")] * 2
    rows += [row("tuner", "a", 100.0, "exploit", "good")] * 2
    found = exploration_cost(rows)["tuner"]["served_quarters"]
    assert found == [0.5, None, None, 1.0]


def test_plain_quarters_price_undrafted_requests_against_the_baseline_arm() -> None:
    """Eight tuner requests, two per quarter. Undrafted ones at 40 tok/s against the
    baseline's 50 (1.25 x its time per token) in the first quarter, at 100 (0.5 x) in the
    last, whatever their variant; a request that drafted is left out, and a quarter with
    none undrafted is None."""
    rows = [row("none", "a", 50.0), row("good", "a", 100.0)]
    slow = row("tuner", "a", 40.0, "exploit", "ngram-simple.n6.m8") | {"drafted": 0}
    drafted = row("tuner", "a", 100.0, "exploit", "good") | {"drafted": 30, "accepted": 20}
    rows += [slow, row("tuner", "a", 40.0, "control")]
    rows += [drafted] * 4
    rows += [row("tuner", "a", 100.0, "control"), drafted]
    found = exploration_cost(rows)["tuner"]["plain_quarters"]
    assert found == [
        {"requests": 2, "time_ratio": 1.25},
        None,
        None,
        {"requests": 1, "time_ratio": 0.5},
    ]


def test_cumulative_finds_where_the_run_has_earned_its_learning_back() -> None:
    """Against a static arm at 2x: three trials at 0.8x first (2.5 s each for 100 tokens
    where the static arm takes 1 s), then requests at 2.5x (0.8 s against 1 s). After 3 + k
    requests the static arm's time is 3 + k, the tuner's 7.5 + 0.8 k: behind until k = 23."""
    head = [row("none", "a", 50.0), row("good", "a", 100.0)]
    learn = [row("tuner", "a", 40.0, "trial", "ngram-map-k.y")] * 3

    def cumulative(exploits: int) -> dict[str, Any]:
        rows = head + learn + [row("tuner", "a", 125.0, "exploit", "good")] * exploits
        found: dict[str, Any] = exploration_cost(rows)["tuner"]["cumulative"]
        return found

    short = cumulative(12)
    assert short["break_even"] is None  # 15 / 17.1 at the end
    assert [k for k, _ in short["after"]] == [1, 3, 5, 7, 9, 11, 13, 15]
    assert short["after"][1] == [3, 0.4]  # 3 s of static time in 7.5 s
    assert short["after"][-1][1] == pytest.approx(15 / 17.1, abs=1e-3)
    # each step on its own: the trials (requests 1 and 2-3) at 0.4, then exploits at 1.25
    assert short["steps"] == [0.4, 0.4] + [1.25] * 6
    assert cumulative(30)["break_even"] == 26  # 26 / 25.9 from there, 25 / 25.1 before
    ahead = exploration_cost(head + [row("tuner", "a", 125.0, "exploit", "good")] * 8)
    assert ahead["tuner"]["cumulative"]["break_even"] == 0


def test_table_coverage_counts_the_earlier_answers_each_instance_served() -> None:
    """Prompt s (sampled) three times on the static arm, and on the daemon once on the
    static arm's variant, once on a trial, once on the variant again: the daemon's instance
    had seen one earlier answer where the static arm's had seen two."""

    def sampled(arm: str, accepted: int, variant: str = "good") -> dict[str, Any]:
        return row(arm, "s", 100.0, variant=variant) | {"class": "chat/fresh/sampled",
                                                        "accepted": accepted}  # fmt: skip

    rows = [row("none", "s", 50.0), sampled("good", 10), sampled("good", 30), sampled("good", 50)]
    rows += [sampled("tuner", 10), sampled("tuner", 0, "ngram-simple.x"), sampled("tuner", 40)]
    rows.append(row("tuner", "g", 100.0, "exploit", "good"))  # greedy, no static request
    found = exploration_cost(rows)["table_coverage"]
    assert found["static"] == {
        "sampled": {
            "0": {"requests": 1, "accepted_per_token": 0.1},
            "1-2": {"requests": 2, "accepted_per_token": 0.4},
        }
    }
    assert found["tuner"]["sampled"] == {
        "0": {"requests": 1, "accepted_per_token": 0.1},
        "1-2": {"requests": 1, "accepted_per_token": 0.4},
    }
    assert found["tuner"]["greedy"] == {"0": {"requests": 1, "accepted_per_token": 0.0}}
