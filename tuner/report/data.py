"""What ``tuner report`` shows, computed from the state dir's files. Pure except ``load_*``.

The source is ``<state>/policies.json`` (written atomically by the daemon at most
every few seconds, so reading it while the daemon runs is safe) and, for trial
histories, the Optuna studies in ``<state>/studies.db`` (SQLite in WAL mode:
readers never block the daemon).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.classify.classes import ROOT
from tuner.engines.choice import CHOICE_FILE, load_choice
from tuner.errors import TunerError
from tuner.records import CLIENT_GONE, RequestRecord, read_records
from tuner.report.outlook import Outlook
from tuner.stats import Z90, Interval, ratio_interval, wilson
from tuner.tuning.runtime.policy_file import POLICY_FILE, read_document, study_scope
from tuner.tuning.variants import BASELINE

if TYPE_CHECKING:
    from tuner.tuning.search.studies import TrialRecord

__all__ = [
    "SCHEMA",
    "ArmRow",
    "ClassRow",
    "Report",
    "build_report",
    "load_histories",
    "load_history",
    "load_report",
]

SCHEMA = "spec-tuner/report/1"


@dataclass(frozen=True, slots=True)
class ArmRow:
    """One variant's evidence in one class (the plot's alpha-by-variant panel)."""

    variant: str
    requests: int
    alpha: float | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    predicted: float | None  # the speedup model's prior for this class
    replayed: int = 0  # requests other variants served, replayed through this one


@dataclass(frozen=True, slots=True)
class ClassRow:
    """One class: its policy with the evidence behind it, and its traffic counters."""

    class_key: str
    variant: str
    speculation: bool
    reason: str
    kill_switch: bool
    override: bool
    alpha: float | None
    alpha_low: float | None
    alpha_high: float | None
    accepted_length: float | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    predicted_speedup: float | None
    requests: int  # requests of this class routed (its traffic)
    evidence_requests: int  # measured requests behind the policy
    explored: int
    exploration_share: float | None
    exploration_cost: float | None  # decode time exploring cost, in the class's requests
    trials: int
    converged: bool
    since: float | None
    served_by: str | None  # whose policy its requests use (itself or a parent)
    prompt_cached: int = 0  # prompt tokens the server's cache held
    prompt_processed: int = 0  # ... and those it processed
    prompt_tok_s: float | None = None  # how fast it processed them
    # conversations' later turns kept on the instance holding their history, and moved (why)
    turns_stayed: int = 0
    turns_moved: dict[str, int] = field(default_factory=dict)
    turns_trials: int = 0  # kept turns that ran a trial on the instance holding them
    # the load its requests met: in flight as each arrived (mean, most), of its variant as
    # each was sent (mean, most: the batch its instance decoded it in), waits at the CPU
    # gate for another variant's requests, and requests that joined the variant decoding
    in_flight: float | None = None
    busiest: int = 0
    batch: float | None = None
    widest: int = 0
    gate_waited: int = 0
    gate_wait_s: float = 0.0
    gate_joined: int = 0
    arms: list[ArmRow] = field(default_factory=list)
    daemons: int | None = None  # a fleet's report: daemons whose requests are its evidence

    def public(self) -> dict[str, Any]:
        """The stable JSON form (see the README's report schema)."""
        out = asdict(self)
        out["class"] = out.pop("class_key")
        return out


@dataclass(frozen=True, slots=True)
class Report:
    state_dir: str
    found: bool  # a readable policy file was there
    unreadable: bool = False  # a policy file was there but could not be read (logged)
    model: str | None = None
    engine: str | None = None  # the llama-server engine the policies were learned on
    build: str | None = None
    hardware: dict[str, Any] | None = None
    saved: float | None = None
    classes: list[ClassRow] = field(default_factory=list)
    single: dict[str, Any] | None = None  # one variant loaded at a time: what serves all
    # variants out of routing and search because they failed on the server, and why
    quarantine: dict[str, Any] = field(default_factory=dict)
    fleet: dict[str, Any] | None = None  # read from a fleet's database (``report.fleet``)
    engines: dict[str, Any] | None = None  # TUNER_ENGINE=auto: the engines measured, the choice
    outlook: Outlook | None = None  # no policies yet: what the daemon will start with
    # requests in the kept records whose client hung up (cancelled upstream), and the tokens
    # generated for them where the server said
    abandoned: int = 0
    abandoned_tokens: int = 0

    @property
    def requests(self) -> int:
        return sum(row.requests for row in self.classes)

    @property
    def expected_speedup(self) -> float | None:
        """Traffic-weighted speedup of the current policies over no speculation.

        Each class's requests count once, at the measured speedup of the policy that
        serves them (its own or a parent's); 1.0 where that policy is no speculation.
        With one variant loaded at a time, the active variant's gain over the mix.
        """
        if self.single is not None:
            return _float((self.single.get("gains") or {}).get(self.single.get("active"), 1.0))
        by_key = {row.class_key: row for row in self.classes}
        total = weighted = 0.0
        for row in self.classes:
            if not row.requests:
                continue
            policy = by_key.get(row.served_by or row.class_key, row)
            s = policy.speedup if policy.speculation and policy.speedup else 1.0
            total += row.requests
            weighted += row.requests * s
        return weighted / total if total else None

    def public(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "state_dir": self.state_dir,
            "found": self.found,
            "unreadable": self.unreadable,
            "model": self.model,
            "engine": self.engine,
            "engines": self.engines,
            "build": self.build,
            "hardware": self.hardware,
            "saved": self.saved,
            "overall": {
                "requests": self.requests,
                "expected_speedup": self.expected_speedup,
                "abandoned": self.abandoned,
                "abandoned_tokens": self.abandoned_tokens,
            },
            "single": self.single,
            "quarantine": self.quarantine,
            "classes": [row.public() for row in self.classes],
            "outlook": None if self.outlook is None else asdict(self.outlook),
            "fleet": self.fleet,
        }


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _measured(value: Any) -> Interval | None:
    """A ``[value, low, high]`` triple of the policy file's ``speedups``."""
    if isinstance(value, list) and len(value) == 3 and all(_float(x) is not None for x in value):
        return Interval(*(float(x) for x in value))
    return None


def _arms(
    arms: Mapping[str, Any], predicted: Mapping[str, float], measured: Mapping[str, Any]
) -> list[ArmRow]:
    """Each arm's row: the speedup the engine measured it at (``speedups``, as it decides),
    else (a file from before it wrote them, or an arm with too few requests for the
    engine) the ratio of its mean decode speed to the baseline's."""
    base = arms.get(BASELINE.name) or {}
    base_samples = [float(x) for x in base.get("samples", [])]
    out = []
    for name, arm in sorted(arms.items()):
        samples = [float(x) for x in arm.get("samples", [])]
        replays = arm.get("replays") or []  # replayed (tokens, drafted, accepted)
        alpha = wilson(
            int(arm.get("accepted", 0)) + sum(int(c[2]) for c in replays),
            int(arm.get("drafted", 0)) + sum(int(c[1]) for c in replays),
        )
        s = _measured(measured.get(name)) if name != BASELINE.name else None
        if s is None and name != BASELINE.name and len(samples) >= 2 and len(base_samples) >= 2:
            s = ratio_interval(samples, base_samples, Z90)
        out.append(
            ArmRow(
                variant=name,
                requests=int(arm.get("requests", 0)),
                alpha=alpha.value if alpha else None,
                speedup=s.value if s else (1.0 if name == BASELINE.name else None),
                speedup_low=s.low if s else None,
                speedup_high=s.high if s else None,
                predicted=predicted.get(name),
                replayed=int(arm.get("replayed", 0)),
            )
        )
    return out


def _row(key: str, data: Mapping[str, Any]) -> ClassRow:
    policy: Mapping[str, Any] = data.get("policy") or {}
    seen, explored = int(data.get("seen", 0)), int(data.get("explored", 0))
    spent = _float(data.get("spent"))
    speculation = bool(policy.get("speculation", False))
    prior = data.get("prior") or {}
    prompt: Mapping[str, Any] = data.get("prompt") or {}
    processed, seconds = int(prompt.get("processed", 0)), _float(prompt.get("seconds"))
    turns: Mapping[str, Any] = data.get("turns") or {}
    load: Mapping[str, Any] = data.get("load") or {}
    arrived, sent = int(load.get("requests", 0)), int(load.get("sent", 0))
    predicted = {
        str(name): float(p) for name, p in prior.get("ranked") or [] if _float(p) is not None
    }
    return ClassRow(
        class_key=key,
        variant=str(policy.get("variant", BASELINE.name)),
        speculation=speculation,
        reason=str(policy.get("reason", "no policy yet")),
        kill_switch=bool(policy.get("kill_switch", False)),
        override=bool(policy.get("override", False)),
        alpha=_float(policy.get("alpha")),
        alpha_low=_float(policy.get("alpha_low")),
        alpha_high=_float(policy.get("alpha_high")),
        accepted_length=_float(policy.get("tokens_per_step")) if speculation else None,
        speedup=_float(policy.get("speedup")),
        speedup_low=_float(policy.get("speedup_low")),
        speedup_high=_float(policy.get("speedup_high")),
        predicted_speedup=_float(policy.get("predicted_speedup")),
        requests=seen,
        evidence_requests=int(policy.get("requests", 0)),
        explored=explored,
        exploration_share=explored / seen if seen else None,
        exploration_cost=max(spent, 0.0) / seen if seen and spent is not None else None,
        trials=int(data.get("trials_done", 0)),
        converged=bool(data.get("converged", False)),
        since=_float(policy.get("since")),
        served_by=data.get("served_by"),
        prompt_cached=int(prompt.get("cached", 0)),
        prompt_processed=processed,
        prompt_tok_s=processed / seconds if seconds and processed else None,
        turns_stayed=int(turns.get("stayed", 0)),
        turns_moved={str(k): int(n) for k, n in (turns.get("moved") or {}).items()},
        turns_trials=int(turns.get("trials", 0)),
        in_flight=int(load.get("in_flight", 0)) / arrived if arrived else None,
        busiest=int(load.get("busiest", 0)),
        batch=int(load.get("batch", 0)) / sent if sent else None,
        widest=int(load.get("widest", 0)),
        gate_waited=int(load.get("waited", 0)),
        gate_wait_s=_float(load.get("wait_s")) or 0.0,
        gate_joined=int(load.get("joined", 0)),
        arms=_arms(data.get("arms") or {}, predicted, data.get("speedups") or {}),
    )


def _order(key: str) -> tuple[int, str]:
    return (0 if key == ROOT else 1, key)


def build_report(document: Mapping[str, Any] | None, state_dir: str = "") -> Report:
    """The report for a policy document as ``tuning.runtime.policy_file`` writes it (None: no
    file)."""
    if document is None:
        return Report(state_dir=state_dir, found=False)
    classes = document.get("classes") or {}
    rows = [_row(key, classes[key]) for key in sorted(classes, key=_order)]
    return Report(
        state_dir=state_dir,
        found=True,
        model=document.get("model"),
        engine=document.get("engine"),
        build=document.get("build"),
        hardware=document.get("hardware"),
        saved=_float(document.get("saved")),
        classes=rows,
        single=single if isinstance(single := document.get("single"), dict) else None,
        quarantine=found if isinstance(found := document.get("quarantine"), dict) else {},
    )


def load_report(state_dir: Path) -> Report:
    path = state_dir / POLICY_FILE
    document = read_document(path)
    choice = load_choice(state_dir / CHOICE_FILE)
    engines = choice.model_dump(mode="json", exclude={"version"}) if choice else None
    if document is None and path.exists():
        return Report(state_dir=str(state_dir), found=False, unreadable=True, engines=engines)
    report = build_report(document, str(state_dir))
    # the engine the policies were learned on; without policies yet, the one chosen
    engine = report.engine or (choice.engine if choice else None)
    abandoned, tokens = abandoned_requests(read_records(state_dir / "records"))
    return dataclasses.replace(
        report, engines=engines, engine=engine, abandoned=abandoned, abandoned_tokens=tokens
    )


def abandoned_requests(records: Iterable[RequestRecord]) -> tuple[int, int]:
    """How many requests their clients hung up on, and the tokens generated for them."""
    count = tokens = 0
    for record in records:
        if record.error is not None and record.error.startswith(CLIENT_GONE):
            count += 1
            tokens += (record.timings.predicted_n or 0) if record.timings else 0
    return count, tokens


def load_history(state_dir: Path, class_key: str) -> list[TrialRecord]:
    """Every Optuna trial of one class in this state dir, oldest first ([] when none)."""
    return load_histories(state_dir, [class_key])[class_key]


def load_histories(state_dir: Path, class_keys: Sequence[str]) -> dict[str, list[TrialRecord]]:
    """The trials of each class (oldest first), read through one connection to the studies.

    The studies of the model and machine in the policy file; all of them when there
    is no policy file yet.
    """
    path = state_dir / "studies.db"
    if not path.is_file():
        return {key: [] for key in class_keys}
    from tuner.tuning.search.studies import StudyBook  # Optuna: imported only when asked

    document = read_document(state_dir / POLICY_FILE)
    scope = study_scope(document) if document else ""
    try:
        book = StudyBook(path, scope)
        return {key: book.history(key, any_scope=document is None) for key in class_keys}
    except Exception as exc:  # sqlite3 / SQLAlchemy / Optuna: a damaged or foreign file
        raise TunerError(f"cannot read the Optuna studies in {path}: {exc}") from exc
