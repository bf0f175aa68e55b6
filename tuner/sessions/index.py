"""Which instance holds which prompt prefix: the blocks each variant's instance was last
sent, so a conversation's next turn can go where its history is cached.

A turn continues a conversation when it holds the whole of an earlier prompt and is longer:
its matched blocks reach one where an earlier, shorter prompt ended (the same prompt sent
again, a retry or a batch job, is a request of its own). A new conversation that shares only a
system prompt or a tool list with earlier ones diverges inside them, and is new. A block
continued differently by ``COMMON`` or more prompts gives no credit either (every instance
that served any of them holds it). The index is bounded (least recently used blocks
forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from tuner.sessions.prefix import BLOCK_CHARS, Prompt

__all__ = ["COMMON", "Held", "PrefixIndex"]

COMMON = 3  # distinct continuations that make a block common to many conversations
MAX_IDS = 10_000


@dataclass(slots=True)
class _Block:
    holders: dict[str, int] = field(default_factory=dict)  # variant -> last use (a tick)
    children: set[bytes] = field(default_factory=set)  # up to COMMON distinct next blocks
    ends: int = 0  # the longest prompt sent whose last full block this is (characters)


@dataclass(frozen=True, slots=True)
class Held:
    """Where a prompt's history is cached: the instance it continues on, and how many of
    the prompt's characters each instance holds (whole blocks)."""

    variant: str
    cached: dict[str, int]
    continuing: bool  # holds an earlier prompt whole, or the session id was seen

    def chars(self, variant: str) -> int:
        return self.cached.get(variant, 0)


class PrefixIndex:
    """Read and written on the request path alone (no lock); ``forget`` may be called from
    any thread: it is one assignment, and the blocks it makes stale are skipped, not
    walked."""

    def __init__(self, max_blocks: int = 200_000) -> None:
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        # session id -> its last variant, and the tick it was sent at
        self._ids: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._tick = 0
        self._forgotten: dict[str, int] = {}  # variant -> the last tick its cache lost

    def __len__(self) -> int:
        return len(self._blocks)

    def _holds(self, variant: str, tick: int) -> bool:
        return tick > self._forgotten.get(variant, 0)

    def locate(self, prompt: Prompt) -> Held | None:
        """Where this prompt continues a conversation; None for a new one."""
        depth: dict[str, int] = {}  # leading blocks each variant holds
        last: dict[str, int] = {}
        common = ended = ended_chars = 0
        for i, digest in enumerate(prompt.blocks):
            block = self._blocks.get(digest)
            if block is None:
                break
            for variant, tick in block.holders.items():
                if depth.get(variant, 0) == i and self._holds(variant, tick):
                    depth[variant], last[variant] = i + 1, tick
            if len(block.children) >= COMMON:
                common = i + 1
            if block.ends:
                ended, ended_chars = i + 1, block.ends
        sent = self._ids.get(prompt.session) if prompt.session else None
        by_id = sent[0] if sent is not None and self._holds(*sent) else None
        if not depth and by_id is None:
            return None
        cached = {v: n * BLOCK_CHARS for v, n in depth.items()}
        # the session's last instance, else the longest match (of equals, the latest)
        variant = by_id or max(depth, key=lambda v: (depth[v], last[v]))
        grew = ended > common and prompt.chars > ended_chars
        return Held(variant, cached, grew or by_id is not None)

    def remember(self, prompt: Prompt, variant: str) -> None:
        """``variant``'s instance was sent this prompt: it holds its blocks now."""
        self._tick += 1
        parent: _Block | None = None
        for digest in prompt.blocks:
            block = self._blocks.get(digest)
            if block is None:
                block = self._blocks[digest] = _Block()
            else:
                self._blocks.move_to_end(digest)
            block.holders[variant] = self._tick
            if parent is not None and len(parent.children) < COMMON:
                parent.children.add(digest)
            parent = block
        if parent is not None:
            parent.ends = max(parent.ends, prompt.chars)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
        if prompt.session:
            self._ids[prompt.session] = (variant, self._tick)
            self._ids.move_to_end(prompt.session)
            if len(self._ids) > MAX_IDS:
                self._ids.popitem(last=False)

    def forget(self, variant: str) -> None:
        """``variant``'s instance lost its cache (it was stopped or restarted): what it was
        sent so far counts no more."""
        self._forgotten[variant] = self._tick
