from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import structlog
from hypothesis import HealthCheck, settings

from tests.fake_llama import FakeLlamaServer
from tests.pg_server import PgServer, pg_bin
from tests.tuning.sim import HELP
from tuner.consumers import Consumer
from tuner.metrics import Metrics, RequestMetrics
from tuner.proxy.app import create_app
from tuner.proxy.backend import Backend
from tuner.records import RecordStore
from tuner.upstream.capabilities import Capabilities, parse_capabilities
from tuner.upstream.client import UpstreamClient

# The suite shares two cores with llama-server: judge examples, not wall-clock speed.
settings.register_profile(
    "shared-cpu", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=100
)
settings.load_profile("shared-cpu")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """A test that runs the command line configures logging for the whole process (level
    warning): put it back, so tests that read info lines do not depend on the order."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def caps() -> Capabilities:
    """The pinned build's capabilities, from its recorded ``--help``."""
    return parse_capabilities(HELP.read_text())


@pytest.fixture
def fake() -> FakeLlamaServer:
    return FakeLlamaServer()


@pytest.fixture
def request_metrics() -> RequestMetrics:
    return RequestMetrics()


@pytest.fixture
async def store(tmp_path: Path, request_metrics: RequestMetrics) -> AsyncIterator[RecordStore]:
    """A record store whose records feed ``request_metrics``, as the daemon's do."""
    consumers = [Consumer("metrics", request_metrics.observe)]
    records = RecordStore(tmp_path / "records", linger_s=0, consumers=consumers)
    await records.start()
    yield records
    await records.stop()


@pytest.fixture
async def upstream(fake: FakeLlamaServer) -> AsyncIterator[UpstreamClient]:
    client = UpstreamClient("http://fake", transport=fake.transport(), default_model="fake-model")
    client.health.answering(True)
    yield client
    await client.aclose()


@pytest.fixture
async def proxy(
    upstream: UpstreamClient, store: RecordStore, request_metrics: RequestMetrics
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the proxy app, which talks to the fake llama-server."""
    metrics = Metrics(request_metrics, lambda: upstream, store)
    app = create_app(Backend(upstream), store, max_body_bytes=64 * 1024, metrics=metrics)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        yield client


# A real PostgreSQL server per test module (``tests.pg_server``). Where PostgreSQL is not
# installed the tests that use it are skipped, unless SPEC_TUNER_TEST_POSTGRES=1 (``.ci/run``
# sets it, after installing it): there they fail.
@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    if pg_bin("initdb") is None and os.environ.get("SPEC_TUNER_TEST_POSTGRES") != "1":
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    # not under pytest's temporary dirs: the server's user could not reach into them
    root = Path(tempfile.mkdtemp(prefix="spec-tuner-pg-"))
    server = PgServer(root)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg: PgServer) -> Iterator[str]:
    """The server's URL, with the tables emptied after the test."""
    if pg.proc is None:
        pg.start()
    yield pg.url
    if pg.proc is None:
        pg.start()
    with psycopg.connect(pg.url, autocommit=True) as conn:  # ours and Optuna's tables
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
