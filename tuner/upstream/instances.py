"""Where a router's presets run: each loaded preset's own instance address.

Mainline's router forwards a request to the preset's instance on a connection of its own,
and drops that connection when its client goes only while the answer streams: a whole (not
streamed) answer keeps generating after its client left, to its length or the context's
end (measured: docs/decisions.md). So the daemon sends whole answers straight to the
preset's instance, whose own check of a closed connection then cancels them. The router's
``GET /models`` names each loaded preset's port among its arguments; a preset not loaded,
or not known yet, is sent through the router, which loads it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

__all__ = ["RouterInstances", "instance_ports"]

REFRESH_S = 1.0  # at most one look at the router's list a second


def instance_ports(listing: Any) -> dict[str, int]:
    """Each loaded preset's port, from the router's ``GET /models`` answer. Pure.

    >>> instance_ports({"data": [{"id": "none", "status": {"value": "loaded",
    ...     "args": ["llama-server", "--port", "41001"]}}, {"id": "x", "status":
    ...     {"value": "unloaded", "args": ["--port", "0"]}}]})
    {'none': 41001}
    """
    found: dict[str, int] = {}
    models = listing.get("data") if isinstance(listing, dict) else None
    for model in models if isinstance(models, list) else []:
        status = model.get("status") if isinstance(model, dict) else None
        if not isinstance(status, dict) or status.get("value") != "loaded":
            continue
        args = status.get("args")
        if not isinstance(args, list) or "--port" not in args:
            continue
        at = args.index("--port") + 1
        port = args[at] if at < len(args) else None
        if isinstance(port, str) and port.isdigit() and int(port) > 0:
            found[str(model.get("id"))] = int(port)
    return found


class RouterInstances:
    """The loaded presets' addresses, looked up on the router when one is not known."""

    def __init__(self, http: httpx.AsyncClient, clock: Callable[[], float] = time.monotonic):
        self.http = http
        self.clock = clock
        self._ports: dict[str, int] = {}
        self._looked = float("-inf")
        self._looking: asyncio.Future[None] | None = None  # requests that miss wait for it

    async def url(self, preset: str) -> str | None:
        """The preset's instance address; None where it is not loaded (or not known)."""
        if preset not in self._ports:
            if self._looking is None and self.clock() - self._looked >= REFRESH_S:
                self._looked = self.clock()
                self._looking = asyncio.ensure_future(self._look())
            if self._looking is not None:
                await asyncio.shield(self._looking)
        port = self._ports.get(preset)
        return f"http://127.0.0.1:{port}" if port else None

    async def _look(self) -> None:
        try:
            response = await self.http.get("/models", timeout=5.0)
            self._ports = instance_ports(response.json())
        except (httpx.HTTPError, ValueError):
            pass
        finally:
            self._looking = None

    def forget(self, preset: str) -> None:
        """The instance did not answer there (stopped, or started again elsewhere)."""
        self._ports.pop(preset, None)
