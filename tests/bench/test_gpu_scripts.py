"""What issue 22's GPU session runs, checked on the CPU beforehand: the two GPU benchmarks
in their CPU smoke modes (the JSON's keys, and numbers that agree with one another), the
shell scripts' syntax, and that the wheels fetched for the GPU machine cover every
dependency its image lacks.  No GPU is needed, and nothing here skips without one."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from bench._gpu_cases import CASES, SMOKE, family

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent.parent
TOOLS = ROOT / "tools"
GPU_ONLY = ("free_context", "free_heap", "free_after", "pool_heap_bytes",
            "pool_used_change_in_steps", "pool_total_change_in_steps", "pool_mallocs_in_steps",
            "device_allocs_in_steps", "pool_malloc_bytes_in_steps", "steady")


def bench_json(script: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--json", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_memory_suite_has_the_architectures_issue_22_names() -> None:
    assert len(CASES) >= 20
    assert {family(c) for c in CASES} == {"mlp", "cnn", "stack", "nn", "onnx"}
    assert sum(family(c) == "onnx" for c in CASES) == 18  # nine light models, two batches


@pytest.mark.slow  # a benchmark run end to end: CI's slow step
def test_gpu_memory_smoke_on_the_cpu() -> None:
    r = bench_json("gpu_memory.py", "--device", "cpu", "--smoke")
    assert r["failed"] == [] and r["skipped"] == []
    assert r["device"] == "cpu" and r["smoke"] and r["device_name"]
    cases = r["cases"]
    assert [c["case"] for c in cases] == list(SMOKE)
    assert r["constant"] == int(statistics.median(c["overhead"] for c in cases))
    assert r["constant_source"] == "median of measured - planned"
    for c in cases:
        assert c["memory_source"] == "rss"
        assert c["planned"] > 0 and c["heap_allocated"] == c["planned"]
        assert c["measured"] == c["used_after"] - c["used_before"]
        assert c["context_bytes"] == c["used_context"] - c["used_before"]
        assert c["overhead"] == c["measured"] - c["planned"]
        assert c["residual"] == c["measured"] - c["planned"] - r["constant"]
        assert c["residual_over_heap"] == pytest.approx(c["residual"] / c["planned"])
        assert r["residuals"][c["case"]] == c["residual"]
        assert c["steps"] == 5
        for key in GPU_ONLY:
            assert c[key] is None, key
        assert c["pool_after"] == {"used": None, "total": None, "pinned_free_blocks": None}
        assert c["mallocs_by_op"] == {}
        assert c["within"] == (abs(c["residual"]) < max(c["planned"] / 100, r["granularity"]))
        assert c["over_context"] == c["measured"] - c["context_bytes"] - c["planned"]
        rounded = -(-c["planned"] // r["granularity"]) * r["granularity"]
        assert c["pages_beyond_rounded"] == pytest.approx(
            (c["measured"] - c["context_bytes"] - rounded) / r["granularity"], abs=0.01)
    assert r["max_abs_residual_over_heap"] == pytest.approx(
        max(abs(c["residual_over_heap"]) for c in cases))
    assert r["all_steady"] is None  # a GPU-only verdict
    assert r["granularity"] == os.sysconf("SC_PAGE_SIZE")
    assert r["all_within"] == all(c["within"] for c in cases)
    assert r["not_within"] == [c["case"] for c in cases if not c["within"]]
    assert r["over_context_range"] == [min(c["over_context"] for c in cases),
                                       max(c["over_context"] for c in cases)]


def test_gpu_memory_judges_residuals_by_a_given_constant() -> None:
    r = bench_json("gpu_memory.py", "--device", "cpu", "--smoke", "--cases", "mlp_tiny",
                   "--constant", "1000")
    (c,) = r["cases"]
    assert r["constant"] == 1000 and r["constant_source"] == "given"
    assert c["residual"] == c["measured"] - c["planned"] - 1000


@pytest.mark.slow  # a benchmark run end to end: CI's slow step
def test_gpu_parallel_smoke_on_the_cpu() -> None:
    r = bench_json("gpu_parallel.py", "--device", "cpu", "--smoke")
    budget, heap, constant = r["budget_bytes"], r["engine_heap_bytes"], r["engine_constant_bytes"]
    assert budget == 600_000_000 and heap > 0 and constant > 0
    assert r["engine_processes"] == min(2, budget // (constant + heap)) >= 1
    search = r["torch_search"]
    assert search[0]["processes"] == 1
    ok = [t["processes"] for t in search if t["ok"]]
    assert r["torch_processes"] == (max(ok) if ok else 0)
    for t in search:  # a try passes exactly when no process failed and the total fit
        assert t["ok"] == (t["failed_processes"] == 0 and t["peak_bytes"] <= budget)
    assert r["repeats_done"] == 1
    for side in ("engine", "torch"):
        runs = r["runs"][side]
        assert [g["processes"] for g in runs] == [r[f"{side}_processes"]] * len(runs)
        if runs:
            assert r[f"{side}_rounds_per_s"] == pytest.approx(
                statistics.median(g["rounds_per_s"] for g in runs))
            assert r[f"{side}_peak_bytes"] == max(g["peak_bytes"] for g in runs)
    assert r["engine_within_budget"] == all(g["within_budget"] for g in r["runs"]["engine"])
    e, t = r["engine_rounds_per_s"], r["torch_rounds_per_s"]
    assert r["throughput_ratio"] == (pytest.approx(e / t) if e and t else None)


@pytest.mark.parametrize("script", ["gpu_wheels.sh", "gpu_session.sh", "gpu_explore.sh",
                                    "gpu_ray.sh", "pg_kill_loop.sh"])
def test_shell_scripts_parse(script: str) -> None:
    out = subprocess.run(["bash", "-n", str(TOOLS / script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def shell_list(text: str, var: str) -> set[str]:
    m = re.search(rf'^{var}="([^"]*)"', text, re.M)
    assert m, f"{var} not found"
    return {norm(n) for n in m.group(1).split()}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_wheels_cover_what_the_gpu_image_lacks() -> None:
    """Every runtime dependency of pyproject.toml, the test dependencies the GPU tests
    import, and the MNIST data package are in the image's list or among the wheels'
    roots; and no root is something the image already has."""
    text = (TOOLS / "gpu_wheels.sh").read_text()
    roots, image = shell_list(text, "ROOTS"), shell_list(text, "IMAGE")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {norm(Requirement(d).name) for d in project["dependencies"]}
    dev = {norm(Requirement(d).name) for d in project["optional-dependencies"]["dev"]}
    tests = {"pytest", "pytest-xdist", "hypothesis", "onnxruntime", "scikit-learn"}
    assert tests <= dev
    from explore.datasets._mnist import MNIST_PACKAGE

    need = runtime | tests | {norm(MNIST_PACKAGE.split("==")[0])}
    assert need - image - roots == set()
    assert roots & image == set()
    assert {"torch", "cupy-cuda13x", "numpy", "onnx", "nvidia-ml-py"} <= image


def test_the_session_runs_the_steps_of_issue_22() -> None:
    text = (TOOLS / "gpu_session.sh").read_text()
    for step in ("tests)", "memory)", "memory_onnx)", "parallel)", "speed)", "multi_model)",
                 "explore)", "memory_all)", "first)", "second)", "third)", "peers)",
                 "fourth)"):
        assert f"    {step}" in text, step
    for bench in ("gpu_memory.py", "gpu_parallel.py", "paper_mlp.py", "cnn_step.py",
                  "switching.py", "multi_model.py", "peers.py"):
        assert f"bench/{bench}" in text
    marked = [p for p in (ROOT / "tests").rglob("test_*.py")
              if "mark.gpu" in p.read_text()]
    assert ROOT / "tests/engine/runtime/test_gpu.py" in marked
