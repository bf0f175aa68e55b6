"""Optuna studies, one per (model, hardware, class), in one SQLite file in the state dir.

Driven with ask/tell from live traffic: ``ask`` returns the next variant to try
(enqueued prior picks first, then TPE over the class's search space), ``tell``
reports its measured speedup over baseline, or that it was stopped early. The
file is in WAL mode so a kill -9 during a write leaves it intact;
``optuna-dashboard sqlite:///<state>/studies.db`` opens it.

The study name carries a hash of the search space: a changed space starts a new
study instead of clashing with the old distributions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.tuning.variants import ParamValue, Variant

__all__ = ["StudyBook", "TrialRecord", "study_name"]

SPEC_TYPE = "spec_type"
Space = Mapping[str, Mapping[str, Sequence[ParamValue]]]

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


def _params_of(variant: Variant) -> dict[str, Any]:
    return {SPEC_TYPE: variant.spec_type} | {
        f"{variant.spec_type}.{p}": v for p, v in variant.params
    }


class StudyBook:
    """The studies of one model on one machine; thread-safe (one lock around Optuna)."""

    def __init__(self, path: Path, scope: str, *, seed: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA journal_mode=WAL")
        self.path = path
        self.scope = scope
        self.seed = seed
        self.storage = optuna.storages.RDBStorage(
            f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": 30}}
        )
        self._studies: dict[str, optuna.Study] = {}
        self._lock = threading.Lock()

    def study(self, class_key: str, space: Space) -> optuna.Study:
        name = study_name(self.scope, class_key, space)
        with self._lock:
            found = self._studies.get(name)
            if found is None:
                seed = None
                if self.seed is not None:
                    seed = self.seed + int(hashlib.sha256(class_key.encode()).hexdigest()[:6], 16)
                found = optuna.create_study(
                    study_name=name,
                    storage=self.storage,
                    direction="maximize",
                    sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
                    load_if_exists=True,
                )
                self._studies[name] = found
            return found

    def enqueue(self, class_key: str, space: Space, variants: Sequence[Variant]) -> None:
        study = self.study(class_key, space)
        with self._lock:
            for variant in variants:
                study.enqueue_trial(_params_of(variant), skip_if_exists=True)

    def ask(self, class_key: str, space: Space) -> tuple[int, Variant]:
        """Start a trial; the variant it stands for."""
        study = self.study(class_key, space)
        with self._lock:
            trial = study.ask()
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
        class_key: str,
        space: Space,
        number: int,
        value: float | None,
        *,
        pruned: bool = False,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        """Finish a trial: its value, or pruned (stopped early), or failed (value None)."""
        study = self.study(class_key, space)
        with self._lock:
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
            if self.storage.get_trial(trial_id).state.is_finished():
                return  # told already (a crash's restart failed it): keep what it says
            for key, val in (attrs or {}).items():
                self.storage.set_trial_user_attr(trial_id, key, val)
            if pruned:
                study.tell(number, state=TrialState.PRUNED)
            elif value is None:
                study.tell(number, state=TrialState.FAIL)
            else:
                study.tell(number, value)

    def fail_running(self, class_key: str, space: Space) -> int:
        """Mark trials left running by a stop or crash as failed; how many."""
        study = self.study(class_key, space)
        with self._lock:
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            for trial in running:
                study.tell(trial.number, state=TrialState.FAIL)
            return len(running)

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
