"""The memory planner and graph optimiser over a fixed suite of graphs.

Per case: graph nodes before and after optimisation, emitted instructions, bytes
without sharing, planned bytes, the lower bound (the most bytes live at any one
instruction, summed over the zones) and compile time, wall and CPU (medians of
``--repeats`` compilations, cases interleaved; on a machine shared with other work the
CPU time is the steadier one).  Also the bytes each packing strategy gives, and
for the paper's MLP under a 64 MiB budget the largest batch without and with sharing,
and the time of that search (explore compiles each candidate so).

    python bench/planner.py --json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import SGD, Adam, CalcGraph, Optimizer, Program, compile_graph
from engine.models import branching_graph, chain_graph, deep_mlp, mnist_cnn, paper_mlp

BUDGET = 64 << 20  # 64 MiB

Case = tuple[str, Callable[[], CalcGraph], Callable[[], Optimizer | None], int]
CASES: list[Case] = [
    ("mlp_train", lambda: paper_mlp(), lambda: Adam(lr=1e-3), 10_000),
    ("mlp_inference", lambda: paper_mlp(train=False), lambda: None, 10_000),
    ("mlp20_train", lambda: deep_mlp(depth=20, width=256), lambda: Adam(lr=1e-3), 256),
    ("cnn_train", lambda: mnist_cnn(), lambda: SGD(lr=0.05, momentum=0.9), 64),
    ("chain10k", lambda: chain_graph(10_000), lambda: None, 64),
    ("branching10k", lambda: branching_graph(10_000), lambda: None, 64),
    ("branching10k_train", lambda: branching_graph(10_000, train=True), lambda: SGD(lr=1e-2),
     64),
]


def totals(prog: Program) -> dict[str, int]:
    return {k: sum(z[k] for z in prog.memory.values())
            for k in ("no_sharing", "planned", "lower_bound")}


def compile_once(case: Case, sharing: str = "auto") -> tuple[Program, float, float]:
    """The program, and the milliseconds compiling it took: wall and CPU."""
    _, make, opt, batch = case
    graph = make()
    gc.collect()
    t, c = time.perf_counter(), time.process_time()
    prog = compile_graph(graph, batch_size=batch, optimizer=opt(), sharing=sharing)
    return prog, (time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3


def summary(prog: Program) -> dict[str, Any]:
    t = totals(prog)
    return {
        "batch": prog.batch_size,
        "nodes_before": prog.counts["nodes_before"],
        "nodes_after": prog.counts["nodes_after"],
        "instructions": len(prog.instrs),
        "bytes_no_sharing": t["no_sharing"],
        "bytes_planned": t["planned"],
        "bytes_lower_bound": t["lower_bound"],
        "planned_over_bound": round(t["planned"] / t["lower_bound"], 4),
        "below_bound_by_in_place": t["planned"] < t["lower_bound"],
    }


def run(repeats: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {c[0]: [] for c in CASES}
    cpu: dict[str, list[float]] = {c[0]: [] for c in CASES}
    stats: dict[str, dict[str, Any]] = {}
    for _ in range(repeats):  # interleaved: each round compiles every case once
        for case in CASES:
            prog, ms, cpu_ms = compile_once(case)
            times[case[0]].append(ms)
            cpu[case[0]].append(cpu_ms)
            stats[case[0]] = summary(prog)
            del prog  # a large program kept alive slows the next compile by ~20%
    cases = []
    for case in CASES:
        name = case[0]
        by_strategy = {s: totals(compile_once(case, s)[0])["planned"]
                       for s in ("best_fit", "greedy_by_size", "none")}
        cases.append({"name": name, **stats[name], "bytes_planned_by_strategy": by_strategy,
                      "compile_ms": round(statistics.median(times[name]), 1),
                      "compile_cpu_ms": round(statistics.median(cpu[name]), 1),
                      "compile_ms_all": [round(x, 1) for x in times[name]]})
    mlp = {s: compile_graph(paper_mlp(), memory=BUDGET, optimizer=Adam(lr=1e-3),
                            sharing=s).batch_size for s in ("none", "auto")}
    search_ms, search_cpu_ms = [], []  # the max-batch search, as explore compiles each
    for _ in range(repeats):  # candidate
        graph = paper_mlp()
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        compile_graph(graph, memory=BUDGET, optimizer=Adam(lr=1e-3))
        search_ms.append((time.perf_counter() - t) * 1e3)
        search_cpu_ms.append((time.process_time() - c) * 1e3)
    return {"cases": cases, "budget_bytes": BUDGET,
            "mlp_max_batch_64MB_no_sharing": mlp["none"], "mlp_max_batch_64MB": mlp["auto"],
            "mlp_max_batch_64MB_compile_ms": round(statistics.median(search_ms), 2),
            "mlp_max_batch_64MB_compile_cpu_ms": round(statistics.median(search_cpu_ms), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    out = run(args.repeats)
    if args.json:
        print(json.dumps(out))
        return
    print(f"{'case':<20} {'nodes':>13} {'no sharing':>14} {'planned':>14} {'bound':>14} "
          f"{'ratio':>7} {'ms':>8} {'cpu ms':>8}")
    for c in out["cases"]:
        print(f"{c['name']:<20} {c['nodes_before']:>6}->{c['nodes_after']:<6} "
              f"{c['bytes_no_sharing']:>14,} {c['bytes_planned']:>14,} "
              f"{c['bytes_lower_bound']:>14,} {c['planned_over_bound']:>7.3f} "
              f"{c['compile_ms']:>8.1f} {c['compile_cpu_ms']:>8.1f}")
    print(f"paper MLP, 64 MiB: batch {out['mlp_max_batch_64MB_no_sharing']:,} without sharing, "
          f"{out['mlp_max_batch_64MB']:,} with, found in "
          f"{out['mlp_max_batch_64MB_compile_ms']} ms "
          f"({out['mlp_max_batch_64MB_compile_cpu_ms']} ms CPU)")


if __name__ == "__main__":
    main()
