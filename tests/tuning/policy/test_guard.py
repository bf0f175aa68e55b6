"""The guard's near-ties: two variants compared on the same requests, not on their own
intervals over the class (whose spread between prompts hides a difference of a few %)."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import assume, given
from hypothesis import strategies as st

from tests.tuning.sim import BASE_TOK_S, CODE, config, make
from tuner.records import RequestRecord, Timings
from tuner.stats import Interval
from tuner.tuning.evidence.counts import Counts
from tuner.tuning.policy.guard import choose
from tuner.tuning.pricing.prices import paired_speedup
from tuner.tuning.runtime.engine import Engine
from tuner.upstream.capabilities import Capabilities

COST = 0.45  # what a drafted token costs the simulated machine, in plain steps
HELD, CHALLENGER = "ngram-simple.n3.m8", "ngram-simple.n3.m16"

request = st.tuples(st.integers(1, 256), st.integers(0, 128), st.integers(0, 128)).map(
    lambda t: (t[0], max(t[1], t[2]), min(t[1], t[2], t[0]))
)


def test_a_variant_over_itself_is_one() -> None:
    priced: list[bool] = []

    @given(st.lists(request, min_size=2, max_size=40), st.floats(0.05, 1.0))
    def check(rows: list[Counts], cost: float) -> None:
        found = paired_speedup([(r, r) for r in rows], (cost, 0.02), (cost, 0.02), 1.645)
        assume(found is not None)  # rows that price no speedup at all
        assert found is not None
        priced.append(True)
        assert abs(found.value - 1.0) < 1e-9 and found.low < 1.0 < found.high

    check()
    assert len(priced) >= 50  # the property was checked, not assumed away


def test_accepting_more_of_the_same_drafts_is_faster() -> None:
    """B drafts what A drafts and accepts ``more`` tokens on every request (as far as its
    drafts allow): faster on the same requests, whatever they are."""
    priced: list[bool] = []

    @given(st.lists(request, min_size=2, max_size=40), st.integers(1, 8), st.floats(0.05, 0.9))
    def check(rows: list[Counts], more: int, cost: float) -> None:
        better = [(n, d, min(d, n, a + more)) for n, d, a in rows]
        pairs = list(zip(rows, better, strict=True))
        found = paired_speedup(pairs, (cost, 0.0), (cost, 0.0), 1.645)
        assume(found is not None)
        assert found is not None
        priced.append(True)
        assert found.value >= 1.0 - 1e-12

    check()
    assert len(priced) >= 50


def test_a_paired_win_moves_a_class_its_own_intervals_keep() -> None:
    s = {"held": Interval(1.30, 1.10, 1.50), "b": Interval(1.34, 1.12, 1.58)}
    alone = choose(s, min_gain=1.02, held="held", allowed={"held", "b"})
    assert alone.chosen == "held"  # b's lower bound is below the held one's value
    tie = {"b": Interval(1.03, 0.99, 1.07)}  # the same requests do not resolve it
    assert choose(s, min_gain=1.02, held="held", allowed=set(s), over_held=tie).chosen == "held"
    assert "closest on the same requests: b, 1.030x [0.990, 1.070] of it" in str(
        choose(s, min_gain=1.02, held="held", allowed=set(s), over_held=tie).paired
    )
    win = {"b": Interval(1.03, 1.01, 1.05)}
    moved = choose(s, min_gain=1.02, held="held", allowed=set(s), over_held=win)
    assert moved.chosen == "b" and moved.paired == (
        "moved: 1.030x [1.010, 1.050] of held on the same requests"
    )
    # a paired win of a variant that does not clear the guard moves nothing
    s["b"] = Interval(1.01, 0.99, 1.03)
    assert choose(s, min_gain=1.02, held="held", allowed=set(s), over_held=win).chosen == "held"


def _counts(name: str, prompt: float, edge: float) -> Counts:
    """One request's counts: 64 tokens; the two variants draft alike and accept ``prompt``
    of their drafts (prompts differ widely), the challenger ``edge`` more; others little."""
    if name == "none":
        return (64, 0, 0)
    if name in (HELD, CHALLENGER):
        share = prompt * (1 + edge if name == CHALLENGER else 1.0)
        return (64, 40, min(40, round(40 * share)))
    return (64, 40, round(40 * prompt * 0.3))


def _serve(engine: Engine, rng: random.Random, variant: str, edge: float, paired: bool) -> None:
    """One request ``variant`` answered (whatever the engine would route: the test holds
    the served variant fixed), then its replays."""
    prompt = rng.uniform(0.3, 0.95)
    n, d, a = _counts(variant, prompt, edge)
    tok_s = BASE_TOK_S * n / (n - a + COST * d) * rng.lognormvariate(0.0, 0.03)
    timings = {"predicted_n": n, "predicted_ms": 1000 * n / tok_s, "predicted_per_second": tok_s}
    if d:
        timings |= {"draft_n": d, "draft_n_accepted": a}
    engine.observe(
        RequestRecord(
            id="r",
            ts=0.0,
            endpoint="/v1/completions",
            stream=False,
            status=200,
            proxy_ms=1.0,
            timings=Timings.model_validate(timings),
            class_key=CODE,
            variant=variant,
            role="exploit",
        )
    )
    replays = {v: _counts(v, prompt, edge) for v in engine.variants if v.startswith("ngram-simple")}
    engine.observe_replayed(CODE, variant, replays, (n, d, a) if paired else None)


def test_a_near_tie_the_same_requests_resolve_moves_the_class(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A class serves one variant while another is slower, then the other accepts 12 %
    more of the same drafts (about 5 % faster, never served). Each variant's interval over
    the class spans the wide spread between prompts, so compared alone the class keeps what
    it holds, whatever the prompts; compared on the same requests it moves on nearly every
    draw of them (the unserved variant's cost is still a guess from its draft length)."""
    moved: dict[bool, int] = {False: 0, True: 0}
    for seed in range(8):
        for paired in (False, True):
            engine = make(tmp_path / f"{seed}-{paired}", config(explore_share=0.0), caps)
            rng = random.Random(seed)
            for variant in ["none"] * 4 + [HELD] * 16:
                _serve(engine, rng, variant, -0.1, paired)
            first = engine.classes[CODE].policy
            assert first is not None and first.variant == HELD, first
            for _ in range(40):
                _serve(engine, rng, HELD, 0.12, paired)
            policy = engine.classes[CODE].policy
            assert policy is not None and policy.variant in (HELD, CHALLENGER)
            moved[paired] += policy.variant == CHALLENGER
            if paired:  # the why says how the two stand on the same requests
                assert "on the same requests" in policy.reason, policy.reason
    assert moved[False] == 0 and moved[True] >= 7, moved
