"""Wire the daemon together from one ``Settings`` object and run it under uvicorn."""

from __future__ import annotations

from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette

from tuner.proxy.app import Service, create_app
from tuner.records import RecordStore
from tuner.settings import Settings
from tuner.upstream.capabilities import Capabilities, probe_capabilities
from tuner.upstream.client import UpstreamClient
from tuner.upstream.launch import model_alias, resolve_model, server_argv
from tuner.upstream.process import ExternalMonitor, ManagedServer, free_port
from tuner.upstream.provision import Progress, locate_llama_server, stderr_progress

__all__ = ["Daemon", "build_daemon", "serve"]


@dataclass(slots=True)
class Daemon:
    settings: Settings
    app: Starlette
    upstream: UpstreamClient
    supervisor: ManagedServer | ExternalMonitor
    records: RecordStore
    capabilities: Capabilities | None


def build_daemon(settings: Settings, progress: Progress | None = None) -> Daemon:
    """Locate (or build) llama-server, pick the model, and assemble the app."""
    records = RecordStore(settings.records_dir)
    caps: Capabilities | None = None
    supervisor: ManagedServer | ExternalMonitor
    if settings.upstream_url is not None:
        client = UpstreamClient(
            str(settings.upstream_url), read_timeout_s=settings.request_timeout_s
        )
        supervisor = ExternalMonitor(client)
    else:
        binary = locate_llama_server(
            settings.llama_server, settings.cache_dir, progress=progress or stderr_progress
        )
        caps = probe_capabilities(binary)
        model, draft = resolve_model(settings)
        port = free_port()
        client = UpstreamClient(
            f"http://127.0.0.1:{port}",
            read_timeout_s=settings.request_timeout_s,
            default_model=model_alias(settings, model),
        )
        argv = server_argv(binary, settings, caps, model=model, draft=draft, port=port)
        supervisor = ManagedServer(
            argv,
            client,
            log_path=settings.state_dir / "logs" / "llama-server.log",
            startup_timeout_s=settings.startup_timeout_s,
        )
    services: list[Service] = [supervisor]
    app = create_app(client, records, services=services, max_body_bytes=settings.max_body_bytes)
    return Daemon(settings, app, client, supervisor, records, caps)


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
    uvicorn.Server(config).run()
    return 0
