"""A raw ASGI scope for driving the app by hand, where a test needs what httpx's ASGI
transport cannot do (a client that vanishes, a stream held open while others run)."""

from __future__ import annotations

from typing import Any


def post_scope(path: str = "/v1/completions", spec_version: str = "2.4") -> dict[str, Any]:
    """The scope of a JSON POST to ``path`` on the proxy. ``spec_version`` below 2.4:
    Starlette listens for the client's ``http.disconnect`` while it streams."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec_version},
        "http_version": "1.1",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "scheme": "http",
        "server": ("proxy", 80),
        "client": ("c", 1),
    }
