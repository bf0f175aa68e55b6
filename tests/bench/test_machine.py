from __future__ import annotations

import subprocess
import sys
import time

import psutil
from hypothesis import given
from hypothesis import strategies as st

from tuner.bench.machine import CpuSample, load, sample


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_outside_the_bench_is_other_and_its_own_is_not() -> None:
    # the "bench" is a sleeping child: this test process burning CPU is outside it
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        root = psutil.Process(sleeper.pid)
        before = sample(root)
        burn(0.5)
        after = sample(root)
    finally:
        sleeper.kill()
        sleeper.wait()
    found = load([before, after], psutil.cpu_count() or 1)
    assert found["other_cpu_s"] >= 0.4, found
    assert found["own_cpu_s"] < 0.2, found


def test_a_finished_child_counts_as_the_bench_own() -> None:
    before = sample()
    child = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", child], check=True)  # reaped: in children_user
    after = sample()
    assert load([before, after], psutil.cpu_count() or 1)["own_cpu_s"] >= 0.5


def test_fewer_than_two_samples_say_nothing_measured() -> None:
    assert load([], 2) == {"seconds": 0.0, "cores": 2, "samples": 0}
    assert "other_share" not in load([sample()], 2)


# a run as cumulative counters: per interval, seconds, own and other CPU-seconds, steal
intervals = st.lists(
    st.tuples(st.floats(1.0, 60.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 0.2)),
    min_size=1,
    max_size=40,
)


def counters(steps: list[tuple[float, float, float, float]], cores: int) -> list[CpuSample]:
    at = busy = steal = total = own = 0.0
    out = [CpuSample(at, busy, steal, total, own)]
    for seconds, own_part, other_part, steal_part in steps:
        capacity = seconds * cores
        own_s = capacity * own_part * (1 - steal_part) / 2
        other_s = capacity * other_part * (1 - steal_part) / 2
        at += seconds
        own += own_s
        busy += own_s + other_s
        steal += capacity * steal_part
        total += capacity
        out.append(CpuSample(at, busy, steal, total, own))
    return out


@given(intervals, st.integers(1, 16))
def test_shares_are_within_the_machine_and_add_up(
    steps: list[tuple[float, float, float, float]], cores: int
) -> None:
    samples = counters(steps, cores)
    found = load(samples, cores)
    assert 0.0 <= found["other_share"] <= 0.5 + 1e-3
    assert 0.0 <= found["steal_share"] <= 0.2 + 1e-3
    assert found["worst_interval_other_share"] >= found["other_share"] - 1e-3
    # the whole run's share is a mean of its quarters', so it lies between them
    quarters = [q for q in found["other_share_by_quarter"] if q is not None]
    assert quarters and min(quarters) - 1e-3 <= found["other_share"] <= max(quarters) + 1e-3
    wall = sum(s[0] for s in steps)
    expected = sum(s[0] * cores * s[2] * (1 - s[3]) / 2 for s in steps) / (wall * cores)
    assert abs(found["other_share"] - expected) < 1e-3
    # the order samples arrive in does not matter
    assert load(list(reversed(samples)), cores) == found
