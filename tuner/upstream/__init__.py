"""Everything about llama-server: obtaining it, its capabilities, running it, talking to it."""

from tuner.upstream.capabilities import Capabilities, parse_capabilities, probe_capabilities
from tuner.upstream.client import UpstreamClient
from tuner.upstream.launch import default_model_path, resolve_model, server_argv
from tuner.upstream.process import Backoff, ExternalMonitor, ManagedServer, free_port
from tuner.upstream.provision import build_llama_server, locate_llama_server

__all__ = [
    "Backoff",
    "Capabilities",
    "ExternalMonitor",
    "ManagedServer",
    "UpstreamClient",
    "build_llama_server",
    "default_model_path",
    "free_port",
    "locate_llama_server",
    "parse_capabilities",
    "probe_capabilities",
    "resolve_model",
    "server_argv",
]
