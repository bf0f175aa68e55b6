"""``tuner engines``: the engines side by side on this machine and model, as the daemon
measured them for ``TUNER_ENGINE=auto`` (``engines.json``), or measured now."""

from __future__ import annotations

import argparse
import asyncio
import json

from tuner.cli.commands import STATE_DIR_HELP, settings_from_args
from tuner.engines.choice import (
    CHOICE_FILE,
    LOADED_CLIENTS,
    EngineChoice,
    load_choice,
    save_choice,
)
from tuner.errors import ConfigError
from tuner.settings import Settings
from tuner.tables import text_table

__all__ = ["add_engines_command", "cmd_engines", "engines_table"]


def add_engines_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    engines = sub.add_parser(
        "engines", help="the engines side by side on this machine and model (TUNER_ENGINE=auto)"
    )
    engines.add_argument("--state-dir", dest="state_dir", help=STATE_DIR_HELP)
    engines.add_argument("--model", help="target GGUF (default: the configured model)")
    engines.add_argument(
        "--measure",
        action="store_true",
        help="measure every built engine now (a few minutes) and keep the result",
    )
    engines.add_argument(
        "--format", choices=["table", "json"], default="table", help="table (default) or json"
    )
    engines.set_defaults(func=cmd_engines)


def engines_table(choice: EngineChoice) -> str:
    rows = []
    for r in choice.results:
        mark = "*" if r.engine == choice.engine else ""
        if r.measured:
            best = f"{r.tok_s:.1f} ({r.setting})"
            loaded = f"{r.loaded_tok_s:.1f} ({r.loaded_setting})" if r.loaded_tok_s else "-"
            plain = f"{r.prompt_tok_s:.0f} / {r.decode_tok_s:.1f}"
            rows.append([mark + r.engine, r.build or "?", best, loaded, plain, ""])
        else:
            rows.append([mark + r.engine, r.build or "-", "-", "-", "-", r.unavailable or ""])
    header = [
        "engine",
        "build",
        "tok/s, best setting",
        f"tok/s, {LOADED_CLIENTS} clients at once",
        "prefill / decode tok/s, plain",
        "note",
    ]
    return text_table(header, rows) + f"\nserving: {choice.engine}: {choice.why}"


def cmd_engines(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    path = settings.state_dir / CHOICE_FILE
    choice = asyncio.run(_measure(settings)) if args.measure else load_choice(path)
    if choice is None:
        raise ConfigError(
            f"no engine measurement in {settings.state_dir} yet: the daemon makes one when "
            "TUNER_ENGINE=auto and two engines are built, or run `tuner engines --measure`"
        )
    if args.measure:
        save_choice(path, choice)
    if args.format == "json":
        print(json.dumps(choice.model_dump(mode="json"), indent=1))
    else:
        print(engines_table(choice))
    return 0


async def _measure(settings: Settings) -> EngineChoice:
    from tuner.daemon.plan import sized
    from tuner.engines.auto import measure_now, prepare_built

    prepared = await asyncio.to_thread(prepare_built, settings)
    if not prepared:
        raise ConfigError("no engine is built: run `tuner provision` first")
    return await measure_now(sized(settings, prepared[0]), prepared)  # the daemon's context
