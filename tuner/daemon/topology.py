"""One way of serving per deployment, chosen once from the settings: what the daemon
talks to, what supervises it, and what runs beside it.

- ``external``: a llama-server the user runs (``TUNER_UPSTREAM_URL``); no tuning.
- ``plain``: one managed llama-server, no tuning (``TUNER_TUNE=false``, or nothing to tune).
- ``router``: mainline llama-server's router, one preset per variant.
- ``pool``: the daemon's own instances, where the engine has no router (ik_llama.cpp).

Where only one instance fits, a router or a pool serves one variant at a time
(``TuningPlan.single``): the tuner differs, not the topology. ``build_daemon`` wires the
rest of the daemon from the ``Topology`` this module builds, and nothing below it asks
which way it serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

import httpx

from tuner.daemon.plan import TuningPlan, plan_tuning, sized, tuning_config
from tuner.model.gguf_facts import read_facts
from tuner.proxy.app import Lifecycle
from tuner.settings import Settings
from tuner.tuning.variants import BASELINE
from tuner.upstream.capabilities import Capabilities
from tuner.upstream.client import UpstreamClient
from tuner.upstream.launch import (
    Prepared,
    instance_argv,
    model_alias,
    prepare,
    router_argv,
    server_argv,
)
from tuner.upstream.pool import POOL_URL, AnyInstance, Pool
from tuner.upstream.process import ExternalMonitor, ManagedServer, free_port, kill_instance
from tuner.upstream.provision import Progress

__all__ = ["Kind", "Topology", "topology_for"]

POOL_HEALTH_S = 1.0  # how often the pool's readiness is read

Kind = Literal["external", "plain", "router", "pool"]


@dataclass(frozen=True, slots=True)
class Topology:
    """A way of serving, built: the upstream client, its supervisor, the services it runs
    before the supervisor (the pool), and what the rest of the daemon needs of it."""

    kind: Kind
    settings: Settings  # with what the model sized (the context)
    client: UpstreamClient
    supervisor: ManagedServer | ExternalMonitor
    served: str  # what it serves, for the log and systemd's status
    services: Sequence[Lifecycle] = ()
    public_models: Sequence[str] = ()  # the model ids /v1/models shows (router and pool)
    capabilities: Capabilities | None = None
    plan: TuningPlan | None = None  # None: the daemon proxies without tuning
    # how the replayer reaches an instance's tokenizer (the pool's), where not over HTTP
    tokenizer: httpx.BaseTransport | None = None
    infill: bool | None = None  # the model has fill-in-the-middle tokens (None: not known)


def topology_for(settings: Settings, progress: Progress) -> Topology:
    """The topology the settings ask for: an external server, or the engine prepared
    (built once, model fetched) and served plainly, through its router or in a pool."""
    if settings.upstream_url is not None:
        return _external(settings)
    # a bad tuning file stops the start before llama-server is built or started
    config = tuning_config(settings) if settings.tune else None
    prepared = prepare(settings, progress)
    facts = read_facts(prepared.model)  # once: reading a 262k-token vocabulary takes 0.5 s
    settings = sized(settings, prepared, facts)
    plan = plan_tuning(settings, prepared, config, facts) if config is not None else None
    if plan is None:
        built = _plain(settings, prepared)
    elif plan.mode == "pool":
        built = _pool(settings, prepared, plan)
    else:
        built = _router(settings, prepared, plan)
    return replace(built, infill=facts.fim)


def _client(settings: Settings, url: str, **kw: object) -> UpstreamClient:
    return UpstreamClient(
        url,
        read_timeout_s=settings.request_timeout_s,
        stall_timeout_s=settings.stall_timeout_s,
        **kw,  # type: ignore[arg-type]
    )


def _managed(settings: Settings, argv: list[str], client: UpstreamClient) -> ManagedServer:
    return ManagedServer(
        argv,
        client,
        log_path=settings.state_dir / "logs" / "llama-server.log",
        startup_timeout_s=settings.startup_timeout_s,
    )


def _external(settings: Settings) -> Topology:
    client = _client(settings, str(settings.upstream_url))
    served = f"llama-server at {settings.upstream_url}"
    return Topology("external", settings, client, ExternalMonitor(client), served)


def _plain(settings: Settings, prepared: Prepared) -> Topology:
    port = free_port(avoid={settings.port})  # the proxy binds its own port later
    alias = model_alias(settings, prepared.model)
    client = _client(settings, f"http://127.0.0.1:{port}", default_model=alias, routes_models=False)
    argv = server_argv(
        prepared.binary,
        settings,
        prepared.capabilities,
        model=prepared.model,
        draft=prepared.draft,
        port=port,
    )
    supervisor = _managed(settings, argv, client)
    return Topology(
        "plain", settings, client, supervisor, alias, capabilities=prepared.capabilities
    )


def _router(settings: Settings, prepared: Prepared, plan: TuningPlan) -> Topology:
    port = free_port(avoid={settings.port})
    alias = model_alias(settings, prepared.model)
    supervisor: ManagedServer

    def force_stop(preset: str) -> bool:  # the router's instance, killed beneath it
        return kill_instance(supervisor.pid, preset)

    url = f"http://127.0.0.1:{port}"
    client = _client(
        settings, url, routes_models=True, kept=BASELINE.name, force_stop=force_stop, direct=True
    )
    caps = prepared.capabilities
    assert plan.presets is not None  # a router plan writes its presets
    argv = router_argv(prepared.binary, settings, caps, plan.presets, plan.capacity, port)
    supervisor = _managed(settings, argv, client)
    return Topology(
        "router",
        settings,
        client,
        supervisor,
        alias,
        public_models=(alias,),
        capabilities=caps,
        plan=plan,
    )


def _pool(settings: Settings, prepared: Prepared, plan: TuningPlan) -> Topology:
    pool = Pool(
        plan.members,
        partial(instance_argv, prepared, settings),
        capacity=plan.capacity,
        log_dir=settings.state_dir / "logs" / "pool",
        startup_timeout_s=settings.startup_timeout_s,
        warm=BASELINE.name,
    )
    client = _client(settings, POOL_URL, transport=pool, routes_models=True, kept=BASELINE.name)
    alias = model_alias(settings, prepared.model)
    return Topology(
        "pool",
        settings,
        client,
        ExternalMonitor(client, interval_s=POOL_HEALTH_S),
        alias,
        services=(pool,),
        public_models=(alias,),
        capabilities=prepared.capabilities,
        plan=plan,
        tokenizer=AnyInstance(pool),
    )
