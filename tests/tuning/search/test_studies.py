"""One class's study through its handle: stale trials, suggestions, values known already."""

from __future__ import annotations

from pathlib import Path

from tuner.tuning.search.studies import ASKS, StudyBook
from tuner.tuning.variants import Variant

KEY = "code/echo/greedy"
SPACE = {"ngram-simple": {"size_n": [3, 4], "size_m": [8, 16]}}


def states(book: StudyBook) -> list[str]:
    return [r.state for r in book.history(KEY)]


def test_the_first_ask_fails_what_a_killed_process_left_running(tmp_path: Path) -> None:
    StudyBook(tmp_path / "studies.db", "s").open(KEY, SPACE).next()  # then killed
    book = StudyBook(tmp_path / "studies.db", "s")
    handle = book.open(KEY, SPACE)
    assert book.open(KEY, SPACE) is handle  # one handle per study and process
    number, _ = handle.next()
    assert states(book) == ["fail", "running"]
    handle.next()  # later asks leave this process's own trials alone
    assert states(book) == ["fail", "running", "running"]
    handle.tell(number, 1.2)
    assert states(book)[1] == "complete"


def test_a_suggestion_runs_first_and_a_known_value_is_told_not_served(tmp_path: Path) -> None:
    """A suggested variant is the next trial; one the class has measured already is told
    its value and the study asked again, so a trial is always something to serve."""
    book = StudyBook(tmp_path / "studies.db", "s", seed=1)
    handle = book.open(KEY, SPACE)
    pick = Variant.of("ngram-simple", {"size_n": 4, "size_m": 16})
    number, variant = handle.next(pick)
    assert variant == pick
    handle.tell(number, 1.3)
    every = [
        Variant.of("ngram-simple", {"size_n": n, "size_m": m}) for n in (3, 4) for m in (8, 16)
    ]
    known = {v.name: 1.1 for v in every if v != every[0]}
    number, variant = handle.next(known=known)
    records = book.history(KEY)
    reused = [r for r in records if r.state == "complete" and r.value == 1.1]
    assert variant.name not in known or len(reused) == ASKS - 1
    assert all(r.variant in known for r in reused)
    assert records[-1].number == number and records[-1].state == "running"


def test_a_suggestion_keeps_its_autotune_setting_where_the_space_has_one(
    tmp_path: Path,
) -> None:
    """On an engine with its own autotune, a suggested fixed setting stays fixed and a
    suggested autotune variant runs autotuned: neither is left to the sampler."""
    space = {"ngram-mod": {"n_match": [12, 24], "n_max": [16, 64], "autotune": [0, 1]}}
    handle = StudyBook(tmp_path / "studies.db", "s", seed=1).open(KEY, space)
    suggestions = [
        Variant.of("ngram-mod", {"n_match": 12, "n_max": 16}),
        Variant.of("ngram-mod", {"n_match": 24, "autotune": 1}),
        Variant.of("ngram-mod", {"n_match": 24, "n_max": 64}),
        Variant.of("ngram-mod", {"n_match": 12, "autotune": 1}),
    ]
    for suggest in suggestions:
        number, variant = handle.next(suggest)
        assert variant == suggest
        handle.tell(number, 1.0)
