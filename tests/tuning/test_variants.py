"""Variants, their flags and presets, the tuning file, and the prior."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.errors import ConfigError
from tuner.model.envelope import cost_model
from tuner.model.speedup import CostModel, interpolated_curve
from tuner.tuning.config import Override, TuningConfig, load_tuning
from tuner.tuning.policy.prior import rank
from tuner.tuning.variants import (
    AUTOTUNE,
    BASELINE,
    PARAMS,
    Variant,
    autotune_space,
    fit_synthetic,
    grid,
    parse_name,
    presets_ini,
    request_fields,
)
from tuner.upstream.capabilities import Capabilities, parse_capabilities

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "upstream" / "data"


def caps_of(name: str) -> Capabilities:
    return parse_capabilities((DATA / f"help-{name}.txt").read_text())


def test_the_shipped_tuning_file_is_short_and_every_key_says_what_it_does() -> None:
    """One shipped copy; each key of it carries a one-line comment."""
    text = (ROOT / "policies" / "tuning.toml").read_text()
    assert len(text.splitlines()) <= 120
    keys = [line for line in text.splitlines() if "=" in line and not line.startswith("#")]
    bare = [k for k in keys if "#" not in k and not k.startswith("ngram-")]
    assert not bare, bare
    assert load_tuning(ROOT / "policies" / "tuning.toml") == load_tuning()
    # the package's copy is that file, not a second one to keep in step
    linked = ROOT / "tuner" / "data" / "tuning.toml"
    assert linked.is_symlink() and linked.resolve() == (ROOT / "policies" / "tuning.toml").resolve()


def test_a_key_the_tuning_file_does_not_know_is_refused_with_its_name(
    tmp_path: Path,
) -> None:
    """A misspelt key, or an option removed since (``docs/decisions.md`` says why), stops
    the load with the key's name rather than doing nothing."""
    file = tmp_path / "t.toml"
    for text, name in [
        ("[guard]\nmin_gian = 1.05\n", "min_gian"),
        ("[guard]\nrevisit = true\n", "revisit"),
        ("[guard]\nrace = true\n", "race"),
    ]:
        file.write_text(text)
        with pytest.raises(ConfigError, match=name):
            load_tuning(file)


def test_grid_renders_every_variant_for_the_current_build() -> None:
    caps = caps_of("0c1e570")
    variants = grid(load_tuning().search, caps)
    names = [v.name for v in variants]
    assert names[0] == "none" and len(names) == len(set(names)) > 10
    assert not any(v.needs_draft_model for v in variants)  # no draft model configured
    assert "ngram-simple.n3.m16" in names
    flags = parse_name("ngram-simple.n3.m16").flags(caps)
    assert flags == [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "3",
        "--spec-ngram-simple-size-m",
        "16",
    ]
    for variant in variants:  # every flag exists in this build
        rendered = variant.flags(caps)
        assert all(caps.has_flag(f) for f in rendered if f.startswith("--")), rendered
    draft = grid(load_tuning().search, caps, draft="draft-simple")
    assert any(v.spec_type == "draft-simple" for v in draft)


def test_older_build_gets_old_draft_flags_and_per_request_fields() -> None:
    caps = caps_of("old-2025")
    variant = Variant.of("draft-simple", {"n_max": 8, "p_min": 0.75})
    assert variant.name == "draft-simple.max8.p75"
    assert variant.flags(caps, Path("/d.gguf")) == [
        "-md",
        "/d.gguf",
        "--draft-max",
        "8",
        "--draft-p-min",
        "0.75",
    ]
    with pytest.raises(ValueError, match="no spec type"):
        Variant.of("ngram-simple").flags(caps)
    assert request_fields(variant) == {"speculative.n_max": 8, "speculative.p_min": 0.75}
    assert request_fields(Variant("none")) == {"speculative.n_max": 0}


def test_presets_file() -> None:
    caps = caps_of("0c1e570")
    text = presets_ini(
        [Variant("none"), parse_name("ngram-mod.match12.max16")],
        caps,
        shared=["-m", "/m.gguf", "--ctx-size", "4096", "--metrics"],
    )
    assert text.splitlines()[:6] == [
        "version = 1",
        "",
        "[*]",
        "model = /m.gguf",
        "ctx-size = 4096",
        "metrics = true",
    ]
    assert "[ngram-mod.match12.max16]\nspec-type = ngram-mod\nspec-ngram-mod-n-match = 12\n" in text
    assert "spec-ngram-mod-n-min = 12" in text  # 3/4 of n-max


def test_speculative_only_flags_stay_out_of_the_baseline_preset() -> None:
    text = presets_ini(
        [Variant("none"), parse_name("ngram-simple.n3.m16")],
        caps_of("0c1e570"),
        shared=["-m", "/m.gguf"],
        speculative=["--spec-synth-len", "3"],
    )
    none, ngram = text.split("[none]")[1].split("[ngram-simple.n3.m16]")
    assert "spec-synth-len" not in none
    assert "spec-synth-len = 3" in ngram


def test_forced_acceptance_rates_fit_each_variants_draft_length() -> None:
    """llama-server wants one synthetic rate per drafted position: each preset gets the
    profile cut or carried on to its own draft length."""
    text = presets_ini(
        [parse_name("draft-mtp.max1"), parse_name("draft-mtp.max3"), parse_name("ngram-mod")],
        caps_of("0c1e570"),
        shared=["-m", "/m.gguf"],
        speculative=["--spec-synth-rates", "0.5"],
    )
    rates = [line.split(" = ")[1] for line in text.splitlines() if "synth-rates" in line]
    assert rates[:2] == ["0.5", "0.5,0.25,0.125"]
    assert len(rates[2].split(",")) == 64  # ngram-mod's default n-max


@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=6), st.integers(1, 80))
def test_fitted_rates_have_the_draft_length_and_never_rise(rates_in: list[float], n: int) -> None:
    ordered = sorted(rates_in, reverse=True)
    flags = fit_synthetic(["--spec-synth-rates", ",".join(map(str, ordered))], n)
    rates = [float(r) for r in flags[1].split(",")]
    assert len(rates) == n
    assert all(b <= a * (1 + 1e-5) for a, b in itertools.pairwise(rates))


@given(
    st.sampled_from(sorted(t for t in PARAMS if t != "none")).flatmap(
        lambda t: st.fixed_dictionaries(
            {},
            optional={
                p: st.integers(1, 64) if p != "p_min" else st.sampled_from([0.0, 0.5, 0.95])
                for p in PARAMS[t]
            },
        ).map(lambda params: Variant.of(t, params))
    )
)
def test_names_round_trip(variant: Variant) -> None:
    assert parse_name(variant.name) == variant


def test_overrides_follow_the_fallback_chain() -> None:
    config = TuningConfig(
        overrides={
            "code": Override(pin="ngram-simple.n3.m16", forbid=("ngram-mod",)),
            "all": Override(forbid=("ngram-cache",)),
            "text/fresh": Override(off=True),
        }
    )
    code = config.override_for("code/echo/greedy")
    assert code.pin == "ngram-simple.n3.m16" and set(code.forbid) == {"ngram-mod", "ngram-cache"}
    assert config.override_for("text/fresh/sampled").off
    assert not config.override_for("text/echo/sampled").off


def test_bad_tuning_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "t.toml"
    bad.write_text("[budget]\nexplore_share = 2\n")
    with pytest.raises(ConfigError, match="explore_share"):
        load_tuning(bad)
    bad.write_text("[budget\n")
    with pytest.raises(ConfigError, match="invalid"):
        load_tuning(bad)
    bad.write_text('[overrides.code]\npin = "ngram-simple.q3"\n')
    with pytest.raises(ConfigError, match="not a variant name"):
        load_tuning(bad)
    bad.write_text('[overrides.code]\nforbid = ["ngram-fast"]\n')
    with pytest.raises(ConfigError, match="unknown spec type"):
        load_tuning(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_tuning(tmp_path / "missing.toml")


def test_prior_ranks_and_kills() -> None:
    caps = caps_of("0c1e570")
    variants = grid(load_tuning().search, caps)
    prior = load_tuning().prior
    dense = cost_model()
    echo = rank("code/echo/greedy", variants, prior, dense)
    assert echo.pays and echo.ranked[0][1] >= echo.ranked[-1][1]
    moe = cost_model(experts=256, active=8, expert_fraction=0.7)
    killed = rank("chat/fresh/sampled", variants, prior, moe)
    assert not killed.pays and "MoE" in killed.reason
    assert all(s < 1 for _, s in killed.ranked)


def test_prior_ranks_ngram_copies_by_what_they_copy() -> None:
    """N-gram variants go by the copy model: on a dense target, longer copies first (a
    draft is only made on a match and accepted as a run); ngram-cache (guessed to accept
    half as much) last."""
    variants = grid(load_tuning().search, caps_of("0c1e570"))
    verify = interpolated_curve([(1, 1.06), (8, 2.45), (16, 3.69), (32, 6.40), (64, 11.9)])
    ranked = rank("code/echo/greedy", variants, load_tuning().prior, CostModel(verify=verify))
    lengths = [v.draft_length for v, _ in ranked.ranked if v.spec_type == "ngram-simple"]
    assert lengths == sorted(lengths, reverse=True)
    assert ranked.ranked[-1][0].spec_type == "ngram-cache"
    assert ranked.pays


def test_ik_llama_cpp_takes_its_own_flags_and_the_draft_settings_per_request() -> None:
    """One n-gram size flag for every n-gram type (ngram-mod's match length too); the draft
    length goes with each request where the engine honours it, else on the command line.
    An n-gram type's copied run is cut by n_max there (default 16), so it is sent too."""
    caps = caps_of("ik-55d3c05")
    simple = parse_name("ngram-simple.n3.m48")
    assert simple.flags(caps, per_request=True) == [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-size-n",
        "3",
        "--spec-ngram-size-m",
        "48",
    ]
    assert request_fields(simple) == {"speculative.n_max": 48}
    mod = parse_name("ngram-mod.match24.max16")
    assert mod.flags(caps, per_request=True) == [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-size-n",
        "24",
    ]
    assert request_fields(mod) == {"speculative.n_max": 16, "speculative.n_min": 12}
    assert mod.flags(caps)[-4:] == ["--draft-max", "16", "--draft-min", "12"]
    draft = parse_name("draft-simple.max8.p75")
    assert draft.flags(caps, Path("d.gguf"), per_request=True) == ["-md", "d.gguf"]
    assert draft.flags(caps, Path("d.gguf")) == [
        *["--draft-max", "8", "--draft-p-min", "0.75", "-md", "d.gguf"]
    ]
    for variant in grid(load_tuning().search, caps):  # every flag exists in this build
        rendered = variant.flags(caps)
        assert all(caps.has_flag(f) for f in rendered if f.startswith("--")), rendered


def test_ik_llama_cpp_autotune_is_one_more_setting_of_the_types_it_tunes() -> None:
    """On a build with ``--spec-autotune`` each n-gram type it tunes gets ``autotune`` in
    its search space: a variant that launches its own instance with the flag, sends no
    draft settings (the engine overwrites them every step) and keeps only the settings
    that are launch flags. Mainline builds never see it."""
    ik, mainline = caps_of("ik-55d3c05"), caps_of("0c1e570")
    space = load_tuning().search
    assert autotune_space(space, ik)["ngram-mod"]["autotune"] == [0, 1]
    assert autotune_space(space, mainline) == {k: dict(v) for k, v in space.items()}
    mod = Variant.of("ngram-mod", {"n_match": 12, "n_max": 64, "autotune": 1})
    assert mod.name == "ngram-mod.match12.auto1" and parse_name(mod.name) == mod
    assert mod.autotuned and mod.draft_length == 16 and request_fields(mod) == {}
    assert mod.flags(ik, per_request=True) == mod.flags(ik)
    assert mod.flags(ik) == ["--spec-type", "ngram-mod", "--spec-ngram-size-n", "12", AUTOTUNE]
    assert Variant.of("ngram-mod", {"n_match": 12, "autotune": 0}).name == "ngram-mod.match12"
    with pytest.raises(ValueError, match="autotune"):
        mod.flags(mainline)
    names = {v.name for v in grid(space, ik)}
    assert {"ngram-mod.match12.auto1", "ngram-mod.match24.auto1"} <= names
    assert "ngram-simple.n3.m16.auto1" in names and "ngram-map-k.n4.m16.auto1" not in names
    assert not any(v.autotuned for v in grid(space, mainline))
    asked = {"ngram-mod": {"n_match": [12], "autotune": [0, 1]}}  # a tuning file that asks
    assert [v.name for v in grid(asked, mainline)] == ["none", "ngram-mod.match12"]


def test_a_current_ik_llama_cpp_gets_one_stage_per_variant() -> None:
    """8337e4c refuses ``--spec-ngram-size-n`` and ``--draft-max``: each variant is one
    ``--spec-type TYPE:key=value,...``; the draft settings still go with each request."""
    caps = caps_of("ik-8337e4c")
    mod = parse_name("ngram-mod.match24.max16")
    assert mod.flags(caps, per_request=True) == ["--spec-type", "ngram-mod:ngram_size_n=24"]
    assert mod.flags(caps) == ["--spec-type", "ngram-mod:ngram_size_n=24,n_max=16,n_min=12"]
    draft = parse_name("draft-simple.max8.p75")
    assert draft.flags(caps, Path("d.gguf")) == [
        *["--spec-type", "draft:n_max=8,p_min=0.75", "-md", "d.gguf"]
    ]
    auto = Variant.of("ngram-mod", {"n_match": 12, "autotune": 1})
    assert auto.flags(caps) == ["--spec-type", "ngram-mod:ngram_size_n=12", AUTOTUNE]
    assert BASELINE.flags(caps) == ["--spec-type", "none"]
    for variant in grid(load_tuning().search, caps):  # every flag exists in this build
        rendered = variant.flags(caps)
        assert all(caps.has_flag(f) for f in rendered if f.startswith("--")), rendered


def test_suffix_drafting_is_searched_where_the_stage_dialect_has_it() -> None:
    """ik_llama.cpp's ``suffix`` type (8337e4c): the shipped space's suffix variants launch
    as one stage with the tree's settings, their n_max goes with each request (its only
    per-request fields besides n_min and p_min); 55d3c05 and mainline leave it out."""
    space = load_tuning().search
    head = [v for v in grid(space, caps_of("ik-8337e4c")) if v.spec_type == "suffix"]
    assert [v.name for v in head] == [
        "suffix.len3.max16",
        "suffix.len3.max48",
        "suffix.len5.max16",
        "suffix.len5.max48",
    ]
    short = parse_name("suffix.len3.max16")
    assert short.copies and short.draft_length == 16
    assert short.flags(caps_of("ik-8337e4c"), per_request=True) == [
        *["--spec-type", "suffix:suffix_min_match_len=3"]
    ]
    assert request_fields(short) == {"speculative.n_max": 16}
    for other in ("ik-55d3c05", "0c1e570"):
        assert not any(v.spec_type == "suffix" for v in grid(space, caps_of(other)))


def test_ik_llama_cpp_mtp_is_searched_on_a_target_with_next_n_layers() -> None:
    """8337e4c's ``mtp`` stage is spec-tuner's ``draft-mtp``: searched where the target has
    MTP layers (not on Gemma), absent from 55d3c05, which has no such type."""
    space, head = load_tuning().search, caps_of("ik-8337e4c")
    found = [v for v in grid(space, head, mtp_layers=1) if v.spec_type == "draft-mtp"]
    assert [v.flags(head) for v in found] == [
        ["--spec-type", f"mtp:n_max={n}"] for n in space["draft-mtp"]["n_max"]
    ]
    assert not any(v.spec_type == "draft-mtp" for v in grid(space, head))
    old = grid(space, caps_of("ik-55d3c05"), mtp_layers=1)
    assert not any(v.spec_type == "draft-mtp" for v in old)
