"""Every answered request measures every n-gram variant it can: tokenize it, replay it.

After a request is answered (and recorded), ``Replayer`` takes its body and the
answer's text, asks llama-server for the token ids (``tuning.replay.tokenizer``) and
replays them through each
``ngram-simple`` variant of the search space (``tuner.tuning.replay.drafters``), and, with
``[guard] replay_mod``, each ``ngram-mod`` variant: one simulated drafter per
variant, fed every answered request in the order they finish (an estimate of what
the variant would draft had it served all traffic; its table takes 16 MiB). The drafted
and accepted counts go to ``Engine.observe_replayed`` as evidence for those variants
in the request's class. All of it runs on one background thread with a small queue
(dropped, and counted, when full), never on the request path; nothing is written to
disk. The upstream calls are cheap next to a generation (tokenizing a few KB) and go
to the instance that just answered.

Tokenizing the answer's text again can differ from the ids the server sampled (a
word split another way); ``benchmarks/shadow_check.py`` measures how often and what
it does to the counts.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from tuner.logs import get_logger
from tuner.records import RequestRecord
from tuner.tuning.config import TuningConfig
from tuner.tuning.evidence.counts import Counts, served_counts
from tuner.tuning.replay.drafters import ModDrafter, cut_tail, replay_simple
from tuner.tuning.replay.tokenizer import Tokenizer
from tuner.tuning.variants import Variant

__all__ = ["Replayer"]

log = get_logger(__name__)


class Learner(Protocol):
    """What the replays feed: the engine's variants, its tuning file, and its evidence."""

    @property
    def variants(self) -> Mapping[str, Variant]: ...

    @property
    def config(self) -> TuningConfig: ...

    def observe_replayed(
        self,
        class_key: str | None,
        served: str,
        counts: dict[str, Counts],
        served_counts: Counts | None = None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class _Job:
    record: RequestRecord
    endpoint: str
    body: dict[str, Any]
    text: str


class Replayer:
    """Replays finished requests through the engine's n-gram variants it can replay
    (``cuts_last_round``: the engine's answers leave out their last round's accepted drafts
    at ``max_tokens``, which every variant's replay is credited with)."""

    def __init__(
        self,
        engine: Learner,
        base_url: str,
        *,
        router: bool = True,
        cuts_last_round: bool = False,
        queue_size: int = 64,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.engine = engine
        self.router = router
        self.cuts_last_round = cuts_last_round
        # (lookup length, draft length): llama.cpp's size_n defaults to 12; size_m is the
        # variant's draft length (its default known to ``Variant``)
        self.variants = {
            name: (int(v.param("size_n", 12) or 12), v.draft_length)
            for name, v in engine.variants.items()
            if v.spec_type == "ngram-simple" and not v.autotuned  # its drafts change every step
        }
        # llama.cpp's defaults: n_match 24, n_max 64, n_min 48 (Variant derives n_min from
        # n_max when only n_max is set); a lookup length below 1 is not modelled (no replay)
        self.mod: dict[str, ModDrafter] = {}
        for name, v in engine.variants.items():
            n_match = int(v.param("n_match", 24) or 0)
            modelled = engine.config.guard.replay_mod and n_match >= 1 and not v.autotuned
            if v.spec_type == "ngram-mod" and modelled:
                n_min = int(v.param("n_min", 48 if v.param("n_max") is None else 0) or 0)
                self.mod[name] = ModDrafter(n_match, v.draft_length, n_min)
        self.tokenizer = Tokenizer(base_url, timeout_s=timeout_s, transport=transport)
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self.done = self.dropped = self.failed = 0
        # answered requests offered (taken or not), jobs queued and jobs finished: a caller
        # that sent N requests knows the replays are done once offered >= N and none pending
        self.offered = self.queued = self.finished = 0
        # requests a replayable variant served, and those whose replay gave the server's counts
        self.checked = self.agreed = 0
        # requests an ngram-mod variant served: accepted tokens its simulation gave, and the
        # server's (how far the estimate is off: the simulated table holds all traffic, the
        # instance's only what it served since it was last loaded)
        self.mod_checked = self.mod_simulated = self.mod_served = 0

    @property
    def enabled(self) -> bool:
        replayable = bool(self.variants) or bool(self.mod)
        return replayable and self.engine.config.guard.replay

    async def start(self) -> None:
        self.open()

    async def stop(self) -> None:
        await asyncio.to_thread(self.close)

    def open(self) -> None:
        """Start the worker thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="counterfactual", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Finish what is queued (bounded wait), then stop the worker."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=15)
            self._thread = None
        self.tokenizer.close()

    def submit(self, record: RequestRecord, endpoint: str, body: dict[str, Any], text: str) -> bool:
        """Queue one answered request (any thread; never blocks). False when not taken."""
        t = record.timings
        taken = bool(
            self.enabled
            and text
            and record.status == 200
            and not record.error
            and record.variant is not None
            and t is not None
            and t.predicted_n
        )
        if taken:
            self.queued += 1  # before the put: the worker's ``finished`` never overtakes it
            try:
                self._queue.put_nowait(_Job(record, endpoint, body, text))
            except queue.Full:
                self.queued -= 1
                self.dropped += 1
                taken = False
        self.offered += 1  # last: a reader that sees the offer sees its job
        return taken

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        return self.queued - self.finished

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self.replay(job.record, job.endpoint, job.body, job.text)
                self.done += 1
            except Exception as exc:  # an upstream hiccup loses one replay, nothing else
                self.failed += 1
                log.info("counterfactual_failed", error=str(exc), request_id=job.record.id)
            finally:
                self.finished += 1

    def replay(self, record: RequestRecord, endpoint: str, body: dict[str, Any], text: str) -> None:
        """Tokenize one request and hand each variant's counts to the engine (blocking)."""
        model = record.variant if self.router else None
        prompt = self.tokenizer.prompt(endpoint, body, model)
        if prompt is None:
            return
        output = self.tokenizer.tokenize(text, special=False, model=model)
        t = record.timings
        assert t is not None and t.predicted_n
        counts = {
            name: Counts(
                t.predicted_n, *replay_simple(prompt, output, size_n, size_m, record.max_tokens)
            )
            for name, (size_n, size_m) in self.variants.items()
        }
        for name, drafter in self.mod.items():  # every drafter sees every request, in order
            counts[name] = Counts(t.predicted_n, *drafter.replay(prompt, output, record.max_tokens))
        if self.cuts_last_round and (tail := cut_tail(t.predicted_n, len(output))):
            # the tail the text lacks was drafted and accepted: each variant's credited it
            counts = {k: Counts(n, d, min(d, a + tail)) for k, (n, d, a) in counts.items()}
        # the server's own counts are the served variant's evidence
        served = counts.pop(record.variant or "", None)
        if served is not None and record.variant in self.variants:
            # an exact replay of what the server did: does it agree? (ngram-mod's is an
            # estimate: its table here holds all traffic, not only what that instance served)
            self.checked += 1
            self.agreed += served[1:] == (t.draft_n or 0, t.draft_n_accepted or 0)
        elif served is not None:
            self.mod_checked += 1
            self.mod_simulated += served[2]
            self.mod_served += t.draft_n_accepted or 0
        mine = served_counts(t.predicted_n, t.draft_n, t.draft_n_accepted)
        self.engine.observe_replayed(record.class_key, record.variant or "", counts, mine)
