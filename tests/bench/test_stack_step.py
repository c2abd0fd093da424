"""bench/stack_step.py: one run of two configurations in its smoke size gives the step's
time per model and its share of a core's peak for each, with the slowest instructions
named; a kernel setting it does not know is refused before any child runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "bench" / "stack_step.py"


PEAK = 4e10  # FLOP/s: the machine's peak is given, so the share is checked, not timed


@pytest.mark.slow  # a benchmark end to end: CI's slow step
def test_a_smoke_run_reports_each_configuration() -> None:
    env = {**os.environ, "EXPLORE_GEMM_PEAK": str(PEAK)}
    out = subprocess.run([sys.executable, str(SCRIPT), "--json", "--stacks", "1,2",
                          "--kernels", "numpy", "--repeats", "1", "--epochs", "1", "--ops"],
                         cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(got["configs"]) == {"numpy x1", "numpy x2"}
    # 784-64-64-10 at batch 64: each layer's product, its two gradients' (the first
    # layer's input gradient is not needed), and elementwise work on top
    products = 2 * 64 * (784 * 64 + 64 * 64 + 64 * 10)
    for name, c in got["configs"].items():
        assert c["us_per_model_step"] > 0, (name, c)
        flops = c["flops_per_model_step"]
        assert 3 * products - 2 * 64 * 784 * 64 <= flops < 4 * products, (name, flops)
        core_peak = PEAK / (os.cpu_count() or 1)
        rate = flops / (c["us_per_model_step"] * 1e-6)
        assert abs(c["share_of_core_peak"] - rate / core_peak) < 2e-3, (name, c)
        ops = [what for what, _ in c["ops"]]
        # a stack's first layer is a stacked product; a lone model's a fused dequantize
        assert any(("Stacked" in w) == (name.endswith("x2")) for w in ops), ops
        assert any(w.startswith("update") for w in ops), ops


def test_an_unknown_kernel_setting_is_refused() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--kernels", "fast"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "kernels are numpy or compiled, not 'fast'" in out.stderr
