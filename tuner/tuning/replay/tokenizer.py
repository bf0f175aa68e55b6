"""Token ids of a request and its answer, from the llama-server instance that answered it.

Chat messages are rendered by the server's own template (``/apply-template``), then the
prompt and the answer's text are tokenized (``/tokenize``) as the server would see them.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["Tokenizer"]

_TEMPLATE_KEYS = ("messages", "tools", "tool_choice", "chat_template_kwargs")


class Tokenizer:
    """A blocking client of one llama-server (or router: ``model`` picks the instance)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        # no keep-alive: llama-server drops idle connections, and a pooled one that it
        # dropped fails the next call ("disconnected without sending a response")
        self.client = httpx.Client(
            base_url=base_url,
            timeout=timeout_s,
            transport=transport,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def close(self) -> None:
        self.client.close()

    def prompt(self, endpoint: str, body: dict[str, Any], model: str | None) -> list[int] | None:
        """The prompt's token ids, or None for a prompt given as ids or as several prompts."""
        if endpoint.endswith("/chat/completions"):
            request = {k: body[k] for k in _TEMPLATE_KEYS if k in body}
            if model is not None:
                request["model"] = model
            reply = self.client.post("/apply-template", json=request)
            reply.raise_for_status()
            text = reply.json().get("prompt")
        else:
            text = body.get("prompt")
        if not isinstance(text, str):
            return None  # token-id or multi-prompt completions: not replayed
        return self.tokenize(text, special=True, model=model)

    def tokenize(self, text: str, *, special: bool, model: str | None) -> list[int]:
        request: dict[str, Any] = {
            "content": text,
            "add_special": special,
            "parse_special": special,
        }
        if model is not None:
            request["model"] = model
        reply = self.client.post("/tokenize", json=request)
        reply.raise_for_status()
        return [int(t) for t in reply.json()["tokens"]]
