"""``tuner``: a thin command line over functions that tests call without argv.

Each command returns an exit code; 2 means the user must fix something.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tuner import __version__
from tuner.errors import TunerError
from tuner.logs import configure_logging
from tuner.settings import Settings, load_settings

__all__ = ["main"]


def _settings(args: argparse.Namespace) -> Settings:
    config = args.config or os.environ.get("TUNER_CONFIG")
    overrides = {
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "model": getattr(args, "model", None),
        "llama_server": getattr(args, "llama_server", None),
        "upstream_url": getattr(args, "upstream_url", None),
        "state_dir": getattr(args, "state_dir", None),
    }
    return load_settings(Path(config) if config else None, **overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    from tuner.daemon import serve

    settings = _settings(args)
    configure_logging(settings.log_format, settings.log_level)
    return serve(settings)


def cmd_provision(args: argparse.Namespace) -> int:
    """Locate or build llama-server and the default model; print what was found."""
    from tuner.upstream.capabilities import probe_capabilities
    from tuner.upstream.launch import resolve_model
    from tuner.upstream.provision import locate_llama_server

    settings = _settings(args)
    binary = locate_llama_server(
        settings.llama_server, settings.cache_dir, cuda=settings.llama_cuda
    )
    caps = probe_capabilities(binary)
    model, draft = resolve_model(settings)
    info = {
        "llama_server": str(binary),
        "build": caps.build,
        "commit": caps.commit,
        "spec_types": sorted(caps.spec_types),
        "new_spec_flags": caps.new_spec_flags,
        "old_draft_flags": caps.old_draft_flags,
        "router": caps.router,
        "model": str(model),
        "draft_model": str(draft) if draft else None,
    }
    print(json.dumps(info, indent=2))
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(f"spec-tuner {__version__}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=__doc__)
    parser.add_argument("--config", help="TOML settings file (or TUNER_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy daemon")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--model", help="target GGUF (default: Gemma 3 270M)")
    serve.add_argument("--llama-server", dest="llama_server", help="llama-server binary")
    serve.add_argument("--upstream-url", dest="upstream_url", help="use a running llama-server")
    serve.add_argument("--state-dir", dest="state_dir")
    serve.set_defaults(func=cmd_serve)

    provision = sub.add_parser("provision", help="find or build llama-server and the model")
    provision.add_argument("--model")
    provision.add_argument("--llama-server", dest="llama_server")
    provision.set_defaults(func=cmd_provision)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
