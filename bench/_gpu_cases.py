"""The architectures whose device memory ``bench/gpu_memory.py`` measures: each case
name builds one training program (compiled for a device) and the inputs a step reads.

Families: ``mlp`` (the paper's MLP at several widths and batches, a 20-layer MLP),
``cnn`` (``engine.models.mnist_cnn``), ``stack`` (8 MLPs fused by
:mod:`engine.compile.stack`), ``nn`` (models traced from :mod:`engine.nn`) and ``onnx``
(the onnx package's light models, trained at two batch sizes).  ``SMOKE`` lists tiny
cases for a CPU run of the benchmark's plumbing.

>>> sorted({family(c) for c in CASES})
['cnn', 'mlp', 'nn', 'onnx', 'stack']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

MLPS = {  # name: (sizes, batch)
    "mlp_16": ((784, 16, 10), 64),
    "mlp_paper": ((784, 64, 64, 10), 64),
    "mlp_paper_b10000": ((784, 64, 64, 10), 10_000),  # the paper's Sect. 4.3 model
    "mlp_256x2": ((784, 256, 256, 10), 64),
    "mlp_1024x2": ((784, 1024, 1024, 10), 256),
    "mlp_2048x3": ((784, 2048, 2048, 2048, 10), 256),
}
ONNX_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
               "shufflenet", "squeezenet", "vgg19", "zfnet512")
ONNX_BATCHES = (2, 16)


def _adam() -> Any:
    from engine import Adam

    return Adam(lr=1e-3)


def _mlp(sizes: tuple[int, ...], batch: int) -> Callable[[str], Any]:
    def build(device: str) -> Any:
        from engine import compile_graph
        from engine.models import paper_mlp

        return compile_graph(paper_mlp(sizes), batch_size=batch, optimizer=_adam(),
                             device=device)
    return build


def _deep(device: str) -> Any:
    from engine import compile_graph
    from engine.models import deep_mlp

    return compile_graph(deep_mlp(20, 256), batch_size=64, optimizer=_adam(), device=device)


def _cnn(channels: tuple[int, int], batch: int) -> Callable[[str], Any]:
    def build(device: str) -> Any:
        from engine import compile_graph
        from engine.models import mnist_cnn

        return compile_graph(mnist_cnn(channels), batch_size=batch, optimizer=_adam(),
                             device=device)
    return build


def _stack(sizes: tuple[int, ...], k: int, batch: int) -> Callable[[str], Any]:
    def build(device: str) -> Any:
        from engine import Adam, compile_graph
        from engine.compile.stack import stack_graphs, stack_optimizers
        from engine.models import paper_mlp

        graphs = [paper_mlp(sizes) for _ in range(k)]
        opts = [Adam(lr=10 ** -(2 + i / k)) for i in range(k)]  # per-model learning rates
        return compile_graph(stack_graphs(graphs), batch_size=batch,
                             optimizer=stack_optimizers(opts), device=device)
    return build


def _nn_mlp(width: int, batch: int) -> Callable[[str], Any]:
    def build(device: str) -> Any:
        from engine import compile_graph, nn

        nn.manual_seed(0)
        net = nn.Sequential(nn.Linear(784, width), nn.ReLU(), nn.Dropout(0.1),
                            nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))
        g = nn.to_graph(net, inputs={"x": (0, 784)}, loss="cross_entropy")
        return compile_graph(g, batch_size=batch, optimizer=_adam(), device=device)
    return build


def _nn_conv(channels: int, batch: int) -> Callable[[str], Any]:
    def build(device: str) -> Any:
        from engine import compile_graph, nn

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv = nn.Conv2d(1, channels, 3, padding=1)
                self.bn = nn.BatchNorm2d(channels)
                self.pool = nn.MaxPool2d(2)
                self.head = nn.Linear(channels * 14 * 14, 10)

            def forward(self, x: Any) -> Any:
                h = nn.functional.relu(self.bn(self.conv(x.reshape(-1, 1, 28, 28))))
                return self.head(self.pool(h).flatten(1))

        nn.manual_seed(0)
        g = nn.to_graph(Net(), inputs={"x": (0, 784)}, loss="cross_entropy")
        return compile_graph(g, batch_size=batch, optimizer=_adam(), device=device)
    return build


def _onnx(name: str, batch: int) -> Callable[[str], Any]:
    def build(device: str) -> Any:
        import onnx

        from engine import SGD, compile_graph
        from engine.onnx_io import import_onnx
        from engine.onnx_io.light import light_models

        g = import_onnx(onnx.load(light_models()[name]), loss="cross_entropy")
        return compile_graph(g, batch_size=batch, optimizer=SGD(lr=0.01, momentum=0.9),
                             device=device)
    return build


CASES: dict[str, Callable[[str], Any]] = {
    **{name: _mlp(sizes, batch) for name, (sizes, batch) in MLPS.items()},
    "mlp_deep20x256": _deep,
    "cnn_b64": _cnn((8, 16), 64),
    "cnn_wide_b256": _cnn((32, 64), 256),
    "stack8_mlp_paper": _stack((784, 64, 64, 10), 8, 64),
    "stack8_mlp_256x2": _stack((784, 256, 256, 10), 8, 64),
    "nn_mlp_512": _nn_mlp(512, 128),
    "nn_conv_bn": _nn_conv(16, 64),
    **{f"onnx_{m}_b{b}": _onnx(m, b) for m in ONNX_MODELS for b in ONNX_BATCHES},
}

# Tiny cases, one per family but onnx (whose smallest model takes seconds a step on a
# CPU), for a smoke run on the CPU.
SMOKE: dict[str, Callable[[str], Any]] = {
    "mlp_tiny": _mlp((784, 8, 10), 8),
    "cnn_tiny": _cnn((2, 4), 4),
    "stack2_mlp_tiny": _stack((784, 8, 10), 2, 8),
    "nn_mlp_tiny": _nn_mlp(8, 8),
}


def family(case: str) -> str:
    """The family a case belongs to: the prefix of its name (``stack8_...`` is a stack)."""
    head = case.split("_")[0]
    return "stack" if head.startswith("stack") else head


def feed(vm: Any, seed: int = 0) -> None:
    """Fill every placeholder of the program once (random pixels, label 0 — a valid
    class for any classifier), so that steps can run back to back on what is in the
    heap: a steady-state step then moves no data."""
    rng = np.random.default_rng(seed)
    b = vm.program.batch_size
    for buf in vm.program.buffers:
        if buf.kind != "placeholder":
            continue
        shape = tuple(b if d == 0 else d for d in buf.shape)
        if np.dtype(buf.dtype).kind in "iu":
            vm.set(buf.name, np.zeros(shape, dtype=buf.dtype))
        else:
            vm.set(buf.name, rng.random(shape, dtype=np.float32).astype(buf.dtype))
