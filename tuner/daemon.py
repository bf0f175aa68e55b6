"""Wire the daemon together from one ``Settings`` object and run it under uvicorn."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import uvicorn
from starlette.applications import Starlette

from tuner.classify import classify, load_definitions
from tuner.metrics import Metrics
from tuner.proxy.app import Service, create_app
from tuner.records import RecordStore
from tuner.settings import Settings
from tuner.tuning.plan import plan_tuning
from tuner.tuning.service import TuningService
from tuner.upstream.capabilities import Capabilities
from tuner.upstream.client import UpstreamClient
from tuner.upstream.launch import model_alias, prepare, router_argv, server_argv
from tuner.upstream.process import ExternalMonitor, ManagedServer, free_port
from tuner.upstream.provision import Progress, stderr_progress

__all__ = ["Daemon", "build_daemon", "serve"]


@dataclass(slots=True)
class Daemon:
    settings: Settings
    app: Starlette
    upstream: UpstreamClient
    supervisor: ManagedServer | ExternalMonitor
    records: RecordStore
    capabilities: Capabilities | None
    tuning: TuningService | None = None


def build_daemon(settings: Settings, progress: Progress | None = None) -> Daemon:
    """Locate (or build) llama-server, pick the model, and assemble the app."""
    records = RecordStore(settings.records_dir)
    caps: Capabilities | None = None
    supervisor: ManagedServer | ExternalMonitor
    tuning: TuningService | None = None
    public_models: list[str] = []
    if settings.upstream_url is not None:
        client = UpstreamClient(
            str(settings.upstream_url), read_timeout_s=settings.request_timeout_s
        )
        supervisor = ExternalMonitor(client)
    else:
        prepared = prepare(settings, progress or stderr_progress)
        caps, model = prepared.capabilities, prepared.model
        port = free_port()
        alias = model_alias(settings, model)
        plan = plan_tuning(settings, prepared) if settings.tune else None
        client = UpstreamClient(
            f"http://127.0.0.1:{port}",
            read_timeout_s=settings.request_timeout_s,
            default_model=None if plan and plan.mode == "router" else alias,
        )
        if plan is not None and plan.mode == "router":
            argv = router_argv(prepared.binary, settings, caps, plan.presets, plan.capacity, port)
            public_models = [alias]
        else:
            argv = server_argv(
                prepared.binary, settings, caps, model=model, draft=prepared.draft, port=port
            )
        supervisor = ManagedServer(
            argv,
            client,
            log_path=settings.state_dir / "logs" / "llama-server.log",
            startup_timeout_s=settings.startup_timeout_s,
        )
        if plan is not None:
            tuning = TuningService(plan.engine, settings.state_dir, plan.meta, mode=plan.mode,
                                   flush=records.flush)  # fmt: skip
            records.observers.append(tuning.observe)
    services: list[Service] = [supervisor] + ([tuning] if tuning else [])
    definitions = load_definitions(settings.classes_file)
    metrics = Metrics(client, records)
    if tuning is not None:
        metrics.watch_tuning(tuning.engine)
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
        public_models=public_models,
    )
    return Daemon(settings, app, client, supervisor, records, caps, tuning)


class _Server(uvicorn.Server):
    """uvicorn, with signal handlers that only set the exit flag.

    Stock uvicorn re-raises the captured signal after its graceful shutdown, so
    a SIGTERM stop ends with status -15. A drained, clean stop should exit 0.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def serve(settings: Settings) -> int:
    """Run the daemon until SIGINT/SIGTERM; uvicorn drains in-flight requests."""
    daemon = build_daemon(settings)
    config = uvicorn.Config(
        daemon.app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=30,
    )
    _Server(config).run()
    return 0
