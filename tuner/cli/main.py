"""The ``tuner`` command line. Each command returns an exit code; 2 means the user must
fix something (the message says what)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from tuner import __version__
from tuner.cli.commands import (
    STATE_DIR_HELP,
    cmd_bench,
    cmd_calibrate,
    cmd_classify,
    cmd_inspect,
    cmd_policies,
    cmd_predict,
    cmd_provision,
    cmd_report,
    cmd_serve,
    cmd_variants,
    cmd_version,
)
from tuner.cli.engines import add_engines_command
from tuner.cli.measure import cmd_measure
from tuner.cli.model_commands import add_model_commands
from tuner.errors import TunerError
from tuner.logs import configure_logging
from tuner.profiles import SHIPPED_PROFILES, known_targets
from tuner.upstream.sources import ENGINES

__all__ = ["main"]

N = TypeVar("N", int, float)
# commands for measuring the tuner and the models, not for running it
RESEARCH = ("bench", "calibrate", "predict", "measure", "synth-moe", "derive-draft")


def _ranged(kind: Callable[[str], N], low: N, high: N | None = None) -> Callable[[str], N]:
    """An argparse type: ``kind(text)`` within ``[low, high]``, else a clear usage error."""

    def check(text: str) -> N:
        value = kind(text)
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}, got {text}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low:g}, got {text}")
        return value

    check.__name__ = kind.__name__  # argparse names it in "invalid int value: 'x'"
    return check


_fraction = _ranged(float, 0.0, 1.0)
_non_negative = _ranged(float, 0.0)
_positive = _ranged(int, 1)
_count = _ranged(int, 0)


def _client_counts(text: str) -> tuple[int, ...]:
    """``1,2,4``: each a number of concurrent clients."""
    return tuple(_positive(part) for part in text.split(","))


def _tuner_env(text: str) -> tuple[str, str]:
    """``TUNER_KEY=VALUE`` -> (key, value): a daemon setting as its environment variable."""
    key, equals, value = text.partition("=")
    if not equals or not key.startswith("TUNER_") or key != key.upper():
        raise argparse.ArgumentTypeError(f"expected TUNER_KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuner",
        description="spec-tuner: an OpenAI-compatible proxy in front of llama-server that "
        "learns, per kind of prompt, which speculative-decoding setting is fastest, and "
        "switches speculation off where it does not pay.",
        epilog="Start with `tuner serve`; `tuner report` shows what it decided. Settings: "
        "TUNER_* environment variables or a TOML file (docs/configuration.md). "
        f"For benchmarks and research: {', '.join(RESEARCH)} (tuner COMMAND --help).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", help="TOML settings file (or TUNER_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the proxy daemon",
        description="Run the OpenAI-compatible proxy; it starts llama-server (building it "
        "once when none is found) unless --upstream-url names a running one.",
        epilog="Every setting is also a TUNER_* environment variable or a key of the "
        "--config file: docs/configuration.md.",
    )
    # SUPPRESS: given after the command it is used, not given it leaves the one before it
    serve.add_argument(
        "--config", default=argparse.SUPPRESS, help="TOML settings file (or TUNER_CONFIG)"
    )
    serve.add_argument("--host", help="address to listen on (TUNER_HOST; default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (TUNER_PORT; default 8088)")
    serve.add_argument("--model", help="target GGUF (TUNER_MODEL; default: Gemma 3 270M)")
    serve.add_argument(
        "--draft-model",
        dest="draft",
        help="draft GGUF for draft-model variants (TUNER_DRAFT_MODEL)",
    )
    serve.add_argument(
        "--engine",
        choices=("auto", *ENGINES),
        help="the llama-server engine (TUNER_ENGINE; default auto: both measured here, the "
        "faster serves)",
    )
    serve.add_argument("--llama-server", dest="llama_server", help="llama-server binary")
    serve.add_argument(
        "--upstream-url",
        dest="upstream_url",
        help="a llama-server you run: served as it is, without tuning",
    )
    serve.add_argument("--state-dir", dest="state_dir", help=STATE_DIR_HELP)
    serve.set_defaults(func=cmd_serve)

    provision = sub.add_parser("provision", help="find or build llama-server and the model")
    provision.add_argument("--model", help="target GGUF to check (default: the configured model)")
    provision.add_argument(
        "--llama-server", dest="llama_server", help="a binary to check instead of building one"
    )
    provision.add_argument(
        "--engine", choices=ENGINES, help="the engine to build when no binary is named"
    )
    provision.set_defaults(func=cmd_provision)

    predict = sub.add_parser("predict", help="predicted speedup for acceptance, length, cost")
    predict.add_argument("--alpha", type=_fraction, required=True, help="acceptance, 0..1")
    predict.add_argument("--gamma", type=int, help="draft length; omit for a table over gamma")
    predict.add_argument(
        "--cost",
        "--c",
        dest="c",
        type=_non_negative,
        default=0.0,
        help="cost c: one draft step's time over one target step's (default 0: n-gram drafting)",
    )
    predict.add_argument("--experts", type=int, default=0, help="MoE: experts per layer (E)")
    predict.add_argument("--active", type=int, default=0, help="MoE: experts routed per token")
    predict.add_argument(
        "--expert-fraction",
        type=_fraction,
        default=0.0,
        dest="expert_fraction",
        help="MoE: share of a decode step's bytes in routed experts",
    )
    predict.add_argument(
        "--state-ratio",
        type=_non_negative,
        default=0.0,
        dest="state_ratio",
        help="hybrid recurrent: state checkpoint/restore cost in decode steps",
    )
    predict.add_argument(
        "--gamma-max", type=int, default=8, dest="gamma_max", help="longest draft in the table (8)"
    )
    predict.add_argument(
        "--target",
        help="a known target's MoE and recurrent-state terms, from profiles/targets "
        f"({', '.join(known_targets([SHIPPED_PROFILES])) or 'none shipped'})",
    )
    predict.set_defaults(func=cmd_predict)

    inspect = sub.add_parser("inspect", help="facts and speedup envelope of a GGUF model")
    inspect.add_argument("--model", help="target GGUF (default: the configured model)")
    inspect.add_argument(
        "--draft", help="draft GGUF: checks vocabulary compatibility (default: TUNER_DRAFT_MODEL)"
    )
    inspect.add_argument(
        "--format", choices=["table", "json"], default="table", help="table (default) or json"
    )
    inspect.set_defaults(func=cmd_inspect)

    calibrate = sub.add_parser("calibrate", help="measure verify cost and check predictions")
    calibrate.add_argument("--model", help="target GGUF (default: the configured model)")
    calibrate.add_argument("--workload", help="JSONL workload (default: the shipped dev set)")
    calibrate.add_argument("--prompts", type=int, help="use only the first N prompts")
    calibrate.add_argument(
        "--max-tokens", type=int, default=64, dest="max_tokens", help="tokens per prompt (64)"
    )
    calibrate.add_argument("--variants", help="comma list (default: every n-gram type)")
    calibrate.add_argument(
        "--format", choices=["table", "json"], default="table", help="table (default) or json"
    )
    calibrate.add_argument("--state-dir", dest="state_dir", help=STATE_DIR_HELP)
    calibrate.set_defaults(func=cmd_calibrate)

    bench = sub.add_parser("bench", help="replay a workload: baseline, static matrix, tuner")
    bench.add_argument("--workload", help="JSONL workload (prompt or messages)")
    bench.add_argument(
        "--sessions",
        metavar="FILE",
        help="a sessions workload (JSONL: system, turns of user and assistant): replay each "
        "conversation's turns in order, the same history through every arm and the tuner",
    )
    bench.add_argument(
        "--clients",
        type=_client_counts,
        default=(1,),
        help="with --sessions: numbers of concurrent clients, e.g. 1,4 (default 1)",
    )
    bench.add_argument("--analyse", metavar="DIR", help="only summarize an earlier run's DIR")
    bench.add_argument("--out", default="bench-out", help="directory for summary.json and more")
    bench.add_argument("--requests", type=_count, default=500, help="tuner requests (0: none)")
    bench.add_argument("--repeats", type=_positive, default=1, help="matrix runs of each prompt")
    bench.add_argument(
        "--baseline-repeats",
        type=_positive,
        default=1,
        help="baseline (no speculation) requests per prompt in each matrix run: the "
        "denominator of every ratio, measured more often than the other arms",
    )
    bench.add_argument("--seed", type=int, default=0, help="schedule and tuner seed")
    bench.add_argument(
        "--matrix",
        help="comma list of static variant names (default: a few "
        "settings of every spec type the build supports)",
    )
    bench.add_argument(
        "--max-tokens", type=_positive, dest="max_tokens", help="override every item's max_tokens"
    )
    bench.add_argument(
        "--prompts", type=_positive, help="use only the first N prompts (or sessions)"
    )
    side = bench.add_argument_group(
        "side by side", "a second tuner (other settings, code or engine) or another build"
    )
    side.add_argument(
        "--challenger",
        metavar="TUNING_FILE",
        help="also run a second tuner with this tuning file, sent the tuner's prompts side by "
        "side (each pair back to back), and compare the two",
    )
    side.add_argument(
        "--challenger-env",
        metavar="TUNER_KEY=VALUE",
        type=_tuner_env,
        action="append",
        default=[],
        help="a daemon setting for the challenger only (repeatable), e.g. "
        "TUNER_MAX_INSTANCES=8; needs --challenger",
    )
    side.add_argument(
        "--challenger-code",
        metavar="DIR",
        help="a checkout whose tuner package the challenger runs (git worktree add DIR "
        "<commit>): a code change side by side with the code before it; needs --challenger",
    )
    side.add_argument(
        "--peer",
        metavar="LLAMA_SERVER",
        help="another build's llama-server (ik_llama.cpp's, say) to run beside the matrix: "
        "its run without speculation and each --peer-arm, each arm read against the former",
    )
    side.add_argument(
        "--peer-arm",
        metavar="NAME=FLAGS",
        action="append",
        default=[],
        dest="peer_arm",
        help="a peer arm (repeatable): its llama-server flags, e.g. "
        "'mod+autotune=--spec-type ngram-mod --spec-autotune'; needs --peer",
    )
    bench.add_argument("--model", help="target GGUF (default: the configured model)")
    bench.add_argument(
        "--engine",
        choices=ENGINES,
        help="the llama-server engine of the matrix and the tuner (TUNER_ENGINE); with "
        "ik_llama.cpp its own --spec-autotune arms run beside them",
    )
    bench.set_defaults(func=cmd_bench)

    add_model_commands(sub, _positive)

    classify = sub.add_parser("classify", help="classify a workload file's prompts")
    classify.add_argument(
        "file", nargs="?", help="JSONL with id and prompt or messages (- = stdin)"
    )
    classify.add_argument(
        "--format", choices=["table", "jsonl"], default="table", help="table (default) or jsonl"
    )
    classify.set_defaults(func=cmd_classify)

    measure = sub.add_parser("measure", help="live alpha and speedup per class and variant")
    measure.add_argument("--state-dir", dest="state_dir", help=STATE_DIR_HELP)
    measure.set_defaults(func=cmd_measure)

    report = sub.add_parser("report", help="the chosen policy per class, with its evidence")
    report.add_argument("--state-dir", dest="state_dir", help=STATE_DIR_HELP)
    report.add_argument(
        "--format",
        choices=["table", "json", "markdown"],
        default="table",
        help="table (default), json (schema spec-tuner/report/1) or markdown",
    )
    report.add_argument(
        "--class",
        dest="class_key",
        metavar="NAME",
        help="the trial history of one class (from its Optuna studies)",
    )
    report.add_argument("--plot", metavar="FILE.png", help="also draw the evidence to a file")
    report.add_argument(
        "--storage-url",
        dest="storage_url",
        metavar="URL",
        help="the fleet's view, from its PostgreSQL database (TUNER_STORAGE_URL)",
    )
    report.set_defaults(func=cmd_report)

    variants = sub.add_parser(
        "variants", help="the search space on this build, model and draft, with predictions"
    )
    variants.add_argument("--model", help="target GGUF (default: the configured model)")
    variants.add_argument("--draft", help="draft GGUF (default: TUNER_DRAFT_MODEL)")
    variants.add_argument("--llama-server", dest="llama_server", help="llama-server binary")
    variants.add_argument(
        "--format", choices=["table", "json"], default="table", help="table (default) or json"
    )
    variants.set_defaults(func=cmd_variants)

    policies = sub.add_parser(
        "policies",
        help="export learned policies to a file, or import them on another machine",
        description="Move what one daemon learned to another machine with the same model.",
    )
    actions = policies.add_subparsers(
        dest="action", required=True, metavar="ACTION", help="export or import"
    )
    for action, text, file_help in (
        ("export", "write this state dir's policies to a file", "the JSON file to write"),
        ("import", "read a policies file into this state dir", "the JSON file to read"),
    ):
        one = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        one.add_argument("file", help=file_help)
        one.add_argument("--state-dir", dest="state_dir", help=STATE_DIR_HELP)
        one.add_argument(
            "--model", help="target GGUF the policies belong to (default: the configured one)"
        )
        one.set_defaults(func=cmd_policies)

    add_engines_command(sub)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=cmd_version)
    # The research commands run as before, listed in the epilog instead of beside serve.
    sub._choices_actions = [a for a in sub._choices_actions if a.dest not in RESEARCH]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Logs go to stderr, so stdout stays clean for tables and JSON; serve reconfigures.
    configure_logging("auto", "warning")
    try:
        code: int = args.func(args)
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``tuner classify FILE | head``): not an error. Point stdout
        # at devnull so the interpreter's flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code


if __name__ == "__main__":
    sys.exit(main())
