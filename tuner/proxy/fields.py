"""Every request field a client sends, what each engine does with it, and what the proxy does.

The table (``FIELDS``) is the proxy's contract with its clients: where the engines answer
a field alike it is sent as it is; where they differ the proxy makes them the same; where it
can do what neither does (several choices, echo), it does. ``docs/operations.md`` shows the
table (``table_markdown``) and the conformance suite (``tests/integration/test_conformance``)
sends a request per row, to a plain llama-server of each engine and to the daemon in front of
it. ``normalize`` applies the rows that change a body; pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["FIELDS", "Field", "Treatment", "normalize", "table_markdown"]

CHAT, COMPLETIONS, NATIVE = "/v1/chat/completions", "/v1/completions", "/completion"
INFILL = "/infill"
OPENAI = frozenset({CHAT, COMPLETIONS})
GENERATION = frozenset({CHAT, COMPLETIONS, NATIVE})
CHAT_ONLY, COMPLETIONS_ONLY = frozenset({CHAT}), frozenset({COMPLETIONS})
PROMPTED = frozenset({COMPLETIONS, NATIVE})


class Treatment(StrEnum):
    """What the proxy does with a field."""

    SENT = "sent as it is"
    LENGTH = "sent as max_tokens too"  # the engines read different names for one length
    CHOICES = "one request per choice"  # n, a list of prompts: answers joined, indexed
    ECHO = "the prompt put before the text"  # completions' echo
    DROPPED = "dropped, as mainline ignores it"  # ik_llama.cpp refuses what mainline ignores


@dataclass(frozen=True, slots=True)
class Field:
    """One request field: where it is read, what mainline llama.cpp and ik_llama.cpp do with
    it, the proxy's treatment, and a valid value the conformance suite sends (``bad``: one
    the proxy refuses with a 400 naming it)."""

    name: str
    endpoints: frozenset[str]
    mainline: str
    ik: str
    treatment: Treatment
    sample: Any
    bad: Any = None
    why: str = ""  # where the daemon answers otherwise than a plain server: why


READS = "reads it"
_F = Field
FIELDS: tuple[Field, ...] = (
    # the OpenAI fields, chat and completions
    _F("model", GENERATION, "ignores it (one model)", "ignores it", Treatment.SENT,
       "any-name", 7, "a router instance is chosen by the tuner; the answer names the model"),
    _F("stream", GENERATION, READS, READS, Treatment.SENT, True, "yes"),
    _F("stream_options", OPENAI, "reads include_usage", "reads include_usage", Treatment.SENT,
       {"include_usage": True}, "usage"),
    _F("max_tokens", GENERATION, READS, READS, Treatment.SENT, 4, -5),
    _F("max_completion_tokens", OPENAI, "an alias of n_predict", "does not read it: the answer "
       "runs to the context's end", Treatment.LENGTH, 4, "four",
       "ik_llama.cpp gets max_tokens as well, so the length holds on both"),
    _F("temperature", GENERATION, READS, READS, Treatment.SENT, 0.0, -1),
    _F("top_p", GENERATION, READS, READS, Treatment.SENT, 0.9, 2),
    _F("n", OPENAI, "that many choices", "refuses n > 1 with a 500", Treatment.CHOICES, 2, 0,
       "one request per choice on both engines, each routed as its class's: same variant"),
    _F("stop", GENERATION, READS, READS, Treatment.SENT, ["\n\n"], 5),
    _F("presence_penalty", GENERATION, READS, READS, Treatment.SENT, 0.1, "high"),
    _F("frequency_penalty", GENERATION, READS, READS, Treatment.SENT, 0.1, "high"),
    _F("logit_bias", GENERATION, READS, READS, Treatment.SENT, {"2": -100}, "none"),
    _F("seed", GENERATION, READS, READS, Treatment.SENT, 42, 1.5),
    _F("response_format", OPENAI, "a JSON grammar", "a JSON grammar", Treatment.SENT,
       {"type": "json_object"}, "json"),
    _F("user", OPENAI, "ignores it", "ignores it", Treatment.SENT, "u-1",
       why="keys the conversation with prompt_cache_key (the instance holding its history)"),
    _F("prompt_cache_key", OPENAI, "ignores it", "ignores it", Treatment.SENT, "conv-1"),
    _F("metadata", OPENAI, "ignores it", "ignores it", Treatment.SENT, {"app": "x"}),
    _F("store", OPENAI, "ignores it", "ignores it", Treatment.SENT, False),
    _F("parallel_tool_calls", CHAT_ONLY, READS, READS, Treatment.SENT, False),
    _F("reasoning_effort", CHAT_ONLY, "ignores it", "ignores it", Treatment.SENT, "low"),
    _F("tools", CHAT_ONLY, "reads it (jinja templates, on by default)", "refuses it without "
       "--jinja (500)", Treatment.SENT,
       [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}],
       [{"type": "function"}], "the daemon starts ik_llama.cpp with --jinja"),
    _F("tool_choice", CHAT_ONLY, READS, "refuses it without --jinja (500)", Treatment.SENT,
       "auto", 3, "the daemon starts ik_llama.cpp with --jinja"),
    _F("logprobs", GENERATION, READS, READS, Treatment.SENT, True, "yes"),
    _F("top_logprobs", CHAT_ONLY, "reads it with logprobs", "reads it with logprobs",
       Treatment.SENT, 2, -1),
    # the completions-only OpenAI fields
    _F("prompt", PROMPTED, "a string, tokens, or a list: one choice each",
       "a list comes back cut short", Treatment.CHOICES, ["One", "Two"], {"text": 1},
       "a list of prompts is one request each on both engines"),
    _F("echo", COMPLETIONS_ONLY, "ignores it", "refuses it with a 500", Treatment.ECHO, True,
       "yes", "the daemon puts the prompt before each choice's text, as OpenAI does"),
    _F("best_of", COMPLETIONS_ONLY, "ignores it", "refuses it with a 500", Treatment.DROPPED, 1,
       why="dropped on both engines (mainline's answer): n choices come back"),
    _F("suffix", COMPLETIONS_ONLY, "ignores it", "refuses it with a 500", Treatment.DROPPED, "",
       why="dropped on both engines (mainline's answer); /infill takes a prefix and suffix"),
    # llama.cpp's own, on every generation route
    _F("n_predict", GENERATION, READS, READS, Treatment.SENT, 4, "four"),
    _F("top_k", GENERATION, READS, READS, Treatment.SENT, 40, 0.5),
    _F("min_p", GENERATION, READS, READS, Treatment.SENT, 0.05, "low"),
    _F("typical_p", GENERATION, READS, READS, Treatment.SENT, 1.0),
    _F("repeat_penalty", GENERATION, READS, READS, Treatment.SENT, 1.1, "x"),
    _F("repeat_last_n", GENERATION, READS, READS, Treatment.SENT, 64),
    _F("mirostat", GENERATION, READS, READS, Treatment.SENT, 0),
    _F("grammar", GENERATION, READS, READS, Treatment.SENT, 'root ::= "yes" | "no"',
       "root ::= ("),
    _F("json_schema", GENERATION, READS, READS, Treatment.SENT, {"type": "string"}, "string"),
    _F("cache_prompt", GENERATION, READS, READS, Treatment.SENT, True, "yes"),
    _F("n_probs", GENERATION, READS, READS, Treatment.SENT, 2, -3),
    _F("n_keep", GENERATION, READS, READS, Treatment.SENT, 0),
    _F("ignore_eos", GENERATION, READS, "ignores it", Treatment.SENT, False),
    _F("timings_per_token", GENERATION, READS, READS, Treatment.SENT, False),
    _F("dry_multiplier", GENERATION, READS, READS, Treatment.SENT, 0.0),
    _F("xtc_probability", GENERATION, READS, READS, Treatment.SENT, 0.0),
    _F("id_slot", GENERATION, READS, READS, Treatment.SENT, -1,
       why="one slot per instance on ik_llama.cpp: only -1 and 0 mean anything there"),
)  # fmt: skip

_LENGTHS = ("max_tokens", "n_predict")


def normalize(endpoint: str, body: dict[str, Any]) -> bool:
    """Apply the table's one-body treatments to ``body`` in place (``LENGTH``, ``DROPPED``,
    and ``/infill``'s prompt, which ik_llama.cpp requires); whether anything changed.
    ``CHOICES`` and ``ECHO`` are ``tuner.proxy.choices``'s."""
    changed = False
    length = body.get("max_completion_tokens")
    if length is not None and endpoint in OPENAI and not any(k in body for k in _LENGTHS):
        body["max_tokens"] = length
        changed = True
    if endpoint == INFILL and "prompt" not in body:
        body["prompt"] = ""  # mainline's default; ik_llama.cpp refuses an infill without one
        changed = True
    if endpoint == COMPLETIONS:
        for name in ("best_of", "suffix"):
            if name in body:
                del body[name]
                changed = True
    return changed


def table_markdown() -> str:
    """The table as ``docs/operations.md`` shows it."""
    short = {CHAT: "chat", COMPLETIONS: "completions", NATIVE: "/completion"}
    rows = [
        "| field | routes | mainline llama.cpp | ik_llama.cpp 55d3c05 | spec-tuner |",
        "|---|---|---|---|---|",
    ]
    for f in FIELDS:
        routes = ", ".join(short[e] for e in (CHAT, COMPLETIONS, NATIVE) if e in f.endpoints)
        proxy = f.treatment.value + (f": {f.why}" if f.why else "")
        rows.append(f"| `{f.name}` | {routes} | {f.mainline} | {f.ik} | {proxy} |")
    return "\n".join(rows) + "\n"
