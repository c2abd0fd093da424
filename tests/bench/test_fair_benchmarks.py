"""The benchmarks that compare libraries run end to end in their smoke sizes: each side
in its own fresh process (``bench/_sides.py``), one JSON object with the keys the
issue reads, positive times, and ratios that are the ratios of the times reported.
No wall-time thresholds: these machines are shared and noisy."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench._sides import alternate, fastest, median

ROOT = Path(__file__).resolve().parent.parent.parent


def run_bench(script: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args, "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def close(a: float, b: float, digits: int = 2) -> bool:
    """Equal up to the rounding of a value printed with ``digits`` decimals."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.6 * 10**-digits)


def test_alternate_runs_every_side_in_its_own_process_in_rotated_order(tmp_path: Path
                                                                       ) -> None:
    script = tmp_path / "side.py"
    log = tmp_path / "order.txt"
    script.write_text(
        "import json, os, sys\n"
        f"open({str(log)!r}, 'a').write(sys.argv[1] + '\\n')\n"
        "print('noise')\n"
        "print(json.dumps({'side': sys.argv[1], 'pid': os.getpid(), 'seed': sys.argv[-1]}))\n")
    runs = alternate(str(script), {"a": ["a"], "b": ["b"], "c": ["c"]}, 4,
                     per_repeat=lambda i: [str(10 + i)])
    assert log.read_text().split() == list("abcbcacababc")
    assert [r["seed"] for r in runs["b"]] == ["10", "11", "12", "13"]
    pids = [r["pid"] for got in runs.values() for r in got]
    assert len(set(pids)) == 12  # a fresh process each time
    assert median([{"t": 3}, {"t": 1}, {"t": None}, {"t": 2}], "t") == 2
    assert fastest({"x": 2.0, "y": 1.0, "z": None}) == "y"


def test_a_failing_side_says_why(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("import sys\nsys.exit('no such side')\n")
    with pytest.raises(RuntimeError, match="no such side"):
        alternate(str(script), {"a": []}, 1)


def test_an_interrupted_comparison_keeps_what_it_measured(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGINT at a time limit (or Ctrl-C) in the middle of the repeats: the answers
    already in are returned, each side with as many as it ran, and stderr says so."""
    import bench._sides as sides

    calls: list[str] = []

    def run_side(script: str, args: list[str], timeout: float | None = None) -> dict:
        if len(calls) == 4:
            raise KeyboardInterrupt
        calls.append(args[0])
        return {"side": args[0]}

    monkeypatch.setattr(sides, "run_side", run_side)
    runs = sides.alternate("x.py", {"a": ["a"], "b": ["b"], "c": ["c"]}, 3)
    assert calls == ["a", "b", "c", "b"]
    assert {k: len(v) for k, v in runs.items()} == {"a": 1, "b": 2, "c": 1}
    assert "interrupted: runs per side {'a': 1, 'b': 2, 'c': 1}" in capsys.readouterr().err


@pytest.mark.slow  # a benchmark run end to end: CI's slow step
def test_paper_mlp() -> None:
    pytest.importorskip("torch")
    r = run_bench("paper_mlp.py", "--quick", "--repeats", "1")
    for case, unit in (("full", "ms"), ("step64", "us")):
        e, t, n = (r[f"{s}_{unit}_{case}"] for s in ("engine", "torch", "numpy"))
        assert min(e, t, n) > 0
        assert r[f"speedup_vs_torch_{case}"] == pytest.approx(t / e)
        assert r[f"ratio_to_numpy_{case}"] == pytest.approx(e / n)
        by_adam = r[f"torch_{unit}_{case}_by_adam"]
        assert set(by_adam) == {"fused", "foreach"}
        assert t == min(by_adam.values()) == by_adam[r[f"torch_adam_{case}"]]
        assert r[f"engine_{unit}_{case}_runs"] == [e]
    for side in ("engine", "torch", "numpy"):
        assert r[f"{side}_peak_rss_bytes"] > 0 and r[f"{side}_peak_rss_bytes_step64"] > 0
    assert r["engine_heap_bytes"] > 0
    assert r["repeats"] == 1 and r["samples"] == 1024 and r["threads"] >= 1


@pytest.mark.slow  # a benchmark run end to end: CI's slow step
def test_cnn_step() -> None:
    pytest.importorskip("torch")
    r = run_bench("cnn_step.py", "--quick", "--repeats", "1")
    e, t = r["engine_ms_step"], r["torch_ms_step"]
    assert e > 0 and t > 0
    assert close(r["engine_over_torch"], e / t) and close(r["speedup_vs_torch"], t / e)
    assert t == min(r["torch_ms_step_by_variant"].values())
    assert r["torch_ms_step_by_variant"][r["torch_variant"]] == t
    assert r["engine_ms_step_by_conv_algorithm"]["im2col"] == e
    assert set(r["engine_ms_step_by_conv_algorithm"]) == {"im2col", "direct", "winograd"}
    assert all(v > 0 for v in r["conv_forward_workspace_bytes_by_algorithm"].values())
    assert "Conv" in r["engine_ms_by_op"] and "optimizer update" in r["engine_ms_by_op"]
    assert r["engine_peak_rss_bytes"] > 0 and r["torch_peak_rss_bytes"] > 0


@pytest.mark.slow  # a benchmark run end to end: CI's slow step
@pytest.mark.parametrize("pruner", ["none", "median"])
def test_explore_throughput(pruner: str) -> None:
    pytest.importorskip("torch")
    r = run_bench("explore_throughput.py", "--quick", "--repeats", "1", "--pruner", pruner)
    assert r["trials"] == 4 and r["rounds"] == 2 and r["pruner"] == pruner
    tpm = {b: r[f"baseline_{b}_trials_per_min"] for b in ("njobs", "journal")}
    assert min(tpm.values()) > 0 and r["explore_trials_per_min"] > 0
    assert r["baseline_better"] == max(tpm, key=lambda b: tpm[b])
    better = r["baseline_better"]
    assert r["baseline_trials_per_min"] == tpm[better]
    assert r["baseline_best"] == r[f"baseline_{better}_best"]
    assert close(r["speedup"], r["explore_trials_per_min"] / r["baseline_trials_per_min"])
    for b in ("njobs", "journal"):
        assert close(r[f"speedup_vs_{b}"], r["explore_trials_per_min"] / tpm[b])
        assert 0 < r[f"baseline_{b}_best"] <= 1
        assert r[f"baseline_{b}_peak_bytes"] > 0
        assert r[f"baseline_{b}_rounds_per_min"] > 0
    assert 0 < r["explore_best"] <= 1 and r["explore_peak_bytes"] > 0


@pytest.mark.slow  # a benchmark run end to end: CI's slow step
def test_multi_model_smallest_cell() -> None:
    pytest.importorskip("torch")
    r = run_bench("multi_model.py", "--only", "1:1", "--repeats", "1", "--device", "cpu")
    (cell,) = r["cells"]
    assert r["device"] == "cpu"  # what --device gpu changes, on a GPU session
    assert cell["engine_s"] > 0 and cell["torch_s"] > 0
    assert close(cell["speedup"], cell["torch_s"] / cell["engine_s"])


def test_a_long_comparison_says_each_run_as_it_ends(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A benchmark of many fresh processes is not silent for minutes: each run is said
    on stderr as it ends (which of how many, its side and repeat), stdout left to the
    JSON."""
    import bench._sides as sides

    monkeypatch.setattr(sides, "run_side", lambda script, args, timeout=None: {"s": args[0]})
    sides.alternate("x.py", {"a": ["a"], "b": ["b"]}, 2)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert not out and len(lines) == 4
    assert lines[0].startswith("  [1/4] repeat 1/2 a ") and lines[3].startswith(
        "  [4/4] repeat 2/2 a "), lines
