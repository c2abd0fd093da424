"""bench/conv_chunks.py: a smoke run of one small layer at two chunk sizes gives each
op's time and the workspace, which is smaller with chunks than for the whole batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "bench" / "conv_chunks.py"


@pytest.mark.slow  # a benchmark end to end: CI's slow step
def test_a_smoke_run_reports_each_chunk_size() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--json", "--shape", "8,8,14,3",
                          "--chunks", "0.25,0", "--repeats", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    rows = got["shapes"]["8,8,14,3"]
    assert set(rows) == {"0.25 MiB", "whole batch"}
    for r in rows.values():
        assert all(r[op] > 0 for op in ("Conv", "ConvGradWeight", "ConvGradInput")), r
    # 8 channels, 3x3, 14 rows of 16: 57 KiB of columns an image, 3.6 MiB for 64
    assert rows["0.25 MiB"]["workspace_bytes"] < rows["whole batch"]["workspace_bytes"] / 8
