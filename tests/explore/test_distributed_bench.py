"""``bench/distributed.py --quick --json`` end to end: its own PostgreSQL server, 1, 2
and 4 drivers in both series, one JSON object whose figures are sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 35 s to 100 s on 2 shared cores: 6 runs of 1 to 4 drivers
def test_the_distributed_bench_runs_and_reports_sane_figures(postgres: object) -> None:
    # (the fixture: skipped, or failed in CI, where there is no PostgreSQL server)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "distributed.py"), "--quick",
                        "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["all_ok"] and result["repeats"] == 1 and result["trials"] == 16
    assert set(result["total"]) == {"1x4", "2x2", "4x1"}
    assert set(result["each"]) == {"1x1", "2x1", "4x1"}
    for series in ("total", "each"):
        for layout, s in result[series].items():
            drivers = int(layout.split("x")[0])
            assert s["drivers"] == drivers and s["all_ok"], (layout, s)
            # each driver that ran stored its figures (one starting after the total was
            # reached runs nothing)
            assert 1 <= s["drivers_with_figures"][0] <= drivers, (layout, s)
            assert s["trials_per_min"] > 0 and s["wall_s"] > 0
            assert s["busy_trials_per_min"] >= s["trials_per_min"]
            assert s["scheduler_storage_ms_per_trial"] > 0
            assert s["writer_storage_ms_per_trial"] > 0
            # a trial takes at least a claim, its parameters and record, and its end
            assert s["storage_calls_per_trial"] >= 4
            assert 0 < s["scheduler_storage_share"] < 1
            assert 0 < s["cpu_share"] <= 1.05 and 0 <= s["db_cpu_share"] < 1
            assert s["startup_s_min"] > 0
