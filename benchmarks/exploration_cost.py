"""Where a bench run's tuner lost time: its requests by role, against the best static arm.

Each daemon request (``tuner``, and ``challenger`` when there is one) is priced against the
static arms' requests of the same prompt: its decode speed over the prompt's mean speed
without speculation (``speed``), and the best static arm's ratio on that prompt
(``static``: the best arm over the whole run, as the bench's ``best_static``) at the same
occurrence: the daemon's k-th request of a prompt against the static arm's k-th (with
repeated prompts an n-gram table that has seen a prompt's answer drafts it the next time,
so every arm's later requests of a prompt run faster than its first; their mean would
charge a daemon's early requests with the static arm's later speed), or, where the static
arm has fewer requests of the prompt, their mean. A request's
loss is ``1 - speed / static``: what it cost, in requests at the static arm's speed, to have
been sent as it was (negative: it gained); ``loss_seconds`` is the same in decode time (its
time less the time it would have taken at the static arm's speed), which is what a run's
tokens per second, and so the bench's whole-run ratio, weighs: a slow request's loss counts
for more than a fast one's. Summed per role (``exploit``, ``trial``,
``control``) that says how much of the gap to the static arm is exploration and how much the
served choice; per spec type for trials; and per quarter of the daemon's stream. With
repeated prompts a stateful drafter pays for exploring twice: ``revisits`` shows what the
best static variant's requests ran at when the prompt's previous request went elsewhere,
and ``served_quarters`` what they ran at, quarter by quarter, against the static arm's;
``table_coverage`` shows acceptance on that variant by how many earlier answers of the same
prompt the serving instance had seen (the static arm's instance sees them all). ``cumulative``
is the run so far against the static arm, and where it has earned its learning back.
``plain_quarters`` does the same through the run on steps no choice can change: per quarter
of the daemon's stream, its requests that drafted nothing, their decode time per token over
the no-speculation arm's on the same prompt.
``same_work`` (``tuner.bench.analyse.same_work``) isolates the serving path: the daemon's
requests that did exactly what a static arm's request of the same prompt did (same variant,
tokens generated, drafted and accepted), and their decode time over that request's; about 1
says the daemon's instances decode identical work as fast as the matrix's, and the gap to
the static arm lies in what it chose. ``opening`` splits the daemon's first ``OPENING``
requests into those it ran without speculation (``plain``: the fitted step's two anchors,
and requests of classes with no policy yet, which ``[guard] opening`` serves
speculatively instead) and the rest.

    python -m benchmarks.exploration_cost DIR [--out FILE.json]
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from benchmarks.common import run_main, usable
from tuner.bench.analyse import charged_seconds as seconds
from tuner.bench.analyse import same_work

DAEMONS = ("tuner", "challenger")
OPENING = 12  # a daemon's first requests, where a fresh engine has no policy yet


def _speed(row: dict[str, Any]) -> float:
    return float(row["tokens"]) / (seconds(row) * 1000.0)


def baselines(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Per prompt id, its mean decode speed without speculation (the ``none`` arm)."""
    speeds: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row["arm"] == "none" and usable(row):
            speeds[row["id"]].append(_speed(row))
    return {i: statistics.fmean(v) for i, v in speeds.items()}


def static_ratios(
    rows: Iterable[dict[str, Any]], base: dict[str, float] | None = None
) -> tuple[dict[str, float], str | None]:
    """Per prompt id, the best static arm's mean speed over the prompt's baseline, and its
    name (the arm with the highest mean ratio over all prompts). ``base``: ``baselines(rows)``
    when the caller has it."""
    rows = [r for r in rows if usable(r) and r["arm"] not in DAEMONS]
    base = baselines(rows) if base is None else base
    arms: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["arm"] != "none" and row["id"] in base:
            arms[row["arm"]][row["id"]].append(_speed(row) / base[row["id"]])
    if not arms:
        return {}, None
    means = {
        arm: statistics.fmean(statistics.fmean(v) for v in by_id.values())
        for arm, by_id in arms.items()
    }
    best = max(means, key=lambda a: means[a])
    out = {i: statistics.fmean(v) for i, v in arms[best].items()}
    return out, best


def occurrences(rows: Iterable[dict[str, Any]], arm: str) -> dict[str, list[float]]:
    """Per prompt id, one arm's requests' decode speeds in the order they ran."""
    found: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row["arm"] == arm and usable(row):
            found[row["id"]].append(_speed(row))
    return found


Priced = list[tuple[dict[str, Any], float, float]]  # (row, speed, static ratio)


def _losses(priced: Priced, key: Callable[[dict[str, Any]], str | None]) -> dict[str, Any]:
    """Requests grouped by ``key(row)`` (None: left out): count, mean speed and static
    ratio, summed loss in requests and in seconds."""
    by: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for row, speed, static in priced:
        if (group := key(row)) is not None:
            by[group].append((speed, static, seconds(row)))
    return {
        group: {
            "requests": len(pairs),
            "speed": round(statistics.fmean(s for s, _, _ in pairs), 3),
            "static": round(statistics.fmean(t for _, t, _ in pairs), 3),
            "loss_requests": round(sum(1 - s / t for s, t, _ in pairs), 1),
            "loss_seconds": round(sum(sec * (1 - s / t) for s, t, sec in pairs), 1),
        }
        for group, pairs in sorted(by.items())
    }


def _plain(row: dict[str, Any]) -> str:
    return "plain" if row.get("variant") == "none" else "speculative"


def _roles(priced: Priced) -> dict[str, Any]:
    return _losses(priced, lambda row: str(row.get("role") or "exploit"))


def revisits(priced: Priced, best: str) -> dict[str, Any]:
    """A stateful drafter (``ngram-mod``) drafts a returning prompt's answer only if its table
    saw it: the daemon's requests served by the best static arm's variant, by what served the
    same prompt's previous request in the daemon's stream (``first``: none did; ``same``:
    that variant; ``other``: a control, a trial or another choice), as in ``_roles``."""
    last: dict[str, str] = {}
    visit: dict[int, str] = {}  # id(row) -> first, same or other
    for row, _, _ in priced:
        pid, variant = row["id"], str(row.get("variant"))
        if variant == best:
            before = last.get(pid)
            visit[id(row)] = "first" if before is None else ("same" if before == best else "other")
        last[pid] = variant
    return _losses(priced, lambda row: visit.get(id(row)))


def _quarters(priced: Priced) -> list[Priced]:
    """The daemon's stream in four equal stretches, in order."""
    n = len(priced)
    return [priced[n * q // 4 : n * (q + 1) // 4] for q in range(4)]


def _by_quarter(priced: Priced, keep: Callable[[dict[str, Any]], bool]) -> list[float | None]:
    """Per quarter of the daemon's stream, the mean speed / static of its requests that
    ``keep`` (None: a quarter without any)."""
    out: list[float | None] = []
    for quarter in _quarters(priced):
        kept = [s / t for row, s, t in quarter if keep(row)]
        out.append(round(statistics.fmean(kept), 3) if kept else None)
    return out


def plain_quarters(priced: Priced) -> list[dict[str, Any] | None]:
    """Per quarter of the daemon's stream, its requests that drafted nothing (whatever
    their variant: every step a plain one): the geometric mean of their decode time per
    token over the no-speculation arm's on the same prompt, and how many (None: a quarter
    without any). The daemon's own instances against the matrix's on plain steps, through
    the run: above 1 slower. Choices cannot move it, so a change from quarter to quarter
    is the instances' speed changing under the daemon, not the tuner learning."""
    out: list[dict[str, Any] | None] = []
    for quarter in _quarters(priced):
        logs = [-math.log(speed) for row, speed, _ in quarter if not row.get("drafted")]
        out.append(
            {"requests": len(logs), "time_ratio": round(math.exp(statistics.fmean(logs)), 3)}
            if logs
            else None
        )
    return out


def served_quarters(priced: Priced, best: str) -> list[float | None]:
    """Per quarter of the daemon's stream, its requests served by the best static arm's own
    variant: mean speed over the static arm's at the same occurrence. The same settings on
    the same prompts, so below 1 where the daemon's instance has learned from fewer answers
    (a stateful drafter's table holds only what its instance served)."""
    return _by_quarter(priced, lambda row: row.get("variant") == best)


def cumulative(priced: Priced, marks: int = 8) -> dict[str, Any]:
    """The run so far, time-weighted as the whole-run ratio is: after each of ``marks``
    equal steps of the daemon's stream, the static arm's decode time for its requests until
    then over theirs (``after``: [requests, ratio]), the same for each step on its own
    (``steps``), and ``break_even``: the fewest requests after which the run so far stays at
    or above 1 to its end (None: it ends below 1; 0: it never fell below). Learning is a cost
    paid once: a run at ``break_even`` requests or longer has earned it back against the
    best static arm, and ``steps`` says whether a longer run would."""
    ours, static = [0.0], [0.0]  # running sums, from 0 requests on
    for row, s, t in priced:
        ours.append(ours[-1] + seconds(row))
        static.append(static[-1] + seconds(row) * s / t)
    n = len(priced)
    cuts = [n * m // marks for m in range(marks + 1)]
    ratios = [static[k] / ours[k] for k in range(1, n + 1)]
    below = [k for k, r in enumerate(ratios, 1) if r < 1.0]
    return {
        "after": [[k, round(ratios[k - 1], 3)] for k in cuts[1:]],
        "steps": [
            round((static[b] - static[a]) / (ours[b] - ours[a]), 3)
            for a, b in itertools.pairwise(cuts)
        ],
        "break_even": None if ratios[-1] < 1.0 else (below[-1] + 1 if below else 0),
    }


SEEN = ((0, "0"), (2, "1-2"), (6, "3-6"))  # earlier answers seen -> label; more: "7+"


def table_coverage(rows: Iterable[dict[str, Any]], variant: str) -> dict[str, Any]:
    """An ``ngram-mod`` table drafts a prompt's answer from the earlier answers of that
    prompt its instance served. Per arm (the static arm of ``variant``, and each daemon's
    requests served by it), greedy and sampled requests apart: accepted tokens per
    generated token by how many earlier requests of the same prompt that instance had
    served (``0``, ``1-2``, ``3-6``, ``7+``). A daemon that spreads a prompt's requests over
    several instances meets it in lower rows than the static arm does."""
    served: dict[tuple[str, str], int] = defaultdict(int)
    found: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for row in rows:
        arm = row["arm"]
        if not usable(row):
            continue
        if arm != variant and (arm not in DAEMONS or row.get("variant") != variant):
            continue
        key = (arm, row["id"])
        seen = served[key]
        served[key] += 1
        label = next((name for most, name in SEEN if seen <= most), "7+")
        form = "sampled" if str(row.get("class", "")).endswith("sampled") else "greedy"
        found[arm][form][label].append(float(row.get("accepted") or 0) / float(row["tokens"]))
    return {
        ("static" if arm == variant else arm): {
            form: {
                label: {"requests": len(v), "accepted_per_token": round(statistics.fmean(v), 3)}
                for label, v in sorted(by.items())
            }
            for form, by in sorted(forms.items())
        }
        for arm, forms in found.items()
    }


def price(rows: list[dict[str, Any]]) -> tuple[str | None, dict[str, Priced]]:
    """The best static arm's name, and per daemon arm with requests its usable requests in
    the order they ran, each with its speed over its prompt's baseline and the best static
    arm's ratio on that prompt at the same occurrence (their mean where it has fewer)."""
    base = baselines(rows)
    static, best = static_ratios(rows, base)
    paired = occurrences(rows, best) if best is not None else {}
    out: dict[str, Priced] = {}
    for arm in DAEMONS:
        priced = []
        seen: dict[str, int] = defaultdict(int)
        for row in rows:
            pid = row["id"]
            if row["arm"] != arm or not usable(row) or pid not in static or pid not in base:
                continue
            k, same = seen[pid], paired.get(pid, [])
            seen[pid] += 1
            ref = same[k] / base[pid] if k < len(same) else static[pid]
            priced.append((row, _speed(row) / base[pid], ref))
        if priced:
            out[arm] = priced
    return best, out


def exploration_cost(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per daemon arm: requests by role (count, mean speed and static ratio, summed loss in
    requests and in seconds), the static arm's decode time over the arm's (``time_over_static``),
    trials by spec type (mean speed / static), each quarter's mean speed / static, the first
    ``OPENING`` requests, ``plain`` and ``speculative``, as by role (``opening``), and
    ``revisits`` (its requests served by the best static arm's variant, by what served their
    prompt's previous request: ``first``, ``same`` or ``other``), and ``served_quarters``
    (those requests' mean speed / static per quarter), and ``cumulative`` (the run so far
    against the static arm, and the request count from which it stays at or above it), and
    ``plain_quarters`` (its requests that drafted nothing against the no-speculation arm's,
    per quarter: the instances' own speed)."""
    best, by_arm = price(rows)
    out: dict[str, Any] = {"best_static": best}
    if best is not None:
        out["table_coverage"] = table_coverage(rows, best)
    for arm, priced in by_arm.items():
        trials: dict[str, list[float]] = defaultdict(list)
        for row, speed, ref in priced:
            if row.get("role") == "trial":
                trials[str(row["variant"]).split(".")[0]].append(speed / ref)
        out[arm] = {
            "requests": len(priced),
            "speed_over_static": round(statistics.fmean(s / t for _, s, t in priced), 3),
            # the static arm's decode time for these requests over theirs: tokens per second
            "time_over_static": round(
                sum(seconds(r) * s / t for r, s, t in priced)
                / sum(seconds(r) for r, _, _ in priced),
                3,
            ),
            "roles": _roles(priced),
            "revisits": revisits(priced, best) if best is not None else {},
            "served_quarters": served_quarters(priced, best) if best is not None else [],
            "trials_by_type": {
                t: {"requests": len(v), "speed_over_static": round(statistics.fmean(v), 3)}
                for t, v in sorted(trials.items())
            },
            "quarters": _by_quarter(priced, lambda _: True),
            "plain_quarters": plain_quarters(priced),
            "cumulative": cumulative(priced) if len(priced) >= 8 else None,
            "opening": _losses(priced[:OPENING], _plain),
            "same_work": same_work(rows, arm),
        }
    return out


def main() -> None:
    run_main(__doc__, exploration_cost)


if __name__ == "__main__":
    main()
