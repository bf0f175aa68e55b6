"""Idle-time tuning: replay a bounded sample of recent prompts to advance each class's search.

Opt-in (``[offline] enabled`` in the tuning file). While it is on, the proxy hands
every classified request body to ``Samples.add``, which keeps the last few per
class in memory only (never on disk; bodies over ``max_prompt_bytes`` are not
kept). When no request has been in flight for ``idle_s`` seconds, ``OfflineTuner``
takes each class whose search is still open and replays its prompts in pairs: the
class's trial variant, then no speculation, same prompt, non-streaming, at most
``max_tokens``. Both answers go through the proxy's own path (the variant gate, the
request records, the engine's evidence), marked as replays, so a trial finishes
on idle time instead of on the live budget, and each pair compares like with like.
A live request stops the replay after the pair in flight.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from tuner.logs import get_logger
from tuner.tuning.config import Offline
from tuner.tuning.engine import Decision, Engine
from tuner.tuning.variants import BASELINE

__all__ = ["OfflineTuner", "Samples"]

log = get_logger(__name__)

Replay = Callable[[str, str, dict[str, Any], Decision], Awaitable[bool]]


class Samples:
    """The last ``per_class`` request bodies of each class, in memory (thread-safe enough:
    one writer, the event loop)."""

    def __init__(self, per_class: int, max_bytes: int) -> None:
        self.per_class = per_class
        self.max_bytes = max_bytes
        self._by_class: dict[str, deque[tuple[str, dict[str, Any]]]] = {}

    def add(self, class_key: str | None, endpoint: str, body: dict[str, Any]) -> bool:
        """Keep a copy of the body; False when it is too large or has no class."""
        if class_key is None:
            return False
        try:
            size = len(json.dumps(body, ensure_ascii=False).encode())
        except (TypeError, ValueError):
            return False
        if size > self.max_bytes:
            return False
        kept = self._by_class.setdefault(class_key, deque(maxlen=self.per_class))
        kept.append((endpoint, copy.deepcopy(body)))
        return True

    def classes(self) -> list[str]:
        return sorted(k for k, v in self._by_class.items() if v)

    def of(self, class_key: str) -> list[tuple[str, dict[str, Any]]]:
        return list(self._by_class.get(class_key, ()))

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_class.values())


def replay_body(body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The body to replay: the same prompt, whole (not streamed), at most ``max_tokens``.

    >>> replay_body({"prompt": "x", "stream": True, "max_tokens": 500}, 128)
    {'prompt': 'x', 'stream': False, 'max_tokens': 128}
    """
    out = copy.deepcopy(body)
    out["stream"] = False
    out.pop("stream_options", None)
    asked = [out.pop(k) for k in ("max_completion_tokens", "n_predict") if k in out]
    limit = out.get("max_tokens", asked[0] if asked else None)
    out["max_tokens"] = (
        min(limit, max_tokens) if isinstance(limit, int) and limit > 0 else max_tokens
    )
    return out


class OfflineTuner:
    """Replays sampled prompts while the proxy is idle (see the module doc)."""

    def __init__(
        self,
        engine: Engine,
        samples: Samples,
        replay: Replay,
        idle_for: Callable[[], float],
    ) -> None:
        self.engine = engine
        self.samples = samples
        self.replay = replay
        self.idle_for = idle_for  # seconds since the last live request (0 while one runs)
        self.pairs_done = 0
        self.running = False

    @property
    def config(self) -> Offline:
        return self.engine.config.offline

    def idle(self) -> bool:
        return self.idle_for() >= self.config.idle_s

    async def run_once(self) -> int:
        """One idle period's replays: the pairs done (0 when not idle, off, or nothing open)."""
        if not self.config.enabled or self.running or not self.idle():
            return 0
        self.running = True
        done = 0
        loop = asyncio.get_running_loop()
        try:
            for class_key in self.samples.classes():
                prompts = self.samples.of(class_key)
                for n in range(self.config.pairs):
                    if not self.idle():
                        return done
                    decision = await loop.run_in_executor(
                        None, self.engine.offline_trial, class_key
                    )
                    if decision is None:
                        break
                    endpoint, body = prompts[n % len(prompts)]
                    body = replay_body(body, self.config.max_tokens)
                    control = Decision(BASELINE.name, "control", None, class_key)
                    if not await self.replay(class_key, endpoint, body, decision):
                        return done
                    if not await self.replay(class_key, endpoint, body, control):
                        return done
                    done += 1
        finally:
            self.running = False
            self.pairs_done += done
            if done:
                log.info("offline_replayed", pairs=done, total=self.pairs_done)
        return done
