"""The HTTP edge: an OpenAI-compatible proxy in front of llama-server."""

from tuner.proxy.app import create_app

__all__ = ["create_app"]
