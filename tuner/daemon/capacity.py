"""How many variants (llama-server instances) fit in this machine's memory at once.

On CPU the weights are memory-mapped and shared between instances of the same
file, so each extra instance costs its KV cache and compute buffers. On a GPU
each instance holds its own copy of the offloaded weights. The KV estimate is an
upper bound (it assumes as many KV heads as attention heads).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from tuner.model.gguf_facts import ModelFacts

__all__ = ["Capacity", "context_size", "instances_that_fit"]

COMPUTE_BUFFER = 256 * 2**20  # per instance, measured order of magnitude for small models
HEADROOM = 0.75  # leave a quarter of what is free to everything else
# contexts an unset ``ctx_size`` chooses from, largest first: agents' turns carry 10-30k
# tokens of system prompt, repository map and files
AUTO_CONTEXTS = (32768, 16384, 8192, 4096)
WANT_INSTANCES = 4  # a larger context is not worth fewer variants loaded than this


@dataclass(frozen=True, slots=True)
class Capacity:
    instances: int
    per_instance_bytes: int
    available_bytes: int
    where: str  # "ram" or "gpu"

    def explain(self) -> str:
        return (
            f"{self.instances} instance(s): {self.available_bytes / 2**30:.1f} GiB free "
            f"{self.where}, ~{self.per_instance_bytes / 2**20:.0f} MiB each"
        )


def kv_bytes(facts: ModelFacts, ctx_size: int) -> int:
    """K and V, F16, every layer, the whole context (an upper bound)."""
    return 2 * 2 * facts.n_layers * facts.n_embd * ctx_size


def gpu_free_bytes() -> int | None:
    """Free memory of GPU 0 via NVML, or None without a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def instances_that_fit(
    facts: ModelFacts,
    ctx_size: int,
    *,
    gpu: bool,
    limit: int,
    available_ram: int | None = None,
    free_gpu: int | None = None,
) -> Capacity:
    """At least 1, at most ``limit``."""
    if gpu and (free := free_gpu if free_gpu is not None else gpu_free_bytes()) is not None:
        each = facts.total_bytes + kv_bytes(facts, ctx_size) + COMPUTE_BUFFER
        where = "gpu"
    else:
        free = available_ram if available_ram is not None else psutil.virtual_memory().available
        each = kv_bytes(facts, ctx_size) + COMPUTE_BUFFER
        free -= facts.total_bytes  # the shared mapping is paged in once
        where = "ram"
    n = int(max(free, 0) * HEADROOM // each) if each else limit
    return Capacity(max(1, min(limit, n)), each, max(free, 0), where)


def context_size(
    facts: ModelFacts,
    requested: int,
    *,
    gpu: bool,
    limit: int,
    available_ram: int | None = None,
    free_gpu: int | None = None,
) -> int:
    """``requested`` when set (not 0); else the largest of ``AUTO_CONTEXTS``, at most the
    model's trained context, at which as many instances fit as at the smallest (and never
    more than ``WANT_INSTANCES`` are asked for)."""
    if requested:
        return requested
    trained = facts.context_length or AUTO_CONTEXTS[-1]
    choices = [c for c in AUTO_CONTEXTS if c <= trained] or [trained]
    want = min(limit, WANT_INSTANCES)

    def fits(ctx: int) -> int:
        found = instances_that_fit(
            facts, ctx, gpu=gpu, limit=want, available_ram=available_ram, free_gpu=free_gpu
        )
        return found.instances

    floor = fits(choices[-1])
    return next(c for c in choices if fits(c) >= floor)
