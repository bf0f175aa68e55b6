"""The search space follows the model: ``draft-mtp`` only where the target has MTP layers,
draft types only with a draft, and ``tuner variants`` says why a type is absent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import require
from tests.model.synthetic_gguf import write_gguf
from tests.tuning.test_variants import caps_of
from tuner.cli.space import KINDS, as_json, as_table, space_view
from tuner.daemon.plan import default_cost, draft_kind, search_variants
from tuner.model.gguf_facts import read_facts
from tuner.tuning.config import load_tuning


def _mtp_target(path: Path, layers: int) -> Path:
    return write_gguf(path, "qwen35moe", kv={"qwen35moe.nextn_predict_layers": layers})


def test_draft_mtp_is_searched_only_on_a_target_with_mtp_layers(tmp_path: Path) -> None:
    caps, config = caps_of("0c1e570"), load_tuning()
    with_heads = read_facts(_mtp_target(tmp_path / "mtp.gguf", 1))
    without = read_facts(write_gguf(tmp_path / "plain.gguf", "qwen35moe"))
    searched = search_variants(config, caps, None, with_heads.nextn_layers)
    assert [v.name for v in searched if v.spec_type == "draft-mtp"] == [
        "draft-mtp.max1",
        "draft-mtp.max2",
        "draft-mtp.max3",
    ]
    assert searched[0].name == "none"
    plain = search_variants(config, caps, None, without.nextn_layers)
    assert not any(v.spec_type == "draft-mtp" for v in plain)
    flags = next(v for v in searched if v.name == "draft-mtp.max2").flags(caps)
    assert flags == ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]


def test_the_view_predicts_every_kind_of_class_and_says_why_types_are_absent(
    tmp_path: Path,
) -> None:
    caps, config = caps_of("0c1e570"), load_tuning()
    facts = read_facts(write_gguf(tmp_path / "plain.gguf", "llama"))
    variants = search_variants(config, caps, None, facts.nextn_layers)
    view = space_view(config, caps, variants, facts, None, default_cost(facts, None, None))
    assert len(view.variants) == len(variants) - 1  # none is the baseline, not a row
    for _, predicted in view.variants:
        assert set(predicted) == set(KINDS) and all(s > 0 for s in predicted.values())
        # the prior guesses more acceptance on echo than on fresh text
        assert predicted["echo greedy"] >= predicted["fresh greedy"]
    assert view.absent["draft-mtp"] == "the target has no MTP (next-n) layers"
    assert "TUNER_DRAFT_MODEL" in view.absent["draft-simple"]
    assert "TUNER_DRAFT_MODEL" in view.absent["draft-eagle3"]
    document = json.loads(as_json(view))
    assert [v["name"] for v in document["variants"]] == [v.name for v, _ in view.variants]
    table = as_table(view)
    assert "ngram-simple.n3.m16" in table and "draft-mtp: the target has no MTP" in table


@pytest.mark.llama
def test_tuner_variants_lists_mtp_variants_for_a_target_with_heads(tmp_path: Path) -> None:
    """On the installed llama-server, as a user runs it."""
    require("draft-mtp")
    target = _mtp_target(tmp_path / "mtp.gguf", 1)
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "variants", "--model", str(target), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    document = json.loads(done.stdout)
    assert document["mtp_layers"] == 1
    assert "draft-mtp.max1" in [v["name"] for v in document["variants"]]
    assert "draft-mtp" not in document["absent"]


def test_a_draft_is_searched_as_the_kind_its_gguf_says(tmp_path: Path) -> None:
    """An EAGLE3 head (GGUF architecture ``eagle3``) is searched as draft-eagle3 and nothing
    else; a plain model as draft-simple."""
    caps, config = caps_of("0c1e570"), load_tuning()
    target = read_facts(write_gguf(tmp_path / "t.gguf", "llama"))
    eagle = read_facts(write_gguf(tmp_path / "eagle.gguf", "eagle3"))
    names = [v.name for v in search_variants(config, caps, draft_kind(eagle), 0)]
    assert "draft-eagle3.max3" in names and not any("draft-simple" in n for n in names)
    view = space_view(config, caps, [], target, eagle, default_cost(target, None, None))
    assert view.absent["draft-simple"] == "the configured draft is a draft-eagle3 model"
    plain = search_variants(config, caps, draft_kind(target), 0)
    assert any(v.spec_type == "draft-simple" for v in plain)
    assert not any(v.spec_type in ("draft-eagle3", "draft-dflash") for v in plain)


@pytest.mark.llama
def test_tuner_variants_searches_an_eagle3_draft_as_draft_eagle3(tmp_path: Path) -> None:
    """The vocabulary rule, which stops the daemon for a mismatched plain draft, is not
    applied to an EAGLE3 head; the space holds its variants."""
    require("draft-eagle3")
    eagle = write_gguf(tmp_path / "eagle.gguf", "eagle3")
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "variants", "--draft", str(eagle), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    names = [v["name"] for v in json.loads(done.stdout)["variants"]]
    assert "draft-eagle3.max6" in names and not any(n.startswith("draft-simple") for n in names)


def test_a_pin_the_build_cannot_run_is_left_out_not_a_crash() -> None:
    """ik_llama.cpp 55d3c05 drafts with no EAGLE3 head: a pin of one (with such a draft)
    used to stop the daemon at start; it is logged and left out, a runnable pin still runs."""
    ik = caps_of("ik-55d3c05")
    config = load_tuning().model_copy(
        update={
            "overrides": {
                "all": load_tuning()
                .override_for("all")
                .model_copy(update={"pin": "draft-eagle3.max3"})
            }
        }
    )
    names = [v.name for v in search_variants(config, ik, "draft-eagle3", 0)]
    assert "draft-eagle3.max3" not in names and "none" in names
    mainline = caps_of("0c1e570")
    assert "draft-eagle3.max3" in [
        v.name for v in search_variants(config, mainline, "draft-eagle3", 0)
    ]
