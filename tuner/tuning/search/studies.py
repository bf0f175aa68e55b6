"""Optuna studies, one per (model, hardware, class): in a SQLite file in the state dir, or
in a fleet's shared database (``TUNER_STORAGE_URL``).

Driven with ask/tell from live traffic: ``ask`` returns the next variant to try
(enqueued prior picks first, then TPE over the class's search space), ``tell``
reports its measured speedup over baseline, or that it was stopped early. The
file is in WAL mode so a kill -9 during a write leaves it intact;
``optuna-dashboard sqlite:///<state>/studies.db`` opens it.

The study name carries a hash of the search space: a changed space starts a new
study instead of clashing with the old distributions.

On a shared database several daemons ask the same study; Optuna hands each waiting or
new trial to one of them. Each running trial carries a heartbeat (``beat``), and a trial
whose daemon died is failed once its heartbeat is ``GRACE_S`` old, not at the next start
(which would fail the other daemons' running trials). The database is reached lazily, so a
daemon starts while it is down; each call then raises, and its caller logs and goes on. A
local SQLite file is opened at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.tuning.variants import ParamValue, Variant

__all__ = ["ASKS", "StudyBook", "StudyHandle", "TrialRecord", "study_name"]

SPEC_TYPE = "spec_type"
Space = Mapping[str, Mapping[str, Sequence[ParamValue]]]

ASKS = 8  # asks per trial, telling each already measured variant its value
HEARTBEAT_S = 30  # a running trial's heartbeat, on a shared database
GRACE_S = 180  # a trial whose heartbeat is this old is failed (its daemon died)

optuna.logging.set_verbosity(logging.WARNING)
optuna.logging.disable_default_handler()
optuna.logging.enable_propagation()


def space_digest(space: Space) -> str:
    canonical = json.dumps(
        {k: {p: list(v) for p, v in space[k].items()} for k in sorted(space)}, sort_keys=True
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:8]


def study_name(scope: str, class_key: str, space: Space) -> str:
    return f"{scope}:{class_key}:{space_digest(space)}"


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """One finished or running trial, for the report's history view."""

    number: int
    variant: str
    state: str
    value: float | None
    requests: int | None
    started: str | None
    finished: str | None


def _params_of(variant: Variant, space: Space) -> dict[str, Any]:
    """A variant as the study's parameters; ``autotune`` stated where the space has it (a
    suggestion left open there would be the sampler's to turn on or off)."""
    params = {f"{variant.spec_type}.{p}": v for p, v in variant.params}
    if "autotune" in space.get(variant.spec_type, {}):
        params[f"{variant.spec_type}.autotune"] = int(variant.autotuned)
    return {SPEC_TYPE: variant.spec_type} | params


def sqlalchemy_url(url: str) -> str:
    """A ``postgresql://`` URL as SQLAlchemy's name for the psycopg 3 driver.

    >>> sqlalchemy_url("postgresql://tuner@db:5432/tuner")
    'postgresql+psycopg://tuner@db:5432/tuner'
    """
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


@contextmanager
def _heartbeats() -> Iterator[None]:
    """Optuna calls heartbeats experimental (since 2.9) and meant for ``optimize``; this
    ask-and-tell use of them is what they are for across processes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)
        yield


def _fail_stale(study: optuna.Study) -> None:
    with _heartbeats():
        optuna.storages.fail_stale_trials(study)


class StudyBook:
    """The studies of one model on one machine; thread-safe (one lock around Optuna).

    ``where``: the SQLite file of this state dir, or a shared database's URL."""

    def __init__(self, where: Path | str, scope: str, *, seed: int | None = None) -> None:
        self.shared = isinstance(where, str)
        if isinstance(where, Path):
            where.parent.mkdir(parents=True, exist_ok=True)
            with sqlite3.connect(where) as db:
                db.execute("PRAGMA journal_mode=WAL")
        self.where = where
        self.scope = scope
        self.seed = seed
        self._storage: optuna.storages.RDBStorage | None = None
        self._handles: dict[str, StudyHandle] = {}
        self._running: set[int] = set()  # trial ids this process runs (heartbeats)
        self._last_beat = 0.0
        self._lock = threading.RLock()
        if not self.shared:  # a local file opens now, as it always can
            _ = self.storage

    @property
    def storage(self) -> optuna.storages.RDBStorage:
        """Optuna's storage, connected on first use (raises while the database is down)."""
        if self._storage is None:
            if isinstance(self.where, Path):
                self._storage = optuna.storages.RDBStorage(
                    f"sqlite:///{self.where}", engine_kwargs={"connect_args": {"timeout": 30}}
                )
            else:
                with _heartbeats():
                    self._storage = optuna.storages.RDBStorage(
                        sqlalchemy_url(self.where),
                        engine_kwargs={
                            "pool_pre_ping": True,
                            "connect_args": {"connect_timeout": 5},
                        },
                        heartbeat_interval=HEARTBEAT_S,
                        grace_period=GRACE_S,
                    )
        return self._storage

    def open(self, class_key: str, space: Space) -> StudyHandle:
        """The study of a class over a search space: one handle per study and process."""
        name = study_name(self.scope, class_key, space)
        with self._lock:
            found = self._handles.get(name)
            if found is None:
                seed = None
                if self.seed is not None:
                    seed = self.seed + int(hashlib.sha256(class_key.encode()).hexdigest()[:6], 16)
                study = optuna.create_study(
                    study_name=name,
                    storage=self.storage,
                    direction="maximize",
                    sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
                    load_if_exists=True,
                )
                found = self._handles[name] = StudyHandle(self, study, space)
            return found

    def close(self) -> None:
        """Close the storage's connections (reopened if used again)."""
        with self._lock:
            if self._storage is not None:
                self._storage.remove_session()
                self._storage.engine.dispose()
                self._storage = None
                self._handles.clear()

    def beat(self) -> None:
        """Renew the heartbeat of each trial this process runs (shared database only), at
        most three times per ``HEARTBEAT_S``."""
        with self._lock:
            now = time.monotonic()
            if now - self._last_beat < HEARTBEAT_S / 3:
                return
            self._last_beat = now
            for trial_id in sorted(self._running):
                self.storage.record_heartbeat(trial_id)

    def history(self, class_key: str, *, any_scope: bool = False) -> list[TrialRecord]:
        """Every trial of every study of this class (any search space), oldest first.

        ``any_scope``: of every model and machine in the file, not only this book's.
        """
        out: list[TrialRecord] = []
        with self._lock:
            for summary in optuna.get_all_study_summaries(self.storage, include_best_trial=False):
                parts = summary.study_name.rsplit(":", 2)  # scope:class:space-digest
                if len(parts) != 3 or parts[1] != class_key:
                    continue
                if parts[0] != self.scope and not any_scope:
                    continue
                study = optuna.load_study(study_name=summary.study_name, storage=self.storage)
                for t in study.get_trials(deepcopy=False):
                    out.append(
                        TrialRecord(
                            number=t.number,
                            variant=str(t.user_attrs.get("variant", "?")),
                            state=t.state.name.lower(),
                            value=t.value if t.value is not None else t.user_attrs.get("speedup"),
                            requests=t.user_attrs.get("requests"),
                            started=t.datetime_start.isoformat() if t.datetime_start else None,
                            finished=t.datetime_complete.isoformat()
                            if t.datetime_complete
                            else None,
                        )
                    )
        return sorted(out, key=lambda r: (r.started or "", r.number))


class StudyHandle:
    """One class's study over one search space, driven with ask and tell (thread-safe)."""

    def __init__(self, book: StudyBook, study: optuna.Study, space: Space) -> None:
        self.book = book
        self.study = study
        self.space = space
        self._checked = False  # stale trials failed once per process, at the first ask

    def next(
        self, suggest: Variant | None = None, known: Mapping[str, float] | None = None
    ) -> tuple[int, Variant]:
        """Start the next trial; its number and the variant it stands for.

        Trials a stopped or killed process left running are failed first; ``suggest`` is
        put ahead of the sampler's own choice; a variant in ``known`` (measured over a
        trial's worth of requests already: its speedup) is told its value at once and the
        study asked again, up to ``ASKS`` times, after which the last answer runs again.
        """
        if not self._checked:
            self.fail_running()
            self._checked = True
        if suggest is not None:
            with self.book._lock:
                self.study.enqueue_trial(_params_of(suggest, self.space), skip_if_exists=True)
        known = known or {}
        for attempt in range(ASKS):
            number, variant = self._ask()
            value = known.get(variant.name)
            if value is None or attempt == ASKS - 1:
                return number, variant
            self.tell(number, value, attrs={"reused": True})
        raise AssertionError("unreachable: the last ask returns")

    def _ask(self) -> tuple[int, Variant]:
        book, study, space = self.book, self.study, self.space
        with book._lock:
            if book.shared:
                _fail_stale(study)
            with _heartbeats():
                trial = study.ask()
            if book.shared:
                book.storage.record_heartbeat(trial._trial_id)
                book._running.add(trial._trial_id)
            spec_type = trial.suggest_categorical(SPEC_TYPE, sorted(space))
            params = {
                p: trial.suggest_categorical(f"{spec_type}.{p}", list(values))
                for p, values in space[spec_type].items()
            }
            variant = Variant.of(str(spec_type), params)
            trial.set_user_attr("variant", variant.name)
            return trial.number, variant

    def tell(
        self,
        number: int,
        value: float | None,
        *,
        pruned: bool = False,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        """Finish a trial: its value, or pruned (stopped early), or failed (value None)."""
        book, study = self.book, self.study
        with book._lock:
            storage = book.storage
            trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
            book._running.discard(trial_id)
            if storage.get_trial(trial_id).state.is_finished():
                return  # told already (a crash's restart failed it): keep what it says
            for key, val in (attrs or {}).items():
                storage.set_trial_user_attr(trial_id, key, val)
            if pruned:
                study.tell(number, state=TrialState.PRUNED)
            elif value is None:
                study.tell(number, state=TrialState.FAIL)
            else:
                study.tell(number, value)

    def fail_running(self) -> int:
        """Mark trials left running by a stop or crash as failed; how many. On a shared
        database only those whose heartbeat stopped: the others are other daemons' trials."""
        with self.book._lock:
            if self.book.shared:
                _fail_stale(self.study)
                return 0
            running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            for trial in running:
                self.study.tell(trial.number, state=TrialState.FAIL)
            return len(running)
