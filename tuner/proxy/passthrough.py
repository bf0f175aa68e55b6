"""llama-server's routes that generate nothing: answered by whichever instance runs.

``/tokenize``, ``/detokenize``, ``/apply-template``, ``/props``, the embedding and rerank
routes: every instance of the model answers them alike, so they go to the one that always
runs (the router's or the pool's ``kept`` preset, no speculation), never loading a variant
for them. The engine's answer comes back as it is; its errors in OpenAI's shape, a client's
mistake a 4xx (an engine started without ``--embeddings`` says so with a 400).
``/slots`` is not served: behind a router or a pool each variant is an instance with slots
of its own, and one instance's would describe a fraction of the daemon (``/ready`` and
``/metrics`` say what runs).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from tuner.errors import TunerError
from tuner.proxy.openai_errors import OpenAIError, error_for_exception, translate_upstream_error
from tuner.proxy.relay import error_response
from tuner.proxy.validation import parse_body, validate_route
from tuner.upstream.client import UpstreamClient

__all__ = ["GETS", "POSTS", "passthrough"]

POSTS = (
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/embedding",
    "/embeddings",
    "/v1/embeddings",
    "/rerank",
    "/reranking",
    "/v1/rerank",
)
GETS = ("/props",)

Handler = Callable[[Request], Awaitable[Response]]
ReadBody = Callable[[Request], Awaitable[bytes]]  # the app's, bounded as every route's


def _instance(upstream: UpstreamClient) -> str | None:
    """The router model that answers (the preset that always runs); None: not a router."""
    if not upstream.routes:
        return None
    return upstream.kept or upstream.resolve_model(None)


def _body(request: Request, raw: bytes, instance: str | None) -> bytes:
    body = parse_body(raw)
    validate_route(request.url.path, body)
    if instance is None:
        return raw
    body["model"] = instance
    return json.dumps(body, ensure_ascii=False).encode()


def passthrough(upstream_of: Callable[[], UpstreamClient], read_body: ReadBody) -> Handler:
    """The handler of every route in ``POSTS`` and ``GETS``, on the upstream serving now."""

    async def handler(request: Request) -> Response:
        upstream = upstream_of()
        instance = _instance(upstream)
        try:
            if request.method == "POST":
                content = _body(request, await read_body(request), instance)
                response = await upstream.open("POST", request.url.path, content=content)
            else:
                params = dict(request.query_params)
                if instance is not None:
                    params["model"] = instance
                response = await upstream.open("GET", request.url.path, params=params)
            raw = await response.aread()
            await response.aclose()
        except TunerError as exc:
            return error_response(error_for_exception(exc))
        if response.status_code == 404:  # this engine lacks the route
            path = request.url.path
            lacks = f"{request.method} {path}: the model server has no such route"
            return error_response(OpenAIError(404, lacks, code="not_found"))
        if response.status_code >= 400:
            return error_response(translate_upstream_error(response.status_code, raw))
        return Response(raw, status_code=response.status_code, media_type=response.content_type)

    return handler
