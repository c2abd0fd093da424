"""bench/worker_start.py: one run of each kernel setting reports a worker's start and the
overhead it measured, the compiled worker's the larger (numba's LLVM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "bench" / "worker_start.py"


def test_a_smoke_run_reports_each_kernel_setting() -> None:
    pytest.importorskip("numba")  # the compiled setting needs it
    out = subprocess.run([sys.executable, str(SCRIPT), "--json", "--repeats", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["repeats"] == 1 and set(got["kernels"]) == {"numpy", "compiled"}
    numpy, compiled = got["kernels"]["numpy"], got["kernels"]["compiled"]
    assert numpy["start_s"] > 0 and compiled["start_s"] > 0
    assert 5 < numpy["overhead_mb"] < compiled["overhead_mb"], got
