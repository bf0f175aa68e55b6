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
from tuner.daemon.plan import tuning_config
from tuner.daemon.topology import topology_for
from tuner.errors import ConfigError
from tuner.fleet.collector import FleetCollector
from tuner.logs import configure_logging, get_logger
from tuner.metrics import Metrics, RequestMetrics
from tuner.proxy.app import Lifecycle, create_app
from tuner.proxy.gate import VariantGate
from tuner.records import RecordStore
from tuner.settings import Settings
from tuner.statedir import state_dir_lock
from tuner.systemd import Notifier, notify
from tuner.tuning.replay.worker import Replayer
from tuner.tuning.runtime.collectors import ReplayCollector, TuningCollector
from tuner.tuning.runtime.service import TuningService
from tuner.tuning.runtime.single import one_at_a_time
from tuner.upstream.capabilities import Capabilities
from tuner.upstream.client import UpstreamClient
from tuner.upstream.process import ExternalMonitor, ManagedServer
from tuner.upstream.provision import Progress, stderr_progress

__all__ = ["Daemon", "build_daemon", "reload", "serve"]

log = get_logger(__name__)

# Settings a SIGHUP applies; any other change is logged as needing a restart.
RELOADABLE = frozenset({"api_keys", "classes_file", "tuning_file", "explore_share", "log_level"})


@dataclass(slots=True)
class Daemon:
    settings: Settings
    app: Starlette
    upstream: UpstreamClient
    supervisor: ManagedServer | ExternalMonitor  # pool mode: the pool's readiness
    records: RecordStore
    capabilities: Capabilities | None
    notifier: Notifier
    tuning: TuningService | None = None


def _progress(message: str) -> None:
    """Provisioning progress to stderr and, under systemd, as the unit's STATUS."""
    stderr_progress(message)
    notify(f"STATUS={message}")


def build_daemon(settings: Settings, progress: Progress | None = None) -> Daemon:
    """Choose the way of serving (``topology``: locate or build llama-server, pick the
    model), and assemble the app on it."""
    topology = topology_for(settings, progress or _progress)
    settings, client, plan = topology.settings, topology.client, topology.plan
    tuning: TuningService | None = None
    gate: VariantGate | None = None
    if plan is not None and (
        settings.exclusive_variants == "on"
        or (settings.exclusive_variants == "auto" and not plan.gpu)
    ):
        gate = VariantGate()
    if plan is not None:
        tuning = TuningService(
            plan.build_engine,
            settings.state_dir,
            plan.meta,
            strategy=one_at_a_time(plan.reload_guess_s) if plan.single else lambda e: e,
            unavailable=client.health.is_recovering,
            instances={m.name: repr(m.flags) for m in plan.members},
            fleet=plan.fleet,
        )
    notifier = Notifier(
        lambda: client.ready,
        f"{topology.served} on http://{settings.host}:{settings.port}",
        restarts=lambda: client.health.restarts,
    )
    # the supervisor after the pool, where there is one: it polls the pool
    services: list[Lifecycle] = [*topology.services, topology.supervisor]
    services += ([tuning] if tuning else []) + [notifier]
    replayer: Replayer | None = None
    if tuning is not None and tuning.tuner.per_class:  # one variant at a time: no replays
        replayer = Replayer(tuning.engine, client.base_url, transport=topology.tokenizer)
        services.append(replayer)
    definitions = load_definitions(settings.classes_file)
    collectors: list[Collector] = (
        [TuningCollector(tuning.engine, tuning.quarantine)] if tuning else []
    ) + ([ReplayCollector(replayer)] if replayer else [])
    if plan is not None and plan.fleet is not None:
        collectors.append(FleetCollector(plan.fleet))
    requests = RequestMetrics()
    consumers = [Consumer("metrics", requests.observe)]
    if tuning is not None:
        consumers.append(Consumer("learner", tuning.observe))
    records = RecordStore(settings.records_dir, consumers=consumers)
    metrics = Metrics(requests, client, records, collectors)
    app = create_app(
        client,
        records,
        services=services,
        max_body_bytes=settings.max_body_bytes,
        classifier=partial(classify, definitions=definitions),
        api_keys=settings.api_keys,
        max_concurrent=settings.max_concurrent,
        metrics=metrics,
        router=tuning.route if tuning else None,
        public_models=list(topology.public_models),
        gate=gate,
        keep=replayer.submit if replayer else None,
        fallback=tuning.fallback if tuning else None,
        engine=caps.engine if (caps := topology.capabilities) else None,
    )
    return Daemon(settings, app, client, topology.supervisor, records, caps, notifier, tuning)


def reload(daemon: Daemon, load: Callable[[], Settings]) -> dict[str, Any]:
    """Apply fresh settings (from ``load``) to a running daemon: API keys, classes, tuning
    file, log level.

    Everything is loaded and validated first; on any error nothing changes (logged).
    Settings that need a restart (the model, ports, llama-server flags) are named.
    """
    old = daemon.settings
    try:
        settings = load()
        definitions = load_definitions(settings.classes_file)
        tuning = tuning_config(settings) if daemon.tuning is not None else None
    except ConfigError as exc:
        log.error("reload_failed", error=str(exc), detail="the running configuration is kept")
        return {"ok": False, "error": str(exc)}
    changed = sorted(n for n in Settings.model_fields if getattr(settings, n) != getattr(old, n))
    daemon.app.state.keys.set(settings.api_keys)
    daemon.app.state.handlers.classifier = partial(classify, definitions=definitions)
    tuning_changed = (
        daemon.tuning.engine.reconfigure(tuning)
        if daemon.tuning is not None and tuning is not None
        else []
    )
    if settings.log_level != old.log_level:
        configure_logging(settings.log_format, settings.log_level)
    restart = [n for n in changed if n not in RELOADABLE]
    daemon.settings = settings.model_copy(update={n: getattr(old, n) for n in restart})
    result = {"ok": True, "changed": changed, "tuning": tuning_changed, "needs_restart": restart}
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
