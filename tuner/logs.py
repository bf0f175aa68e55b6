"""structlog set-up: configured once in the entry point, JSON lines when not on a terminal.

Lines from stdlib loggers (uvicorn) go through the same processors and renderer,
so a log file or the journal gets one format. httpx's per-request INFO lines are
silenced: the proxy logs each request itself, once.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Literal

import structlog

__all__ = ["configure_logging", "get_logger"]

LogFormat = Literal["auto", "json", "console"]

# per-request and per-job INFO lines (the fleet sync runs every 2 s) that would drown ours
_QUIET = ("httpx", "httpcore", "uvicorn.access", "apscheduler")


class _Stderr:
    """``sys.stderr`` as it is when written to, not when logging was configured (a test
    runner or a daemoniser may replace it; a bound stream may be closed by then).

    A log line that cannot be written (output on a full disk, a closed pipe or file) is
    dropped: logging must never fail the request it describes.
    """

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except (OSError, ValueError):
            return 0

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()


def configure_logging(fmt: LogFormat = "auto", level: str = "info") -> None:
    """Configure structlog and stdlib logging once, at start-up."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(_Stderr())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A module-level logger; bind request ids through structlog.contextvars."""
    return structlog.get_logger(name)  # type: ignore[no-any-return]
