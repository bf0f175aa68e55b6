"""The exceptions spec-tuner raises, one root and a few leaves.

    TunerError
    ├── ConfigError            settings or files the user gave are wrong or missing
    ├── ProvisionError         no llama-server could be found or built
    ├── RequestError           a client request is malformed (-> HTTP 4xx)
    └── UpstreamError          llama-server could not answer
        ├── UpstreamNotReady   it is starting, restarting or stopped (-> 503)
        ├── UpstreamTimeout    it took longer than the configured timeout (-> 504)
        └── UpstreamStalled    its instance stopped answering mid-request (-> 504)

Foreign errors (httpx, OS, subprocess) are translated at the boundary with
``raise ... from exc``; the proxy maps these types, never message text, to
OpenAI-shaped JSON errors.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ProvisionError",
    "RequestError",
    "TunerError",
    "UpstreamError",
    "UpstreamNotReady",
    "UpstreamStalled",
    "UpstreamTimeout",
]


class TunerError(Exception):
    """Root of every error spec-tuner raises on purpose."""


class ConfigError(TunerError):
    """A setting, path or file given by the user is wrong or missing."""


class ProvisionError(TunerError):
    """No llama-server binary could be located or built."""


class RequestError(TunerError):
    """A client request is malformed; carries what an OpenAI error needs."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status


class UpstreamError(TunerError):
    """llama-server could not produce an answer."""


class UpstreamNotReady(UpstreamError):
    """llama-server is starting, restarting or stopped; try again shortly."""

    def __init__(self, message: str = "the model server is not ready", retry_after: int = 2):
        super().__init__(message)
        self.retry_after = retry_after


class UpstreamTimeout(UpstreamError):
    """llama-server did not answer within the configured timeout."""


class UpstreamStalled(UpstreamError):
    """The instance answering a request stopped answering (its preset is being reloaded)."""
