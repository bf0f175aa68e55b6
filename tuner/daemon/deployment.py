"""What serves on a topology, and replacing it while the daemon serves.

A ``Deployment`` is a ``Topology`` with what runs on it: the tuner, the replayer, the
variant gate, their collectors, and the ``Backend`` the proxy sends requests to. The
daemon holds one (``Serving``) and replaces it without a failed request (``replace``):
the new one is built and started beside the old, the next request goes to the new one
once it answers, the requests on the old one end there, and then the old one stops.
Both are loaded for the time of the switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from tuner.daemon.topology import Topology
from tuner.errors import TunerError
from tuner.logs import get_logger
from tuner.proxy.app import Lifecycle
from tuner.proxy.backend import Backend, BackendSlot
from tuner.proxy.gate import VariantGate
from tuner.records import RecordStore, RequestRecord
from tuner.tuning.replay.worker import Replayer
from tuner.tuning.runtime.collectors import ReplayCollector, TuningCollector
from tuner.tuning.runtime.service import TuningService
from tuner.tuning.runtime.single import one_at_a_time
from tuner.tuning.variants import BASELINE

__all__ = ["Deployment", "Serving", "deploy"]

log = get_logger(__name__)

WARM_BODY = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}


@dataclass(frozen=True, slots=True)
class Deployment:
    """A topology and what serves on it; ``services`` in the order they start."""

    topology: Topology
    backend: Backend
    services: Sequence[Lifecycle]
    collectors: Sequence[Collector]
    tuning: TuningService | None

    @property
    def engine(self) -> str | None:
        return self.backend.engine


def deploy(topology: Topology) -> Deployment:
    """The tuner, replayer and gate a topology's plan asks for, wired to its client."""
    settings, client, plan = topology.settings, topology.client, topology.plan
    caps = topology.capabilities
    engine = caps.engine if caps else None
    tuning: TuningService | None = None
    replayer: Replayer | None = None
    gate: VariantGate | None = None
    collectors: list[Collector] = []
    if plan is not None:
        exclusive = settings.exclusive_variants
        if exclusive == "on" or (exclusive == "auto" and not plan.gpu):
            gate = VariantGate()
        tuning = TuningService(
            plan.build_engine,
            settings.state_dir,
            plan.meta,
            strategy=one_at_a_time(plan.reload_guess_s) if plan.single else lambda e: e,
            unavailable=client.health.is_recovering,
            instances={m.name: repr(m.flags) for m in plan.members},
            # joining the variant decoding starts a request at once only where its instance
            # batches it with the others; on one slot it would queue there instead
            busy=gate.busy if gate is not None and caps is not None and caps.batches else None,
            fleet=plan.fleet,
        )
        collectors.append(TuningCollector(tuning.engine, tuning.quarantine))
        if tuning.tuner.per_class:  # one variant at a time: no replays
            replayer = Replayer(
                tuning.engine,
                client.base_url,
                cuts_last_round=bool(caps and caps.cuts_last_round),
                transport=topology.tokenizer,
            )
            collectors.append(ReplayCollector(replayer))
        if plan.fleet is not None:
            from tuner.fleet.collector import FleetCollector  # psycopg: only for a fleet

            collectors.append(FleetCollector(plan.fleet))
    # the supervisor after the pool, where there is one: it polls the pool
    services: list[Lifecycle] = [*topology.services, topology.supervisor]
    services += ([tuning] if tuning else []) + ([replayer] if replayer else [])
    backend = Backend(
        client,
        router=tuning.route if tuning else None,
        fallback=tuning.fallback if tuning else None,
        gate=gate,
        keep=replayer.submit if replayer else None,
        public_models=topology.public_models,
        engine=engine,
        infill=topology.infill,
    )
    return Deployment(topology, backend, services, collectors, tuning)


class Serving(Collector):
    """The deployment serving now: started and stopped with the app, replaced by
    ``replace``; the learner's consumer of the records (``observe``) and the collector of
    its metrics."""

    def __init__(
        self,
        first: Deployment,
        *,
        startup_timeout_s: float,
        drain_timeout_s: float,
    ) -> None:
        self.slot = BackendSlot(first.backend)
        self.current = first
        self.startup_timeout_s = startup_timeout_s
        self.drain_timeout_s = drain_timeout_s
        # newest first: the ones a record may belong to (two while one replaces the other)
        self._live: tuple[Deployment, ...] = (first,)
        self._replacing: asyncio.Task[bool] | None = None

    # -- the app's service ------------------------------------------------------------

    async def start(self) -> None:
        for service in self.current.services:
            await service.start()

    async def stop(self) -> None:
        if self._replacing is not None and not self._replacing.done():
            self._replacing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replacing
        for deployment in self._live:
            await _stop(deployment)

    # -- what reads the deployment ----------------------------------------------------

    def observe(self, record: RequestRecord) -> None:
        """A finished request, to the learner of the engine that served it (the newest
        where two of one engine are live: it started from the other's state)."""
        for deployment in self._live:
            if deployment.tuning is not None and deployment.engine == record.engine:
                deployment.tuning.observe(record)
                return

    def collect(self) -> Iterator[Metric]:
        for collector in self.current.collectors:
            yield from collector.collect()

    @property
    def replacing(self) -> bool:
        return self._replacing is not None and not self._replacing.done()

    # -- replacing it -----------------------------------------------------------------

    def request(self, build: Callable[[], Topology], records: RecordStore) -> bool:
        """Replace the deployment in the background with one on ``build``'s topology
        (built off the event loop: it may provision an engine); False while another
        replacement runs. ``records``: the store whose records reach the learners."""
        if self.replacing:
            log.warning("topology_replace_refused", reason="a replacement is under way")
            return False
        self._replacing = asyncio.get_running_loop().create_task(
            self.replace(build, records), name="topology-replace"
        )
        return True

    async def replace(self, build: Callable[[], Topology], records: RecordStore) -> bool:
        """Build, start and warm a new deployment; serve on it; drain and stop the old.
        On any failure before the switch the old one keeps serving (logged)."""
        old = self.current
        try:
            topology = await asyncio.to_thread(build)
        except TunerError as exc:
            log.error("topology_replace_failed", error=str(exc), detail="serving on as before")
            return False
        new = deploy(topology)
        shared = _same_file(old, new)
        if shared and old.tuning is not None:  # the new learner starts where the old one is
            await old.tuning.hand_over()
        self._live = (new, old)
        try:
            await self._bring_up(new)
        except (TunerError, OSError) as exc:
            log.error("topology_replace_failed", error=str(exc), detail="serving on as before")
            self._live = (old,)
            await _stop(new)
            return False
        self.slot.swap(new.backend)
        self.current = new
        log.info("topology_replaced", served=topology.served, kind=topology.kind)
        drained = await old.backend.drained(self.drain_timeout_s)
        await records.flush()  # the old one's last records reach its learner
        self._live = (new,)
        await _stop(old)
        log.info("topology_retired", kind=old.topology.kind, drained=drained)
        return True

    async def _bring_up(self, new: Deployment) -> None:
        """Start the new deployment's services and wait until it answers a generation."""
        for service in new.services:
            await service.start()
        await new.topology.supervisor.wait_ready(self.startup_timeout_s)
        body = dict(WARM_BODY)
        if new.topology.plan is not None:
            body["model"] = BASELINE.name  # the variant fresh classes open on
        response = await new.backend.upstream.open(
            "POST", "/v1/completions", content=json.dumps(body).encode()
        )
        await response.aread()
        await response.aclose()
        if response.status_code != 200:
            raise TunerError(f"the new topology answered {response.status_code} to a warm-up")


def _same_file(old: Deployment, new: Deployment) -> bool:
    return old.tuning is not None and new.tuning is not None and old.tuning.path == new.tuning.path


async def _stop(deployment: Deployment) -> None:
    """Stop a deployment's services in reverse, then close its client."""
    for service in reversed(deployment.services):
        await service.stop()
    await deployment.backend.upstream.aclose()
