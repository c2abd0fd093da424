"""bench/transformer.py: the largest-batch search on made-up memory curves, the engine's
memory probe (its batch's planned bytes within the budget, the next batch's over), the
command line's errors, and (CI's slow step) the whole comparison in its smoke size."""

from __future__ import annotations

import doctest
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.transformer import CASES, largest_within

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "bench" / "transformer.py"


def script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def answer(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("start", [1, 7, 100, 101, 5000])
@pytest.mark.parametrize(("fixed", "per_row"), [(1000, 10), (0, 3), (500, 1)])
def test_the_search_finds_the_largest_batch_that_fits(start: int, fixed: int, per_row: int
                                                      ) -> None:
    budget = 2000
    calls: list[int] = []

    def measure(b: int) -> int:
        calls.append(b)
        return fixed + per_row * b

    batch, seen, complete = largest_within(measure, budget, start=start)
    assert complete
    assert measure(batch) <= budget < measure(batch + 1)
    calls = calls[:-2]  # the two checks above
    assert len(calls) == len(set(calls)) == len(seen)  # each batch measured once
    assert seen == {b: fixed + per_row * b for b in calls}
    # a bracket by doubling or halving, then linear memory's boundary by one interpolation
    # and its neighbour
    assert len(calls) <= math.ceil(math.log2(max(start, batch) / min(start, batch))) + 4


def test_the_docstring_examples() -> None:
    import bench.transformer

    assert doctest.testmod(bench.transformer).failed == 0


def test_the_search_on_a_curve_that_is_not_linear_falls_back_to_bisection() -> None:
    def measure(b: int) -> int:  # a step at 64, as when an allocator changes strategy
        return b * b + (10_000 if b >= 64 else 0)

    batch, seen, complete = largest_within(measure, 12_000, start=3)
    assert complete and batch == 63 and measure(63) <= 12_000 < measure(64)
    # 6 probes to bracket [48, 96], then at most 3 probes per halving of the bracket
    assert len(seen) <= 6 + 3 * math.ceil(math.log2(48))


def test_the_search_when_nothing_fits_or_everything_does() -> None:
    assert largest_within(lambda b: 10 * b, 5, start=40)[0::2] == (0, True)
    batch, seen, complete = largest_within(lambda b: b, 10**9, start=3, cap=100)
    assert (batch, complete) == (100, True) and max(seen) == 100


def test_the_search_stopped_early_reports_a_batch_that_fits() -> None:
    batch, seen, complete = largest_within(lambda b: 7 * b, 1000, start=10, max_probes=3)
    assert not complete and len(seen) == 3
    assert 0 < batch < 1000 // 7 and seen[batch] <= 1000


def test_the_engine_probe_plans_within_the_budget_and_measures_its_step() -> None:
    budget = 2 << 20
    r = answer(script("--memory-side", "engine", "--case", "tiny", "--budget", str(budget)))
    assert r["batch"] >= 1
    assert r["planned_bytes"] <= budget < r["planned_bytes_next_batch"]
    assert r["heap_bytes"] == r["planned_bytes"] == sum(r["planned_bytes_by_zone"].values())
    # the arena is what a warm step's memory grows by, give or take the Python objects
    assert r["rss_method"] == "reset_peak"
    assert 0.5 * r["planned_bytes"] < r["rss_growth_bytes"] < r["planned_bytes"] + (8 << 20)


@pytest.mark.parametrize(("args", "message"), [
    (["--budgets", "64,x"], "'64,x' is not a comma-separated list of MiB"),
    (["--budgets", "0"], "each budget must be more than 0 MiB"),
    (["--cases", "mnist_rows,huge"], "--cases: unknown ['huge']; known: mnist_rows, long, tiny"),
    (["--repeats", "0"], "--repeats must be at least 1"),
])
def test_bad_arguments_exit_2_and_say_which(args: list[str], message: str) -> None:
    out = script(*args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


@pytest.mark.slow  # a benchmark run end to end (about 25 s): CI's slow step
def test_the_smoke_run() -> None:
    pytest.importorskip("torch")
    r = answer(script("--quick", "--repeats", "1", "--json", timeout=600))
    assert r["device"] == "cpu" and r["quick"] and r["repeats"] == 1 and r["threads"] >= 1
    (name,) = r["cases"]
    c = r["cases"][name]
    assert name == "tiny" and c["shape"]["batch"] == CASES["tiny"].batch
    e, t = c["engine_ms_step"], c["torch_ms_step"]
    assert e > 0 and t > 0
    # ratios of the unrounded times, which are printed to the microsecond
    assert c["engine_over_torch"] == pytest.approx(e / t, rel=0.01, abs=0.006)
    assert c["speedup_vs_torch"] == pytest.approx(t / e, rel=0.01, abs=0.006)
    assert set(c["torch_ms_step_by_adam"]) == {"fused", "foreach"}
    assert t == min(c["torch_ms_step_by_adam"].values()) == c["torch_ms_step_by_adam"][
        c["torch_adam"]]
    assert c["engine_ms_step_runs"] == [e] and c["torch_ms_step_runs"] == [t]
    assert {"MatMulT", "Softmax", "optimizer update"} <= set(c["engine_ms_by_op"])
    assert c["engine_peak_rss_bytes"] > 0 and c["torch_peak_rss_bytes"] > 0
    assert c["engine_planned_bytes"] > 0
    m = r["max_batch"]
    (b,) = m["budgets"]
    assert m["case"] == "tiny" and b["budget_bytes"] == 2 << 20
    assert b["engine_batch"] >= 1
    assert b["engine_planned_bytes"] <= b["budget_bytes"] < b["engine_planned_bytes_next_batch"]
    probes = {int(k): v for k, v in b["torch_probes"].items()}
    assert str(b["engine_batch"]) in b["torch_probes"]  # the search starts there
    if b["torch_batch"]:
        assert b["torch_bytes"] == probes[b["torch_batch"]] <= b["budget_bytes"]
        assert b["torch_bytes"] == b["torch_growth_bytes"] + b["torch_state_bytes"]
        assert b["engine_batch_over_torch"] == pytest.approx(
            b["engine_batch"] / b["torch_batch"], abs=0.006)
    assert all(v > b["budget_bytes"] for k, v in probes.items() if k > b["torch_batch"])


def test_gpu_without_a_gpu_skips_and_says_why() -> None:
    from engine.runtime.backends import gpu_available

    if gpu_available():
        pytest.skip("this machine has a GPU: --device gpu runs")
    r = answer(script("--device", "gpu", "--json"))
    assert r["device"] == "gpu" and "cases" not in r
    assert r["skipped"].startswith("--device gpu needs cupy and PyTorch with CUDA: engine: ")
