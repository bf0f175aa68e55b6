"""Wire the daemon together from one ``Settings`` object and run it under uvicorn.

Signals: SIGTERM/SIGINT drain and stop (exit 0); SIGHUP reloads what can change
without a restart (``reload``). Under systemd (``Type=notify``) it reports readiness,
status, the watchdog and stopping (``tuner.systemd``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import uvicorn
from prometheus_client.registry import Collector
from starlette.applications import Starlette

from tuner.classify import classify, load_definitions
from tuner.consumers import Consumer
from tuner.daemon.deployment import Serving, deploy
from tuner.daemon.plan import tuning_config
from tuner.daemon.topology import topology_for
from tuner.engines.auto import EngineSelector, first_engine
from tuner.errors import ConfigError
from tuner.logs import configure_logging, get_logger
from tuner.metrics import Metrics, RequestMetrics
from tuner.proxy.app import create_app
from tuner.records import RecordStore
from tuner.settings import Settings, retired_in_environment
from tuner.statedir import state_dir_lock
from tuner.systemd import Notifier, notify
from tuner.upstream.provision import Progress, stderr_progress

__all__ = ["Daemon", "build_daemon", "reload", "serve"]

log = get_logger(__name__)

# Settings a SIGHUP applies in place; the ones it cannot apply at all (the proxy's own
# socket, limits and state); any other change is served by a new topology (``Serving``).
RELOADABLE = frozenset({"api_keys", "classes_file", "tuning_file", "log_level"})
RESTART = frozenset(
    {"host", "port", "state_dir", "log_format", "max_body_bytes", "max_concurrent"}
    | {"drain_timeout_s"}
)


@dataclass(slots=True)
class Daemon:
    settings: Settings  # as loaded (the topology holds them sized for the model)
    app: Starlette
    serving: Serving
    records: RecordStore
    notifier: Notifier


def _progress(message: str) -> None:
    """Provisioning progress to stderr and, under systemd, as the unit's STATUS."""
    stderr_progress(message)
    notify(f"STATUS={message}")


def build_daemon(settings: Settings, progress: Progress | None = None) -> Daemon:
    """Choose the way of serving (``topology``: locate or build llama-server, pick the
    model), deploy the tuner on it, and assemble the app. ``TUNER_ENGINE=auto``: start on
    ``first_engine`` and let the ``EngineSelector`` find the faster one in the background."""
    auto = chooses_engine(settings)
    start = settings.model_copy(update={"engine": first_engine(settings)}) if auto else settings
    topology = topology_for(start, progress or _progress)
    serving = Serving(
        deploy(topology),
        startup_timeout_s=settings.startup_timeout_s,
        drain_timeout_s=settings.drain_timeout_s,
    )
    requests = RequestMetrics()
    consumers = [Consumer("metrics", requests.observe), Consumer("learner", serving.observe)]
    records = RecordStore(settings.records_dir, consumers=consumers)
    selector = (
        EngineSelector(
            topology.settings,
            serving=lambda: serving.current.engine,
            switch=lambda engine: serving.request(
                partial(topology_for, on_engine(settings, engine), _progress), records
            ),
        )
        if auto
        else None
    )
    notifier = Notifier(
        lambda: serving.current.backend.upstream.ready,
        f"{topology.served} on http://{settings.host}:{settings.port}",
        restarts=lambda: serving.current.backend.upstream.health.restarts,
    )
    collectors: list[Collector] = [serving, *([selector] if selector else [])]
    metrics = Metrics(requests, lambda: serving.current.backend.upstream, records, collectors)
    definitions = load_definitions(settings.classes_file)
    app = create_app(
        serving.slot,
        records,
        services=[serving, notifier, *([selector] if selector else [])],
        max_body_bytes=settings.max_body_bytes,
        classifier=partial(classify, definitions=definitions),
        api_keys=settings.api_keys,
        max_concurrent=settings.max_concurrent,
        metrics=metrics,
        status=selector.status if selector else None,
    )
    return Daemon(settings, app, serving, records, notifier)


def chooses_engine(settings: Settings) -> bool:
    """``TUNER_ENGINE=auto`` with nothing that names the server: the daemon measures."""
    return settings.engine == "auto" and settings.llama_server is None and not settings.upstream_url


def on_engine(settings: Settings, engine: str | None) -> Settings:
    """The settings for a topology on ``engine`` (where ``auto`` leaves it to the daemon)."""
    if not chooses_engine(settings) or engine is None:
        return settings
    return settings.model_copy(update={"engine": engine})


def reload(daemon: Daemon, load: Callable[[], Settings]) -> dict[str, Any]:
    """Apply fresh settings (from ``load``) to a running daemon: API keys, classes, tuning
    file and log level in place; the engine, model and llama-server's flags by serving on
    a new topology (built in the background, switched to without a failed request).

    Everything is loaded and validated first; on any error nothing changes (logged).
    Settings that need a restart (the proxy's address, limits, state dir) are named.
    """
    old = daemon.settings
    serving = daemon.serving
    try:
        settings = load()
        definitions = load_definitions(settings.classes_file)
        tuning = tuning_config(settings) if serving.current.tuning is not None else None
    except ConfigError as exc:
        log.error("reload_failed", error=str(exc), detail="the running configuration is kept")
        return {"ok": False, "error": str(exc)}
    changed = sorted(n for n in Settings.model_fields if getattr(settings, n) != getattr(old, n))
    daemon.app.state.keys.set(settings.api_keys)
    daemon.app.state.handlers.classifier = partial(classify, definitions=definitions)
    current = serving.current.tuning
    tuning_changed = (
        current.engine.reconfigure(tuning) if current is not None and tuning is not None else []
    )
    if settings.log_level != old.log_level:
        configure_logging(settings.log_format, settings.log_level)
    restart = [n for n in changed if n in RESTART]
    kept = settings.model_copy(update={n: getattr(old, n) for n in restart})
    topology = [n for n in changed if n not in RELOADABLE and n not in RESTART]
    serve_on = on_engine(kept, serving.current.engine)  # auto: the engine serving now
    replacing = bool(topology) and serving.request(
        partial(topology_for, serve_on, _progress), daemon.records
    )
    if replacing or not topology:
        daemon.settings = kept
    result = {
        "ok": True,
        "changed": changed,
        "tuning": tuning_changed,
        "needs_restart": restart,
        "new_topology": topology if replacing else [],
    }
    log.info("reloaded", **result)
    daemon.notifier.send("STATUS=reloaded configuration")
    return result


class _Server(uvicorn.Server):
    """uvicorn, with our own signal handling.

    Stock uvicorn re-raises the captured signal after its graceful shutdown, so
    a SIGTERM stop ends with status -15; a drained, clean stop should exit 0. A stop
    signal also tells systemd STOPPING=1 at once; SIGHUP reloads on the event loop.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        daemon: Daemon,
        reload_settings: Callable[[], Settings] | None = None,
    ) -> None:
        super().__init__(config)
        self.daemon = daemon
        self.reload_settings = reload_settings
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started:
            self.daemon.notifier.listening = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.daemon.notifier.stop_requested()
        if self.loop is not None and not self.should_exit:  # the first stop signal
            self.loop.call_soon_threadsafe(self._start_drain_clock)
        super().handle_exit(sig, frame)

    def _start_drain_clock(self) -> None:
        """After the drain bound, open streams end with an error event at their next chunk."""
        assert self.loop is not None
        drain = self.daemon.app.state.handlers.drain
        self.loop.call_later(self.daemon.settings.drain_timeout_s, setattr, drain, "cut", True)

    def handle_reload(self, sig: int, frame: Any) -> None:
        if self.loop is not None and self.reload_settings is not None:
            self.loop.call_soon_threadsafe(self._reload)

    def _reload(self) -> None:
        assert self.reload_settings is not None
        reload(self.daemon, self.reload_settings)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self.handle_reload)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DRAIN_BACKSTOP_S = 5
# an idle client connection stays open longer than clients keep theirs (httpx and the OpenAI
# SDK: 5 s, uvicorn's own default; urllib3: for ever), so no client sends a request on a
# connection the daemon is closing at that moment (a dropped request, not an error answer)
KEEP_ALIVE_S = 75


def serve(settings: Settings, reload_settings: Callable[[], Settings] | None = None) -> int:
    """Run the daemon until SIGINT/SIGTERM; uvicorn drains in-flight requests.

    ``reload_settings`` builds fresh settings for SIGHUP (the same sources as at start).
    """
    with state_dir_lock(settings.state_dir):
        return _serve(settings, reload_settings)


def _serve(settings: Settings, reload_settings: Callable[[], Settings] | None) -> int:
    for line in retired_in_environment():
        log.warning("setting_retired", message=line)
    daemon = build_daemon(settings)
    config = uvicorn.Config(
        daemon.app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # the backstop for what the drain clock cannot end (no chunk comes: a long prompt)
        timeout_graceful_shutdown=settings.drain_timeout_s + DRAIN_BACKSTOP_S,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    _Server(config, daemon, reload_settings).run()
    return 0
