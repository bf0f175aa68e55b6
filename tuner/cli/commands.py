"""The ``tuner`` commands: each takes the parsed arguments and returns an exit code.

2 means the user must fix something (``tuner.cli.main`` prints a ``TunerError``'s message).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from tuner import __version__
from tuner.errors import ConfigError
from tuner.extras import require
from tuner.logs import configure_logging
from tuner.settings import Settings, load_settings

STATE_DIR_HELP = "what the daemon learned (TUNER_STATE_DIR; default ~/.local/state/spec-tuner)"


def settings_from_args(args: argparse.Namespace) -> Settings:
    config = args.config or os.environ.get("TUNER_CONFIG")
    overrides = {
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "model": getattr(args, "model", None),
        "draft_model": getattr(args, "draft", None),
        "llama_server": getattr(args, "llama_server", None),
        "engine": getattr(args, "engine", None),
        "upstream_url": getattr(args, "upstream_url", None),
        "state_dir": getattr(args, "state_dir", None),
    }
    return load_settings(Path(config) if config else None, **overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    from tuner.daemon.serve import serve

    settings = settings_from_args(args)
    configure_logging(settings.log_format, settings.log_level)
    return serve(settings, reload_settings=lambda: settings_from_args(args))


def cmd_provision(args: argparse.Namespace) -> int:
    """Locate or build llama-server and the default model; print what was found."""
    from tuner.upstream.launch import prepare

    prepared = prepare(settings_from_args(args))
    caps, model, draft = prepared.capabilities, prepared.model, prepared.draft
    info = {
        "engine": caps.engine,
        "llama_server": str(prepared.binary),
        "build": caps.build,
        "commit": caps.commit,
        "spec_types": sorted(caps.spec_types),
        "new_spec_flags": caps.new_spec_flags,
        "old_draft_flags": caps.old_draft_flags,
        "router": caps.router,
        "autotune": caps.autotune,
        "model": str(model),
        "draft_model": str(draft) if draft else None,
    }
    print(json.dumps(info, indent=2))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """Leviathan's equation, one keystroke away (with MoE and recurrent-state terms)."""
    from tuner.model.describe import gamma_table
    from tuner.model.envelope import cost_model
    from tuner.model.speedup import speedup
    from tuner.profiles import load_target

    inputs = {
        "draft_step": args.c,
        "experts": args.experts,
        "active": args.active,
        "expert_fraction": args.expert_fraction,
        "state_ratio": args.state_ratio,
    }
    if args.target:
        facts = load_target(args.target, _profile_dirs(settings_from_args(args)))
        inputs |= {
            "experts": facts.experts,
            "active": facts.experts_used,
            "expert_fraction": facts.expert_fraction,
            "state_ratio": facts.state_ratio,
        }
    cost = cost_model(**inputs)
    if args.gamma is not None:
        print(f"{speedup(args.alpha, args.gamma, cost):.2f}")
    else:
        print(gamma_table(args.alpha, cost, args.gamma_max))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """GGUF facts, draft compatibility, and the predicted speedup envelope."""
    from tuner.model.describe import envelope_text, facts_dict, facts_text
    from tuner.model.envelope import cost_model_from_facts, envelope
    from tuner.model.gguf_facts import draft_compatibility, read_facts
    from tuner.profiles import fingerprint_key, hardware_fingerprint, load_profile, model_key
    from tuner.upstream.launch import resolve_model

    settings = settings_from_args(args)
    target_path, draft_path = resolve_model(settings)
    target = read_facts(target_path)
    draft = read_facts(draft_path) if draft_path else None
    profile = load_profile(
        _profile_dirs(settings),
        model_key(target_path),
        fingerprint_key(hardware_fingerprint()),
    )
    cost = cost_model_from_facts(target, draft)
    if profile is not None:
        cost = replace(cost, verify=profile.verify)
    env = envelope(cost)
    compat = draft_compatibility(target, draft) if draft else None
    if args.format == "json":
        out: dict[str, object] = {"target": facts_dict(target)}
        if draft and compat:
            out["draft"] = facts_dict(draft)
            out["draft_compatible"] = compat.compatible
            out["draft_problems"] = list(compat.problems)
        out["envelope"] = {
            "alphas": env.alphas,
            "gammas": env.gammas,
            "speedup": [[round(v, 4) for v in row] for row in env.table],
            "break_even_alpha": env.break_even,
        }
        print(json.dumps(out, indent=2))
        return 0
    print(facts_text(target))
    if draft and compat:
        print("\ndraft:\n" + facts_text(draft))
        print("\n" + compat.explain())
    drafting = "draft model" if draft else "n-gram drafting (draft cost ~0)"
    basis = (
        "verify cost calibrated on this machine"
        if profile
        else "memory-bound estimate; `tuner calibrate` measures it"
    )
    print(f"\npredicted speedup, {drafting}, {basis}:")
    print(envelope_text(env))
    return 0 if compat is None or compat.compatible else 1


def _profile_dirs(settings: Settings) -> list[Path]:
    from tuner.profiles import profile_dirs

    return profile_dirs(settings.state_dir)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure decode and verify costs on this machine and check them per variant."""
    import asyncio

    from tuner.calibrate import DEFAULT_VARIANTS, calibrate
    from tuner.model.describe import profile_text
    from tuner.profiles import save_profile
    from tuner.upstream.launch import prepare
    from tuner.workload import DEFAULT_WORKLOAD, load_workload

    settings = settings_from_args(args)
    prepared = prepare(settings)
    caps = prepared.capabilities
    items = load_workload(Path(args.workload) if args.workload else DEFAULT_WORKLOAD)
    if args.prompts:
        items = items[: args.prompts]
    wanted = args.variants.split(",") if args.variants else list(DEFAULT_VARIANTS)
    unknown = [v for v in wanted if v not in DEFAULT_VARIANTS]
    if unknown:
        raise ConfigError(f"unknown variants {unknown}; choose from {list(DEFAULT_VARIANTS)}")
    variants = {v: DEFAULT_VARIANTS[v] for v in wanted if caps.supports_spec_type(v)}
    profile = asyncio.run(
        calibrate(
            binary=prepared.binary,
            settings=settings,
            caps=caps,
            model=prepared.model,
            draft=prepared.draft,
            items=items,
            variants=variants,
            max_tokens=args.max_tokens,
            progress=lambda message: print(f"[calibrate] {message}", file=sys.stderr),
        )
    )
    path = save_profile(settings.state_dir / "profiles", profile)
    if args.format == "json":
        print(profile.model_dump_json(indent=2))
    else:
        print(profile_text(profile))
        print(f"\nsaved {path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Replay a workload against no speculation, a static-variant matrix and the tuner."""
    import asyncio

    from tuner.bench.daemons import DEFAULT_MATRIX, BenchOptions
    from tuner.bench.peers import peer_options
    from tuner.bench.render import markdown
    from tuner.bench.run import finish, run_bench
    from tuner.workload import load_workload

    if args.analyse:
        print(markdown(finish(Path(args.analyse))))
        return 0
    if args.sessions:
        return _bench_sessions(args)
    if not args.workload:
        raise ConfigError("bench needs --workload FILE.jsonl (or --sessions FILE, --analyse DIR)")
    settings = settings_from_args(args)
    items = load_workload(Path(args.workload))
    if args.prompts:
        items = items[: args.prompts]
    challenger = Path(args.challenger).resolve() if args.challenger else None
    if args.challenger_env and challenger is None:
        raise ConfigError("--challenger-env TUNER_KEY=VALUE needs --challenger")
    code = Path(args.challenger_code).resolve() if args.challenger_code else None
    if code is not None and challenger is None:
        raise ConfigError("--challenger-code DIR needs --challenger")
    if code is not None and not (code / "tuner" / "__main__.py").is_file():
        raise ConfigError(f"--challenger-code: {code} holds no tuner package (tuner/__main__.py)")
    if challenger is not None:
        from tuner.tuning.config import load_tuning

        load_tuning(challenger)  # refused here, with its message, not after the matrix started
    peer, peer_arms = peer_options(args.peer, args.peer_arm)
    options = BenchOptions(
        out=Path(args.out),
        requests=args.requests,
        repeats=args.repeats,
        baseline_repeats=args.baseline_repeats,
        seed=args.seed,
        matrix=tuple(args.matrix.split(",")) if args.matrix else DEFAULT_MATRIX,
        max_tokens=args.max_tokens,
        challenger=challenger,
        challenger_env=tuple(args.challenger_env),
        challenger_code=code,
        peer=peer,
        peer_arms=peer_arms,
    )
    try:
        summary = asyncio.run(run_bench(settings, items, options, _bench_progress))
    except asyncio.CancelledError:  # SIGTERM: what it started is stopped
        print(f"[bench] stopped; the rows so far: {options.out}/requests.jsonl", file=sys.stderr)
        return 128 + 15
    print((options.out / "summary.md").read_text())
    print(f"wrote {options.out}/summary.json, summary.md, summary.png, requests.jsonl")
    return 0 if summary["errors"] == 0 else 1


def _bench_progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr)


def _bench_sessions(args: argparse.Namespace) -> int:
    """``tuner bench --sessions FILE``: conversations side by side
    (``tuner.bench.conversations``)."""
    import asyncio

    from tuner.bench.conversations import SessionOptions, load_sessions, run_sessions

    sessions = load_sessions(Path(args.sessions))[: args.prompts]
    defaults = SessionOptions(out=Path(args.out))
    options = SessionOptions(
        out=Path(args.out),
        matrix=tuple(args.matrix.split(",")) if args.matrix else defaults.matrix,
        clients=args.clients,
        max_tokens=args.max_tokens or defaults.max_tokens,
        seed=args.seed,
        tuner=args.requests > 0,
    )
    settings = settings_from_args(args)
    try:
        summary = asyncio.run(run_sessions(settings, sessions, options, _bench_progress))
    except asyncio.CancelledError:
        print("[bench] stopped", file=sys.stderr)
        return 128 + 15
    print(json.dumps(summary, indent=2))
    print(f"wrote {options.out}/summary.json, turns.jsonl")
    errors = sum(
        arm["errors"]
        for level in summary.values()
        if isinstance(level, dict) and "all" in level
        for arm in level["all"]["arms"].values()
    )
    return 0 if errors == 0 else 1


def cmd_classify(args: argparse.Namespace) -> int:
    """Classify each line of a workload file and show the class and features."""
    from tuner.classify import classify, load_definitions
    from tuner.tables import text_table
    from tuner.workload import load_workload, parse_workload

    settings = settings_from_args(args)
    definitions = load_definitions(settings.classes_file)
    if args.file in (None, "-"):
        items = parse_workload(sys.stdin.read().splitlines(), "<stdin>")
    else:
        items = load_workload(Path(args.file))
    results = [(item, classify(item.model_dump(exclude_none=True), definitions)) for item in items]
    if args.format == "jsonl":
        for item, found in results:
            print(json.dumps({"id": item.id, "class": found.key, **found.features.as_dict()}))
        return 0
    rows = [
        [
            item.id,
            found.key,
            found.features.content_type,
            found.features.subtype,
            found.features.echo,
            found.features.entropy,
            found.features.length_tokens,
        ]
        for item, found in results
    ]
    print(text_table(["id", "class", "type", "subtype", "echo", "entropy", "tokens"], rows))
    counts: dict[str, int] = {}
    for _, found in results:
        counts[found.key] = counts.get(found.key, 0) + 1
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0


def _check_class(key: str, settings: Settings) -> None:
    """A class key or one of its parents (``code``, ``code/echo``, ``all``), else exit 2."""
    from tuner.classify.classes import load_definitions

    definitions = load_definitions(settings.classes_file)
    classes = definitions.all_classes()
    if key not in definitions.levels():
        raise ConfigError(
            f"no class {key!r}: a class is group/echo|fresh/greedy|sampled or a part of it "
            f"from the left, e.g. {classes[0]}, {classes[0].split('/')[0]} or all"
        )


def cmd_report(args: argparse.Namespace) -> int:
    """The chosen policy per class with its evidence, read from the state dir."""
    from dataclasses import asdict

    from tuner.report.data import load_histories, load_history, load_report
    from tuner.report.outlook import outlook
    from tuner.report.render import (
        as_json,
        as_markdown,
        as_table,
        history_markdown,
        history_table,
    )

    if args.storage_url:
        require("psycopg")
        from tuner.report.fleet import load_fleet_report

        fleet = load_fleet_report(args.storage_url)
        print({"json": as_json, "markdown": as_markdown}.get(args.format, as_table)(fleet), end="")
        return 0
    settings = settings_from_args(args)
    state_dir = settings.state_dir
    if not state_dir.is_dir():
        raise ConfigError(
            f"no state dir at {state_dir}: the daemon writes one as it serves "
            "(--state-dir or TUNER_STATE_DIR names another)"
        )
    if args.class_key:
        _check_class(args.class_key, settings)
        trials = load_history(state_dir, args.class_key)
        if args.format == "json":
            document = {"class": args.class_key, "trials": [asdict(t) for t in trials]}
            print(json.dumps(document, indent=2))
        elif args.format == "markdown":
            print(history_markdown(args.class_key, trials), end="")
        else:
            print(history_table(args.class_key, trials), end="")
        return 0
    report = load_report(state_dir)
    if not report.found and not report.unreadable:
        report = replace(report, outlook=outlook(settings))
    render = {"json": as_json, "markdown": as_markdown}.get(args.format, as_table)
    print(render(report), end="")
    if args.plot:
        from tuner.report.plot import plot_report

        histories = load_histories(state_dir, [r.class_key for r in report.classes])
        path = plot_report(report, histories, Path(args.plot))
        print(f"plot written to {path}", file=sys.stderr)
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    """Move learned policies between machines: ``export FILE`` / ``import FILE``."""
    from tuner.transfer import export_policies, import_policies, this_machine

    settings = settings_from_args(args)
    if args.action == "export":
        wrapped = export_policies(settings.state_dir, Path(args.file))
        print(f"{len(wrapped['policies']['classes'])} classes exported to {args.file}")
        return 0
    done = import_policies(Path(args.file), settings.state_dir, this_machine(settings))
    aside = f"; the previous policies kept as {done['set_aside']}" if done["set_aside"] else ""
    print(f"{len(done['classes'])} classes imported into {settings.state_dir}{aside}")
    return 0


def cmd_variants(args: argparse.Namespace) -> int:
    """The search space the daemon would run here, with the prior's predictions."""
    from tuner.cli.space import show_space

    print(show_space(settings_from_args(args), args.format), end="")
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(f"spec-tuner {__version__}")
    return 0
