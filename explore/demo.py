"""The default job: the CalcGraph paper's MNIST MLP, sized then trained, offline.

    python -m explore.demo [--epochs N] [--memory BYTES]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from engine import VM, Adam, EngineError, compile_graph, size
from engine.models import paper_mlp
from engine.runtime.train import evaluate, train_epoch
from explore.datasets import DataError, load_mnist


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Train the CalcGraph paper's MNIST MLP.")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--memory", type=int, default=64 << 20,
                    help="a byte budget to report the largest batch for")
    args = ap.parse_args(argv)
    try:
        ds = load_mnist()
        g = paper_mlp()
        opt = Adam(lr=1e-3)
        zones = size(g, args.batch, opt)
        print(f"paper MLP 784-64-64-10 at batch {args.batch}: {sum(zones.values()):,} bytes "
              f"({', '.join(f'{k} {v:,}' for k, v in zones.items())})")
        largest = compile_graph(g, memory=args.memory, optimizer=opt).batch_size
        print(f"largest batch in {args.memory:,} bytes: {largest:,}")
        vm = VM(compile_graph(g, batch_size=args.batch, optimizer=opt), seed=0)
        rng = np.random.default_rng(0)
        for epoch in range(1, args.epochs + 1):
            t0 = time.perf_counter()
            loss = train_epoch(vm, ds.train.x, ds.train.y, rng)
            acc = evaluate(vm, ds.valid.x, ds.valid.y)
            print(f"epoch {epoch}: loss {loss:.4f}, validation accuracy {acc:.4f} "
                  f"({time.perf_counter() - t0:.2f} s)")
        print(f"test accuracy: {evaluate(vm, ds.test.x, ds.test.y):.4f}; heap "
              f"{vm.allocated_bytes:,} bytes allocated = {vm.program.total_bytes:,} predicted")
    except (EngineError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
