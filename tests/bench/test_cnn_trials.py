"""bench/cnn_trials.py: a smoke run times two drawn CNNs on each side and counts their
arithmetic once, from explore's compiler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "bench" / "cnn_trials.py"


@pytest.mark.slow  # a benchmark end to end: CI's slow step
def test_a_smoke_run_times_each_network_on_both_sides() -> None:
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, str(SCRIPT), "--json", "--quick", "--ops"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(got["configs"]) == 2
    for c in got["configs"]:
        assert c["network"]["blocks"] in (1, 2, 3)
        assert c["mflop_per_step"] > 0
        ms = c["ms_per_step"]
        assert ms["explore"] > 0 and ms["torch"] > 0
        assert c["explore_over_torch"] == pytest.approx(ms["explore"] / ms["torch"], rel=0.02)
        # both rates are of explore's count of the step's arithmetic
        for side in ("explore", "torch"):
            assert c["gflops"][side] == pytest.approx(
                c["mflop_per_step"] / ms[side], rel=0.02)
    # the op breakdown names the convolutions, which a CNN's step is made of
    assert "Conv" in got["ops"]["ms_by_op"]
