from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings

from tests.fake_llama import FakeLlamaServer
from tuner.proxy.app import create_app
from tuner.records import RecordStore
from tuner.upstream.client import UpstreamClient

# The suite shares two cores with llama-server: judge examples, not wall-clock speed.
settings.register_profile(
    "shared-cpu", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=100
)
settings.load_profile("shared-cpu")


@pytest.fixture
def fake() -> FakeLlamaServer:
    return FakeLlamaServer()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RecordStore]:
    records = RecordStore(tmp_path / "records", linger_s=0)
    await records.start()
    yield records
    await records.stop()


@pytest.fixture
async def upstream(fake: FakeLlamaServer) -> AsyncIterator[UpstreamClient]:
    client = UpstreamClient("http://fake", transport=fake.transport(), default_model="fake-model")
    client.mark_ready(True)
    yield client
    await client.aclose()


@pytest.fixture
async def proxy(upstream: UpstreamClient, store: RecordStore) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the proxy app, which talks to the fake llama-server."""
    app = create_app(upstream, store, max_body_bytes=64 * 1024)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        yield client
