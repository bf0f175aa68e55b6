"""The tuning engine as a daemon service: routing, background IO, persistence, scheduled jobs.

- ``route(class_key)`` gives the proxy what to send: the variant's model id, which the
  router (llama-server's, or the daemon's own pool where the engine has none) serves.
- Optuna and policy-file writes run on one background thread, never on the
  request path; a change is written at most every ``save_every_s``.
- apscheduler jobs: drift check and re-evaluation (``reevaluate_s``), policy
  snapshots (``snapshot_s``, the last ``keep_snapshots`` kept under
  ``<state>/snapshots/``).
- ``stop`` writes the policies one last time.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from tuner.classify.classes import ROOT
from tuner.logs import get_logger
from tuner.records import RequestRecord
from tuner.sessions import Held, PrefixIndex, Prompt, Turn
from tuner.tuning.pricing.waiting import Busy
from tuner.tuning.runtime.engine import Decision, Engine
from tuner.tuning.runtime.policy_file import (
    POLICY_FILE,
    PolicyMeta,
    load_policies,
    read_document,
    save_policies,
    set_aside,
)
from tuner.tuning.runtime.quarantine import Quarantine
from tuner.tuning.runtime.tuner import Tuner
from tuner.tuning.variants import BASELINE

__all__ = ["Fleet", "Routed", "TuningService"]

log = get_logger(__name__)

CHARS_PER_TOKEN = 4.0  # until prompts' token counts are seen
CHARS_WEIGHT = 0.05  # of each new prompt in the moving mean
CHARS_MIN_TOKENS = 32
# a variant that answered this recently is taken to be loaded: it stands in for ``none``
# while that instance is restarted
STAND_IN_S = 300.0


@dataclass(frozen=True, slots=True)
class Routed:
    """What the proxy does to one request: the model (the variant's) to ask for."""

    variant: str
    role: str
    trial: int | None
    model: str | None = None
    session: str | None = None  # new, stayed or moved:<reason> (a prompt seen)


EngineFactory = Callable[..., Engine]  # called with io= and on_change=


class Fleet(Protocol):
    """A fleet's shared storage as the service drives it (``tuner.fleet.sync.FleetSync``)."""

    def sync(self, engine: Engine) -> bool: ...
    def describe(self) -> dict[str, Any]: ...
    def restore(self, saved: object) -> None: ...
    def put_document(self, document: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class TuningService:
    """``build`` makes the engine, wired to this service's background thread (``io``) and
    its policy-file writer (``on_change``): ``functools.partial(Engine, config, ...)``."""

    def __init__(
        self,
        build: EngineFactory,
        state_dir: Path,
        meta: PolicyMeta,
        *,
        reevaluate_s: float = 60.0,
        snapshot_s: float = 900.0,
        keep_snapshots: int = 24,
        save_every_s: float = 2.0,
        strategy: Callable[[Engine], Tuner] = lambda engine: engine,
        unavailable: Callable[[str], bool] = lambda _: False,
        instances: Mapping[str, str] | None = None,
        busy: Callable[[], tuple[str, float] | None] | None = None,
        fleet: Fleet | None = None,
        sync_s: float = 2.0,
        stop_s: float = 15.0,
    ) -> None:
        self.fleet = fleet  # built with the engine's ``publish``; synced here
        self.sync_s = sync_s
        self.stop_s = stop_s
        self.state_dir = state_dir
        self.path = state_dir / POLICY_FILE
        self.meta = meta
        self.reevaluate_s = reevaluate_s
        self.snapshot_s = snapshot_s
        self.keep_snapshots = keep_snapshots
        self.save_every_s = save_every_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuning")
        self._dirty = threading.Event()
        self._last_save = 0.0
        self._handed_over = False
        self.save_errors = 0
        self.scheduler: AsyncIOScheduler | None = None
        # variants that fail on the server side, out of routing and search for a while
        self.quarantine = Quarantine()
        self.unavailable = unavailable  # presets the router is reloading after a stall
        # the instance each variant runs on, where several share one (default: its own)
        self.instances = dict(instances or {})
        # the CPU gate's variant decoding now and how long waits for another have lasted
        # (None: no gate a request may join a variant at)
        self.busy = busy
        self.engine = engine = build(
            io=self._submit, on_change=lambda _: self._mark_dirty(), excluded=self.quarantine.blocks
        )
        # the per-class engine itself, or one variant at a time over it (``one_at_a_time``)
        self.tuner = strategy(engine)
        # which instance holds which conversation: only where variants are instances
        self.sessions: PrefixIndex | None = PrefixIndex() if self.tuner.per_class else None
        self.chars_per_token = CHARS_PER_TOKEN
        self._answered: dict[str, float] = {}  # variant -> when an answer of it was observed

    # -- request path -----------------------------------------------------------------

    def route(self, class_key: str | None, prompt: Prompt | None = None) -> Routed:
        """What to send one request of this class; with its ``prompt``, a conversation's
        later turn goes where its history is cached unless moving pays."""
        sessions = self.sessions
        turn: Turn | None = None
        if sessions is not None and prompt is not None:
            held = sessions.locate(prompt)
            if held is not None and held.continuing:
                turn = self._turn(held, prompt)
        gate = self.busy() if self.busy is not None else None
        # no history held anywhere: it may open a conversation, which stays where it goes
        opens = sessions is not None and prompt is not None and turn is None
        decision = self.tuner.route(
            class_key, turn, Busy(*gate) if gate is not None else None, opens=opens
        )
        if self._blocked(decision.variant):
            # a pin, a choice not re-decided yet, or an instance being reloaded
            instead = self._stand_in(class_key, decision.variant)
            decision = Decision(instead, "fallback", policy_class=decision.policy_class)
        if sessions is None or prompt is None:
            return self.routed(decision)
        sessions.remember(prompt, decision.variant)
        return self.routed(decision, self._outcome(class_key, decision, turn))

    def _blocked(self, variant: str) -> bool:
        return self.quarantine.blocks(variant) or self.unavailable(variant)

    def _turn(self, held: Held, prompt: Prompt) -> Turn:
        """The turn in tokens, each variant credited with what its instance holds: variants
        that share one (the pool's, differing only in per-request settings) share its cache."""
        per_token = self.chars_per_token
        held_by: dict[str, float] = {}
        for variant, chars in held.cached.items():
            instance = self.instance_of(variant)
            held_by[instance] = max(held_by.get(instance, 0.0), chars)
        cached = {
            variant: held_by[self.instance_of(variant)] / per_token
            for variant in self.engine.variants
            if self.instance_of(variant) in held_by
        }
        return Turn(held.variant, cached, prompt.max_tokens)

    def instance_of(self, variant: str) -> str:
        return self.instances.get(variant, variant)

    def _outcome(self, class_key: str | None, decision: Decision, turn: Turn | None) -> str:
        """How a turn was routed: ``new`` (not a later turn of a conversation seen),
        ``stayed``, or ``moved:<reason>``: ``pays`` (the class's variant, or its pin, saves
        more than the history costs again), ``unavailable`` (the instance holding it is
        quarantined, reloading or forbidden to its class) or ``fallback`` (the variant it
        moved to is)."""
        if turn is None:
            return "new"
        if self.instance_of(decision.variant) == self.instance_of(turn.held):
            return "stayed"  # on its instance, with other per-request settings perhaps
        held = turn.held
        if self._blocked(held) or self.engine.router.forbidden(class_key or ROOT, held):
            return "moved:unavailable"
        return "moved:pays" if decision.role in ("exploit", "pinned") else f"moved:{decision.role}"

    def fallback(
        self, variant: str, request_id: str, reason: str, class_key: str | None = None
    ) -> Routed | None:
        """The second try for a request whose variant failed on the server before answering:
        no speculation, or ``_stand_in`` where that instance is what stopped answering (None
        where it failed otherwise). The failure counts now, not when its record lands, so
        the next request already routes around a variant that cannot load."""
        if variant == BASELINE.name:
            if not self.unavailable(variant):
                return None  # it answered with an error: another try would too
            if self.sessions is not None:
                self.sessions.forget(variant)  # restarted: its cache is gone
        else:
            self._failed(variant, reason, request_id)
        return self.routed(Decision(self._stand_in(class_key, variant), "fallback"))

    def _stand_in(self, class_key: str | None, failed: str) -> str:
        """Where a request goes that its variant cannot take: no speculation; while that
        instance is being restarted, the variant that answered last (speculation does not
        change what is generated, so any healthy instance answers alike), else ``none``
        once it is back."""
        if not self._blocked(BASELINE.name) or not self.tuner.per_class:
            return BASELINE.name  # one instance at a time: there is no other to ask
        key, now = class_key or ROOT, time.monotonic()
        healthy = [
            (at, variant)
            for variant, at in list(self._answered.items())
            if variant not in (failed, BASELINE.name)
            and now - at < STAND_IN_S
            and not self._blocked(variant)
            and not self.engine.router.forbidden(key, variant)
        ]
        return max(healthy)[1] if healthy else BASELINE.name

    def routed(self, decision: Decision, session: str | None = None) -> Routed:
        """How the proxy applies a decision: the variant's model id."""
        return Routed(
            decision.variant, decision.role, decision.trial, model=decision.variant, session=session
        )

    def observe(self, record: RequestRecord) -> None:
        variant = record.variant
        self._learn_chars(record)
        if variant is not None and record.status >= 500:
            self._failed(variant, record.error or f"status {record.status}", record.id)
        elif variant is not None and record.status == 200 and not record.error:
            self.quarantine.succeeded(variant)
            self._answered[variant] = time.monotonic()
        self.tuner.observe(record)

    def _learn_chars(self, record: RequestRecord) -> None:
        """Characters per prompt token, from each prompt's length and the server's count of
        its tokens (a moving mean: routing counts a cached history in characters)."""
        t = record.timings
        if record.prompt_chars is None or t is None or t.prompt_n is None:
            return
        tokens = t.prompt_n + (t.cache_n or 0)
        if tokens >= CHARS_MIN_TOKENS:
            found = min(max(record.prompt_chars / tokens, 1.0), 16.0)
            self.chars_per_token += CHARS_WEIGHT * (found - self.chars_per_token)

    def _failed(self, variant: str, reason: str, request_id: str) -> None:
        if self.sessions is not None:
            self.sessions.forget(variant)  # a failed instance's cache is not to be counted on
        if self.quarantine.failed(variant, reason, request_id):
            self._submit(self.engine.refresh)  # classes choose among the others

    # -- background -------------------------------------------------------------------

    def _submit(self, job: Callable[[], object]) -> None:
        def run() -> None:
            try:
                job()
            except Exception:
                log.exception("tuning_job_failed")

        with contextlib.suppress(RuntimeError):  # shutting down
            self._pool.submit(run)

    def _mark_dirty(self) -> None:
        self._dirty.set()
        if time.monotonic() - self._last_save >= self.save_every_s:
            self._submit(self.save)

    def save(self) -> bool:
        """Write the policy file now (atomically); False (and logged) when it cannot.
        Once handed over (``hand_over``) the file is another service's: nothing is written."""
        if self._handed_over:
            return True
        self._dirty.clear()
        self._last_save = time.monotonic()
        try:
            extra: dict[str, Any] = {
                "quarantine": self.quarantine.describe(),
                **self.tuner.describe(),
            }
            with self.engine.locked():  # the fleet's cursors match the evidence saved
                classes = self.engine.snapshot()
                if self.fleet is not None:
                    extra["fleet"] = self.fleet.describe()
            save_policies(self.path, self.meta, classes, extra=extra)
        except OSError as exc:
            self.save_errors += 1
            self._dirty.set()
            log.error("policies_write_failed", path=str(self.path), error=str(exc))
            return False
        return True

    async def hand_over(self) -> bool:
        """Write the policy file a last time, then leave it to the service that replaces
        this one and loads it next (``tuner.daemon.deployment``): this one keeps serving
        its last requests but never writes the file again."""

        def last_save() -> bool:
            saved = self.save()
            self._handed_over = True
            return saved

        return await asyncio.wrap_future(self._pool.submit(last_save))

    def sync(self) -> None:
        """Trade evidence with the fleet; renew the heartbeats of running trials."""
        if self.fleet is None:
            return
        if self.fleet.sync(self.engine) and self.engine.studies is not None:
            try:
                self.engine.studies.beat()
            except Exception as exc:  # the database went away between the two
                log.warning("trial_heartbeat_failed", error=str(exc)[:200])

    def publish_document(self) -> None:
        """The policy file, for the fleet's report."""
        document = read_document(self.path)
        if self.fleet is not None and document is not None:
            self.fleet.put_document(document)

    def reevaluate(self) -> None:
        self.tuner.reevaluate()
        if self._dirty.is_set():
            self._submit(self.save)

    def snapshot(self) -> Path | None:
        if not self.path.is_file():
            return None
        folder = self.state_dir / "snapshots"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / f"policies-{time.strftime('%Y%m%dT%H%M%S')}.json"
            shutil.copyfile(self.path, target)
            for old in sorted(folder.glob("policies-*.json"))[: -self.keep_snapshots]:
                old.unlink(missing_ok=True)
        except OSError as exc:
            log.error("snapshot_failed", error=str(exc))
            return None
        return target

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        restored = load_policies(self.path, self.meta)
        if restored:
            try:
                self.engine.restore(restored)
            except (LookupError, TypeError, ValueError) as exc:  # an entry it cannot parse
                set_aside(self.path, "bad", reason=f"cannot restore: {exc!r}")
            else:
                log.info("policies_restored", classes=len(restored), path=str(self.path))
        if self.fleet is not None:
            saved = read_document(self.path) if restored else None
            self.fleet.restore((saved or {}).get("fleet"))
            await asyncio.wrap_future(self._pool.submit(self.sync))  # warm from the fleet
        self.scheduler = AsyncIOScheduler()
        self.scheduler.add_job(
            lambda: self._submit(self.reevaluate),
            "interval",
            seconds=self.reevaluate_s,
            id="reevaluate",
        )
        self.scheduler.add_job(
            lambda: self._submit(self.snapshot), "interval", seconds=self.snapshot_s, id="snapshot"
        )
        if self.fleet is not None:
            self.scheduler.add_job(
                lambda: self._submit(self.sync), "interval", seconds=self.sync_s, id="sync"
            )
            self.scheduler.add_job(
                lambda: self._submit(self.publish_document),
                "interval",
                seconds=self.reevaluate_s,
                id="document",
            )
        self.scheduler.start()

    async def stop(self) -> None:
        """Finish the queued work, sync and save once more, within ``stop_s``: a database
        or disk that hangs must not hold the daemon's exit (the last policy file written
        every ``save_every_s`` stands). The app flushes the records first, so the last
        requests reach the engine before this."""
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
            self.scheduler = None
        closing = threading.Thread(target=self._close, name="tuning-stop", daemon=True)
        closing.start()
        await asyncio.to_thread(closing.join, self.stop_s)
        if closing.is_alive():
            log.error("tuning_stop_timed_out", seconds=self.stop_s, path=str(self.path))

    def _close(self) -> None:
        self._pool.shutdown(wait=True)
        self.sync()  # the fleet gets what is left in the outbox
        self.save()
        if self.fleet is not None:
            self.publish_document()
            self.fleet.close()
        if self.engine.studies is not None:
            self.engine.studies.close()
