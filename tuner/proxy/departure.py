"""A client that leaves is a cancellation: whatever its request started upstream stops too.

Starlette runs a handler to its end whether or not its client is still there, so a whole
(not streamed) answer, a request waiting at the variant gate and a stream whose upstream
has not answered yet would each keep an instance's slot busy for as long as the generation
runs. ``unless_gone`` runs the handler's work beside a watch of the ASGI receive channel
and cancels the work when the client disconnects; the cancellation closes the upstream
connection, and llama-server (both engines) cancels a task whose connection closed. Once
a stream's response has started, Starlette's own watch takes over (``StreamingResponse``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive

from tuner.records import CLIENT_GONE

__all__ = ["CLIENT_GONE", "CLIENT_GONE_STATUS", "ClientGone", "unless_gone"]

# nginx's "client closed request": recorded, never sent (nobody is there to read it)
CLIENT_GONE_STATUS = 499

Discard = Callable[[Response], Awaitable[None]]


class ClientGone(Exception):
    """The client closed its connection before its answer was handed back."""


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # the body was read already: only a disconnect can come


async def unless_gone(receive: Receive, work: Awaitable[Response], discard: Discard) -> Response:
    """``work``'s response; ``ClientGone`` where the client disconnected first. ``work``
    is then cancelled, and what it awaited with it; a response it had made all the same
    goes to ``discard`` (a stream's hold on its upstream connection)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watch.cancel()
        raise
    if task.done():
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        return task.result()
    task.cancel()
    try:
        late = await task  # it finished before the cancellation reached it
    except (asyncio.CancelledError, Exception):
        pass  # nobody is there to be told
    else:
        await discard(late)
    raise ClientGone(CLIENT_GONE)
