"""VariantGate: one variant at a time, first come first served, cancellation-safe."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.proxy.gate import VariantGate


async def test_same_variant_shares_and_another_waits_for_it_to_drain() -> None:
    gate = VariantGate()
    await gate.acquire("a")
    await gate.acquire("a")
    b = asyncio.create_task(gate.acquire("b"))
    await asyncio.sleep(0)
    assert not b.done() and gate.active == "a"
    late_a = asyncio.create_task(gate.acquire("a"))  # queues behind b: no starvation
    await asyncio.sleep(0)
    assert not late_a.done()
    gate.release()
    await asyncio.sleep(0)
    assert not b.done()
    gate.release()
    await asyncio.sleep(0)
    assert b.done() and gate.active == "b" and not late_a.done()
    gate.release()
    await asyncio.sleep(0)
    assert late_a.done() and gate.active == "a" and gate.switches == 2
    gate.release()
    assert gate.active is None and gate.in_flight == 0


async def test_queued_requests_of_one_variant_are_admitted_together() -> None:
    gate = VariantGate()
    await gate.acquire("a")
    waiting = [asyncio.create_task(gate.acquire(v)) for v in ("b", "c", "b")]
    await asyncio.sleep(0)
    gate.release()
    await asyncio.sleep(0)
    assert [t.done() for t in waiting] == [True, False, True] and gate.in_flight == 2


async def test_a_cancelled_waiter_does_not_block_the_queue() -> None:
    gate = VariantGate()
    await gate.acquire("a")
    b = asyncio.create_task(gate.acquire("b"))
    c = asyncio.create_task(gate.acquire("c"))
    await asyncio.sleep(0)
    b.cancel()
    await asyncio.sleep(0)
    gate.release()
    await asyncio.sleep(0)
    assert c.done() and gate.active == "c" and gate.in_flight == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=30), st.integers(0, 2**16))
def test_never_two_variants_at_once_and_everyone_is_served(plan: list[str], seed: int) -> None:
    rng = random.Random(seed)

    async def scenario() -> tuple[int, int]:
        gate = VariantGate()
        running: dict[str, int] = {}
        overlap = served = 0

        async def request(variant: str) -> None:
            nonlocal overlap, served
            await asyncio.sleep(rng.random() / 1000)
            await gate.acquire(variant)
            running[variant] = running.get(variant, 0) + 1
            overlap = max(overlap, sum(1 for n in running.values() if n))
            await asyncio.sleep(rng.random() / 1000)
            running[variant] -= 1
            served += 1
            gate.release()

        await asyncio.wait_for(asyncio.gather(*(request(v) for v in plan)), 10)
        assert gate.in_flight == 0 and gate.active is None
        return overlap, served

    overlap, served = asyncio.run(scenario())
    assert overlap == 1 and served == len(plan)


async def test_busy_names_the_variant_to_join_and_the_waits_so_far() -> None:
    """The variant decoding while no other waits, and a moving mean of the waits (0 before
    any: a request that opens a conversation may join already)."""
    now = [0.0]
    gate = VariantGate(clock=lambda: now[0])
    assert gate.busy() is None
    await gate.acquire("a")
    assert gate.busy() == ("a", 0.0)  # a request for b would wait; none has yet
    b = asyncio.create_task(gate.acquire("b"))
    await asyncio.sleep(0)
    assert gate.busy() is None  # b waits: a request for a would queue behind it too
    now[0] = 2.0
    gate.release()
    await b
    assert gate.busy() == ("b", 2.0)
    a = asyncio.create_task(gate.acquire("a"))
    await asyncio.sleep(0)
    now[0] = 3.0
    gate.release()
    await a
    assert gate.busy() == ("a", 1.5) and gate.waits == 2  # (2 + 1) / 2
    gate.release()
    assert gate.busy() is None  # idle: nobody waits
