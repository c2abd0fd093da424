"""Model switching against the physical limit and against rebuilding a model.

For heaps of about 1 MB, 16 MB and 128 MB (the paper's MLP widened until its
program, Adam, batch 64, has that many bytes), timed interleaved in one run, median
of ``--repeats``:

- ``switch_ms``: ``pool.activate(other)`` between two models of the program: the
  active model's state is copied out, the arena re-initialised (memset) and the
  other's state copied in;
- ``memset_memcpy_ms``: a raw memset of ``heap_bytes`` plus a raw memcpy of
  ``heap_bytes`` from host memory (the paper's switch done with no bookkeeping: the
  physical limit it is compared to);
- ``same_bytes_ms``: the raw operations on exactly the bytes the switch moves
  (memcpy out, memset, memcpy in), to show the switch's own overhead;
Each sample times back-to-back calls (about 20 ms' worth) and divides.

- ``torch_rebuild_ms``: building a PyTorch model of the same layers and its Adam
  optimizer and moving it to the device: what a user without switching pays.

    python bench/switching.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import calls_per_sample, timed
from engine import Adam, Program, compile_graph
from engine.models import paper_mlp
from engine.runtime.arena import Arena
from engine.runtime.pool import ModelPool

TARGETS = (1 << 20, 16 << 20, 128 << 20)
BATCH = 64


def program_near(target: int, device: str) -> tuple[Program, int]:
    """The paper's MLP (784-h-h-10) whose heap is closest to ``target`` bytes."""
    def prog(h: int) -> Program:
        return compile_graph(paper_mlp((784, h, h, 10)), batch_size=BATCH,
                             optimizer=Adam(lr=1e-3), device=device)
    lo, hi = 1, 2
    while prog(hi).total_bytes < target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if prog(mid).total_bytes < target else (lo, mid)
    best = min((lo, hi), key=lambda h: abs(prog(h).total_bytes - target))
    return prog(best), best




def torch_rebuild(hidden: int, device: str) -> Callable[[], Any]:
    import torch

    dev = "cuda" if device == "gpu" else "cpu"

    def build() -> Any:
        model = torch.nn.Sequential(
            torch.nn.Linear(784, hidden), torch.nn.Sigmoid(),
            torch.nn.Linear(hidden, hidden), torch.nn.Sigmoid(),
            torch.nn.Linear(hidden, 10)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        if dev == "cuda":
            torch.cuda.synchronize()
        return model, opt

    return build


def case(target: int, repeats: int, device: str, with_torch: bool) -> dict[str, Any]:
    prog, hidden = program_near(target, device)
    arena = Arena.for_programs([prog])
    pool = ModelPool(arena)
    a, b = pool.add(prog, seed=0), pool.add(prog, seed=1)
    pool.activate(a)
    be = arena.backend
    sync = be.synchronize
    heap = arena.buffer
    n = prog.total_bytes
    host = be.host_alloc(n)
    host.fill(1)
    state = prog.state_bytes + prog.zone_bytes["optimizer"]  # what a switch copies each way
    out_host = be.host_alloc(state)

    def raw() -> None:
        be.memset(heap[:n])
        be.copy_in(heap[:n], host)

    def same_bytes() -> None:
        be.copy_out(out_host, heap[:state])
        be.memset(heap[state:n])
        be.copy_in(heap[:state], host[:state])

    models = [b, a]
    flip = [0]

    def switch() -> None:
        pool.activate(models[flip[0] % 2])
        flip[0] += 1

    build = torch_rebuild(hidden, device) if with_torch else None
    runs: dict[str, list[float]] = {"switch": [], "raw": [], "same": [], "torch": []}
    for _ in range(2):  # warm up: bindings, page faults, torch's first-call costs
        switch(), raw(), same_bytes()
        if build:
            build()
    k = calls_per_sample(raw, sync)  # the same count for all, so each sample is alike
    for _ in range(repeats):
        runs["switch"].append(timed(switch, sync, k))
        runs["raw"].append(timed(raw, sync, k))
        runs["same"].append(timed(same_bytes, sync, k))
        if build:
            runs["torch"].append(timed(build, sync, max(1, k // 10)))
    med = {k: statistics.median(v) if v else None for k, v in runs.items()}
    return {
        "heap_bytes": n, "hidden": hidden, "state_bytes_each_way": state, "calls_per_sample": k,
        "switch_ms": round(med["switch"], 4),  # type: ignore[arg-type]
        "memset_memcpy_ms": round(med["raw"], 4),  # type: ignore[arg-type]
        "same_bytes_ms": round(med["same"], 4),  # type: ignore[arg-type]
        "torch_rebuild_ms": round(med["torch"], 4) if med["torch"] is not None else None,
        "switch_over_limit": round(med["switch"] / med["raw"], 3),  # type: ignore[operator]
        "switch_over_same_bytes": round(med["switch"] / med["same"], 3),  # type: ignore[operator]
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch baseline")
    args = ap.parse_args()
    try:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
        with_torch = not args.no_torch
    except ImportError:
        with_torch = False
    cases = [case(t, args.repeats, args.device, with_torch) for t in TARGETS]
    out = {"device": args.device, "repeats": args.repeats, "cases": cases}
    if args.json:
        print(json.dumps(out))
        return
    for c in cases:
        print(f"{c['heap_bytes']:>12,} B  switch {c['switch_ms']:8.3f} ms  memset+memcpy "
              f"{c['memset_memcpy_ms']:8.3f} ms ({c['switch_over_limit']:.2f}x)  same bytes "
              f"{c['same_bytes_ms']:8.3f} ms  torch rebuild {c['torch_rebuild_ms']} ms")


if __name__ == "__main__":
    main()
