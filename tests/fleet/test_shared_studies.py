"""One Optuna study per class shared by several daemons, on a real PostgreSQL server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
import sqlalchemy.exc

from tuner.tuning.search import studies
from tuner.tuning.search.studies import StudyBook
from tuner.tuning.variants import Variant

SPACE = {
    "ngram-simple": {"size_n": [2, 3, 4], "size_m": [8, 16, 48]},
    "ngram-mod": {"n_match": [12, 24], "n_max": [16, 64]},
}
KEY = "code/echo/greedy"


@pytest.fixture
def books(pg_url: str) -> Iterator[Callable[..., StudyBook]]:
    made: list[StudyBook] = []

    def book(seed: int | None = None) -> StudyBook:
        made.append(StudyBook(pg_url, "m@hw@b", seed=seed))
        return made[-1]

    yield book
    for found in made:
        found.close()


def states(book: StudyBook) -> list[str]:
    return [r.state for r in book.history(KEY)]


def test_daemons_never_run_the_same_trial(books: Callable[..., StudyBook]) -> None:
    a, b = books(1), books(2)
    pick = Variant.of("ngram-simple", {"size_n": 3, "size_m": 16})
    ha, hb = a.open(KEY, SPACE), b.open(KEY, SPACE)
    # the same pick from the prior, suggested by both: queued once
    asked = [ha.next(pick), hb.next(pick), ha.next(), hb.next()]
    numbers = [n for n, _ in asked]
    assert len(set(numbers)) == 4
    assert [v for _, v in asked].count(pick) == 1  # the queued trial went to one of them
    for handle, (number, _) in zip([ha, hb, ha, hb], asked, strict=True):
        handle.tell(number, 1.1)
    assert states(a) == ["complete"] * 4 and states(b) == states(a)


def test_a_dead_daemons_trial_is_failed_after_its_heartbeat_stops(
    books: Callable[..., StudyBook], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(studies, "HEARTBEAT_S", 1)
    monkeypatch.setattr(studies, "GRACE_S", 2)
    dead, alive, other = books(), books(), books()
    dead.open(KEY, SPACE).next()  # its daemon is killed with -9: no more heartbeats
    number, _ = alive.open(KEY, SPACE).next()
    other.open(KEY, SPACE).fail_running()  # at once: both are within their grace
    assert states(other) == ["running", "running"]
    for _ in range(4):
        time.sleep(1)
        alive.beat()
    other.open(KEY, SPACE).fail_running()
    assert states(other) == ["fail", "running"]
    alive.open(KEY, SPACE).tell(number, 1.2)
    assert states(other) == ["fail", "complete"]


def test_a_study_book_starts_while_the_database_is_down() -> None:
    book = StudyBook("postgresql://tuner@127.0.0.1:9/none", "m@hw@b")  # nothing listens on 9
    with pytest.raises((sqlalchemy.exc.OperationalError, psycopg.Error)):
        book.open(KEY, SPACE)
    book.close()
