"""What the model will see, pulled out of a request body. Pure and total: never raises.

Completions: the prompt (a string, strings, or token ids, which carry no text).
Chat: the system messages, the history, and the last user message; content may
be a string or an array of parts; tool calls contribute their arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["PromptView", "is_infill", "view_of"]

MAX_CHARS = 256 * 1024  # what we keep of a prompt at most: time and memory stay bounded
HEAD_CHARS = 4096  # a long prompt keeps its head (the instruction) and its tail


def _bounded(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    return text[:HEAD_CHARS] + "\n" + text[-(MAX_CHARS - HEAD_CHARS) :]


@dataclass(frozen=True, slots=True)
class PromptView:
    text: str  # everything, in order
    instruction: str  # the last user message (chat) or the whole prompt (completion)
    system: str
    turns: int  # chat messages (0 for a completion)
    has_tools: bool
    chat: bool


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        for key in ("text", "content", "input_text"):
            value = part.get(key)
            if isinstance(value, str):
                return value
    return ""


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(t for t in map(_part_text, content) if t)
    else:
        text = ""
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                text += "\n" + function["arguments"]
    return text


def _chat_view(messages: list[Any], tools: bool) -> PromptView:
    """Newest messages first, until the budget is spent: older history is not read at all."""
    texts: list[str] = []
    system: list[str] = []
    instruction: str | None = None
    budget = MAX_CHARS
    for message in reversed(messages):
        if not isinstance(message, dict):
            continue
        text = _bounded(_content(message))
        role = message.get("role")
        if instruction is None and role == "user":
            instruction = text
        if role in ("system", "developer"):
            system.append(text[:HEAD_CHARS])
        if budget > 0:
            texts.append(text[-budget:])
            budget -= len(text) + 1
        elif instruction is not None:
            break
    texts.reverse()
    if instruction is None:
        instruction = texts[-1] if texts else ""
    return PromptView(
        "\n".join(texts), instruction, "\n".join(reversed(system)), len(messages), tools, chat=True
    )


def is_infill(body: Any) -> bool:
    """A fill-in-the-middle request (``/infill``: a prefix and a suffix around the cursor)."""
    return (
        isinstance(body, dict)
        and "messages" not in body
        and ("input_prefix" in body or "input_suffix" in body)
    )


def _infill_text(body: dict[str, Any]) -> str:
    """What the model reads of a fill-in-the-middle request: the context files, the prefix,
    the prompt and the suffix."""
    extra = body.get("input_extra")
    chunks = extra if isinstance(extra, list) else []
    parts = [c.get("text") for c in chunks if isinstance(c, dict)]
    parts += [body.get(k) for k in ("input_prefix", "prompt", "input_suffix")]
    return "\n".join(p for p in parts if isinstance(p, str) and p)


def view_of(body: Any) -> PromptView:
    """The prompt of a chat, completion or infill request body (or of a workload line)."""
    if not isinstance(body, dict):
        return PromptView("", "", "", 0, False, chat=False)
    if is_infill(body):
        text = _bounded(_infill_text(body))
        return PromptView(text, text, "", 0, False, chat=False)
    tools = bool(body.get("tools")) or bool(body.get("functions"))
    messages = body.get("messages")
    if isinstance(messages, list):
        return _chat_view(messages, tools)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "\n".join(p for p in prompt if isinstance(p, str))
    elif isinstance(prompt, dict):  # llama.cpp multimodal prompt objects
        prompt = prompt.get("prompt_string") or json.dumps(prompt)
    text = _bounded(prompt) if isinstance(prompt, str) else ""
    return PromptView(text, text, "", 0, tools, chat=False)
