"""BestOf, the online kernel selector, against every static choice of kernel variants.

Per model, one program compiled with ``autotune=True`` (its workspace holds every
candidate) runs under the tuner and under each *static choice*: every decision kind
(an op, or a group: a dense layer's layout, a stacked layer's form) pinned to one of its
variants (``Tuner(pin=...)``; where that variant does not apply, the op's default), all
combinations of them.  Tuned and static runs are the same bytecode and the same bytes:
only the kernels bound differ.

Reported per model: the median step time (ms) of each static choice and of the tuned
VM once frozen (``--repeats`` samples, taken round-robin over the VMs so that they share
the machine's load, each the mean of as many steps as take about 50 ms); the ratio of
tuned to the best static choice, from a second measurement of the tuned VM and the
three best static choices with three times the samples (the least of many noisy
medians is biased low); the same in CPU time (``cpu_ms``: on a shared machine wall time
includes waiting for a core, CPU time does not); the steps and seconds until frozen
from a cold cache (``overhead_s``: that time less as many steps at the tuned speed);
whether a second VM started frozen from the persisted decisions; and the winners.

Models: the MNIST CNN, the paper MLP and a stack of 8 paper MLPs (training steps, batch
64), and three of the onnx package's light models (inference steps at batch 1, as
BestOf's ResNet34: their tunable ops are forward ops, and a training step costs ten
times as much for the same decisions).

    python bench/autotune.py --json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import SGD, VM, Adam, CalcGraph, Program, compile_graph
from engine.autotune import DecisionCache, Tuner
from engine.models import mnist_cnn, paper_mlp

ONNX_MODELS = ("squeezenet", "shufflenet", "inception_v1")


@dataclass
class Model:
    name: str
    program: Program
    path: str
    feed: dict[str, np.ndarray]
    step: str  # "train" or "infer"


def mnist_data(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.random((batch, 784), dtype=np.float32), "y": rng.integers(0, 10, batch)}


def models(onnx_names: tuple[str, ...]) -> dict[str, Callable[[], Model]]:
    def cnn() -> Model:
        prog = compile_graph(mnist_cnn(), batch_size=64, optimizer=SGD(lr=0.05, momentum=0.9),
                             autotune=True)
        return Model("mnist_cnn", prog, "train", mnist_data(64), "train")

    def mlp() -> Model:
        prog = compile_graph(paper_mlp(), batch_size=64, optimizer=Adam(lr=1e-3), autotune=True)
        return Model("paper_mlp", prog, "train", mnist_data(64), "train")

    def stack() -> Model:
        from engine.compile.stack import stack_graphs, stack_optimizers

        graphs = [paper_mlp(name=f"m{k}") for k in range(8)]
        opt = stack_optimizers([Adam(lr=1e-3 * (k + 1)) for k in range(8)])
        prog = compile_graph(stack_graphs(graphs), batch_size=64, optimizer=opt, autotune=True)
        return Model("stack_of_8_mlps", prog, "train", mnist_data(64), "train")

    def onnx_model(name: str) -> Callable[[], Model]:
        def make() -> Model:
            import onnx

            from engine.onnx_io import import_onnx
            from engine.onnx_io.light import data_input, light_models, randomized

            m = randomized(onnx.load(light_models()[name]))
            inp = data_input(m)
            dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
            g: CalcGraph = import_onnx(m, freeze=True)
            prog = compile_graph(g, batch_size=1, autotune=True)
            x = np.random.default_rng(0).random((1, *dims[1:]), dtype=np.float32)
            return Model(f"onnx_{name}", prog, "infer", {inp.name: x}, "infer")

        return make

    return {"mnist_cnn": cnn, "paper_mlp": mlp, "stack_of_8_mlps": stack,
            **{f"onnx_{n}": onnx_model(n) for n in onnx_names}}


def run_step(vm: VM, m: Model) -> None:
    if m.step == "train":
        vm.train_step(m.path)
    else:
        vm.forward(m.path)


def make_vm(m: Model, tuner: Tuner) -> VM:
    vm = VM(m.program, tune=tuner)
    vm.feed(m.feed)
    return vm


def static_choices(m: Model) -> list[dict[str, str]]:
    """Every combination of one variant per decision kind."""
    probe = Tuner(cache=None).attach(m.program)
    kinds: dict[str, list[str]] = {}
    for d in probe.decisions.values():
        names = kinds.setdefault(d.kind, [])
        names.extend(v for v in d.leaves if v not in names)
    order = sorted(kinds)
    return [dict(zip(order, combo, strict=True))
            for combo in itertools.product(*(kinds[k] for k in order))]


def label(pin: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(pin.items()))


def interleaved(vms: dict[str, VM], m: Model, repeats: int, steps: int
                ) -> tuple[dict[str, float], dict[str, float]]:
    """Median ms per step of each VM, wall and CPU time, over ``repeats`` samples of
    ``steps`` steps taken round-robin (in a new order each round, so that no VM always
    follows the same one)."""
    wall: dict[str, list[float]] = {k: [] for k in vms}
    cpu: dict[str, list[float]] = {k: [] for k in vms}
    order = list(vms)
    rng = random.Random(0)
    for _ in range(repeats):
        rng.shuffle(order)
        for k in order:
            vm = vms[k]
            t, c = time.perf_counter(), time.process_time()
            for _ in range(steps):
                run_step(vm, m)
            wall[k].append((time.perf_counter() - t) / steps * 1e3)
            cpu[k].append((time.process_time() - c) / steps * 1e3)
    return ({k: statistics.median(v) for k, v in wall.items()},
            {k: statistics.median(v) for k, v in cpu.items()})


def measure(m: Model, repeats: int, steps: int, cache_dir: Path) -> dict[str, Any]:
    cache = DecisionCache(cache_dir / f"{m.name}.json")
    tuned = make_vm(m, Tuner(cache=cache))
    assert tuned.autotune is not None
    t0 = time.perf_counter()
    run_step(tuned, m)
    n = 1
    while tuned.autotune.tuning:
        run_step(tuned, m)
        n += 1
    to_frozen = time.perf_counter() - t0
    warm = make_vm(m, Tuner(cache=DecisionCache(cache_dir / f"{m.name}.json")))
    assert warm.autotune is not None
    warm_frozen = warm.autotune.frozen and not warm.autotune.tuning
    del warm
    pins = static_choices(m)
    vms = {"tuned": tuned, **{label(p): make_vm(m, Tuner(cache=None, pin=p)) for p in pins}}
    for vm in vms.values():  # warm up: bindings, caches
        run_step(vm, m)
    if not steps:  # samples of about 50 ms: one preemption is not a whole sample
        t = time.perf_counter()
        for _ in range(3):
            run_step(tuned, m)
        steps = max(2, round(0.05 / ((time.perf_counter() - t) / 3)))
    wall, cpu = interleaved(vms, m, repeats, steps)
    static = {k: round(v, 3) for k, v in wall.items() if k != "tuned"}
    # The least of 8-32 noisy medians is biased low (the winner's curse): the three best
    # static choices and the tuned VM are measured again, with three times the samples, and
    # the ratios come from that second, independent measurement.
    top = sorted(static, key=static.__getitem__)[:3]
    wall2, cpu2 = interleaved({k: vms[k] for k in ("tuned", *top)}, m, 3 * repeats, steps)
    best = min(top, key=wall2.__getitem__)
    cpu_best = min(top, key=cpu2.__getitem__)
    winners = Counter((r["kind"], r["choice"]) for r in tuned.autotune.report())
    return {
        "model": m.name, "step": m.step, "batch": m.program.batch_size,
        "steps_per_sample": steps,
        "tunable_instructions": len(m.program.tunable),
        "decisions": len(tuned.autotune.decisions),
        "static_ms": static, "static_cpu_ms": {k: round(v, 3) for k, v in cpu.items()
                                               if k != "tuned"},
        "best_static": best, "best_static_ms": round(wall2[best], 3),
        "tuned_ms": round(wall2["tuned"], 3),
        "tuned_over_best_static": round(wall2["tuned"] / wall2[best], 3),
        "cpu_ms": {"tuned": round(cpu2["tuned"], 3), "best_static": cpu_best,
                   "best_static_ms": round(cpu2[cpu_best], 3),
                   "tuned_over_best_static": round(cpu2["tuned"] / cpu2[cpu_best], 3)},
        "steps_to_frozen": n,
        "time_to_frozen_s": round(to_frozen, 3),
        "overhead_s": round(to_frozen - n * wall2["tuned"] / 1e3, 3),
        "warm_start_frozen": warm_frozen,
        "winners": {f"{k}={v}": c for (k, v), c in sorted(winners.items())},
        "allocated_equals_planned": tuned.allocated_bytes == m.program.total_bytes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=9, help="samples per VM (median)")
    ap.add_argument("--steps", type=int, default=0,
                    help="steps per sample (default: as many as take about 50 ms)")
    ap.add_argument("--only", nargs="*", help="model names to run")
    ap.add_argument("--onnx", nargs="*", default=list(ONNX_MODELS),
                    help="light models of the onnx package")
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error("--repeats must be at least 5")
    rows = []
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as tmp:
        for name, make in models(tuple(args.onnx)).items():
            if args.only and name not in args.only:
                continue
            m = make()
            rows.append(measure(m, args.repeats, args.steps, Path(tmp)))
            if not args.json:
                print(json.dumps(rows[-1], indent=1), flush=True)
    out = {"models": rows, "repeats": args.repeats,
           "threads": os.environ.get("OMP_NUM_THREADS") or os.environ.get(
               "OPENBLAS_NUM_THREADS") or str(os.cpu_count()),
           "worst_tuned_over_best_static": max(r["tuned_over_best_static"] for r in rows)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"worst tuned / best static: {out['worst_tuned_over_best_static']}")


if __name__ == "__main__":
    main()
