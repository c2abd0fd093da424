"""bench/conv_grad_input.py: a smoke run times both forms of one layer's input gradient
and names the form the rule takes there (transposed where dY has as many channels as
dX, col2im at four times as many)."""

from __future__ import annotations

import pytest

from tests.bench.test_fair_benchmarks import run_bench


@pytest.mark.slow  # a benchmark end to end: CI's slow step
def test_a_smoke_run_reports_both_forms() -> None:
    got = run_bench("conv_grad_input.py", "--shape", "8,8,7,3", "--shape", "8,32,7,3",
                    "--repeats", "1")
    rows = got["shapes"]
    assert [rows[s]["rule"] for s in ("8,8,7,3", "8,32,7,3")] == ["transposed", "col2im"]
    for r in rows.values():
        assert r["col2im"]["ms"] > 0 and r["transposed"]["ms"] > 0, r
        assert r["speedup"] == round(r["col2im"]["ms"] / r["transposed"]["ms"], 2)
