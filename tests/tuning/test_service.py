"""TuningService persistence when the state dir refuses writes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.tuning.sim import CODE, HELP, SimUpstream, config, drive, make, schedule, truth
from tuner.tuning.service import TuningService
from tuner.tuning.state import POLICY_FILE, read_document
from tuner.upstream.capabilities import parse_capabilities


def test_an_unwritable_policy_file_is_counted_and_retried(tmp_path: Path) -> None:
    engine = make(tmp_path, config(explore_share=0.5), parse_capabilities(HELP.read_text()))
    service = TuningService(engine, tmp_path, {"model_key": "m"})
    drive(engine, SimUpstream(truth(list(engine.variants.values()))), schedule(200))
    (tmp_path / POLICY_FILE).mkdir()  # the rename over it fails, as on a full or broken disk
    assert service.save() is False and service.save_errors == 1
    (tmp_path / POLICY_FILE).rmdir()
    assert service.save() is True
    document = read_document(tmp_path / POLICY_FILE)
    assert document is not None and CODE in document["classes"]
    asyncio.run(service.stop())
