"""The logic of the engine's own CUDA kernels, checked on the CPU: each kernel's body
is ported line for line to Python here and run against the host kernel of the same op
(tests/engine/runtime/test_gpu.py compiles and runs the CUDA source where a GPU is
lent).  What the port checks is the index arithmetic and the order of the sums, the
part a GPU run alone would only show as wrong numbers."""

from __future__ import annotations

import numpy as np
import pytest

from engine import CalcGraph, Mode, compile_graph
from engine.ops import KernelArgs, get_op
from engine.ops.pool import _max_pool_grad, pool_geometry
from engine.runtime.vm import VM


def max_pool_grad_2d(x: np.ndarray, y: np.ndarray, dy: np.ndarray, fill: float,
                     k: tuple[int, int], s: tuple[int, int], d: tuple[int, int],
                     p: tuple[int, int]) -> np.ndarray:
    """engine.ops.pool._MAX_POOL_GRAD_2D, one 'thread' per cell of dX."""
    _n, _c, hh, ww = x.shape
    oh_n, ow_n = y.shape[2:]
    xf, yf, dyf = x.reshape(-1), y.reshape(-1), dy.reshape(-1)
    dx = np.zeros(x.size, x.dtype)
    for i in range(x.size):
        w, h, nc = i % ww, (i // ww) % hh, i // (ww * hh)
        xb, yb = nc * hh * ww, nc * oh_n * ow_n
        acc = x.dtype.type(0)
        for a in range(k[0]):
            t = h + p[0] - a * d[0]
            if t < 0 or t % s[0]:
                continue
            oh = t // s[0]
            if oh >= oh_n:
                continue
            for b in range(k[1]):
                u = w + p[1] - b * d[1]
                if u < 0 or u % s[1]:
                    continue
                ow = u // s[1]
                if ow >= ow_n:
                    continue
                m = yf[yb + oh * ow_n + ow]
                mine = found = False
                for a2 in range(k[0]):
                    if found:
                        break
                    h2 = oh * s[0] - p[0] + a2 * d[0]
                    for b2 in range(k[1]):
                        w2 = ow * s[1] - p[1] + b2 * d[1]
                        inside = 0 <= h2 < hh and 0 <= w2 < ww
                        v = xf[xb + h2 * ww + w2] if inside else fill
                        if v == m:
                            mine, found = (a2 == a and b2 == b), True
                            break
                if mine:
                    acc += dyf[yb + oh * ow_n + ow]
        dx[i] = acc
    return dx.reshape(x.shape)


POOLS = [
    {"kernel_shape": (2, 2), "strides": (2, 2)},
    {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)},  # overlapping windows, padding
    {"kernel_shape": (3, 2), "strides": (2, 1), "dilations": (2, 1)},
    {"kernel_shape": (2, 2), "strides": (2, 2), "ceil_mode": 1},  # a window over the edge
]


@pytest.mark.parametrize("attrs", POOLS, ids=[str(a) for a in POOLS])
@pytest.mark.parametrize("ties", [False, True])
def test_max_pool_grad_kernel_is_the_host_kernel(attrs: dict, ties: bool) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    if ties:  # few values: windows with several maxima, the first keeps dY
        x = np.round(x).astype(np.float32)
    g = CalcGraph()
    path = g.path("p", Mode.FORWARD_ONLY)
    path.MaxPool(g.placeholder("x", x.shape), **attrs, outputs=["y"])
    vm = VM(compile_graph(g, batch_size=2))
    vm.set("x", x)
    vm.forward("p")
    y = vm.get("y")
    dy = rng.standard_normal(y.shape).astype(np.float32)
    full = {**get_op("MaxPoolGrad").attrs, **attrs}
    dx = np.zeros_like(x)
    # the array calls' kernel, whose order of sums the CUDA kernel keeps (bit for bit)
    _max_pool_grad(KernelArgs(np, [x, y, dy], [dx], np.zeros(1 << 20, np.uint8), full))()
    geo = pool_geometry(x.shape, full)
    got = max_pool_grad_2d(x, y, dy, float("-inf"), geo["k"], geo["s"], geo["d"],
                           (geo["pads"][0][0], geo["pads"][1][0]))
    np.testing.assert_array_equal(got, dx)


@pytest.mark.parametrize("per_row", [1, 3])
def test_row_index_kernel_is_the_host_steps(per_row: int) -> None:
    """engine.ops.loss._ROW_INDEX: idx = i * C + labels[i / K] over the flat idx."""
    from engine.ops.loss import row_index_step

    labels = np.array([2, 0, 4, 1], np.int64)
    idx = np.zeros((4, per_row) if per_row > 1 else (4,), np.int64)
    row_index_step(np, idx, labels, 5)()
    port = np.zeros(idx.size, np.int64)
    for i in range(idx.size):  # one 'thread' per element of idx
        port[i] = i * 5 + int(labels[i // per_row])
    np.testing.assert_array_equal(port, idx.reshape(-1))


def test_sce_grad_kernel_is_the_host_kernel() -> None:
    """engine.ops.loss._SCE_GRAD: (exp(logp) - onehot) * (seed * inv), per element."""
    from engine.ops.loss import _sce_grad

    rng = np.random.default_rng(1)
    scores = rng.standard_normal((6, 4))
    logp = scores - np.log(np.exp(scores).sum(1, keepdims=True))
    labels, seed = rng.integers(0, 4, 6), np.array(0.7)
    dx = np.zeros_like(logp)
    ws = np.zeros(1 << 12, np.uint8)
    _sce_grad(KernelArgs(np, [seed, logp, labels], [dx], ws, {"reduction": "mean",
                                                              "ignore_index": None}))()
    i = np.arange(logp.size)
    onehot = (labels[i // 4] == i % 4).astype(float)
    port = ((np.exp(logp.reshape(-1)) - onehot) * (seed * (1 / 6))).reshape(logp.shape)
    np.testing.assert_allclose(port, dx, rtol=1e-12)


def _update(opt: object, device: bool, steps: int = 3) -> np.ndarray:
    """``steps`` updates of a small region: the array calls, or the port of the
    optimizer's CUDA kernel (engine.runtime.optim._DEVICE_UPDATES)."""
    from engine.runtime.optim import SGD, Adam

    rng = np.random.default_rng(2)
    p, grads = rng.standard_normal(8), [rng.standard_normal(8) for _ in range(steps)]
    state = [np.zeros(8) for _ in range(opt.state_slots)]  # type: ignore[attr-defined]
    t = [0]
    g = np.zeros(8)
    if not device:
        step = opt.bind(np, p, g, state, np.zeros(8), t, fused=False)  # type: ignore
    for grad in grads:
        t[0] += 1
        g[:] = grad
        if not device:
            step()
            continue
        if isinstance(opt, Adam):
            m, v = state
            b1, b2, eps, wd = opt.beta1, opt.beta2, opt.eps, opt.weight_decay
            kk = np.sqrt((1 - b2) / (1 - b2 ** t[0]))
            coef, epsk, rate = (1 - b1) / ((1 - b1 ** t[0]) * kk), eps / kk, opt.lr
            gg, pp = g.copy(), p.copy()
            if wd and opt.decoupled:
                pp = pp - rate * wd * pp
            elif wd:
                gg = gg + wd * pp
            m[:] = b1 * m + gg
            v[:] = b2 * v + gg * gg
            p[:] = pp - (m / (np.sqrt(v) + epsk)) * (coef * rate)
        elif isinstance(opt, SGD):
            gg = g + opt.weight_decay * p if opt.weight_decay else g.copy()
            if not opt.momentum:
                p[:] = p - opt.lr * gg
                continue
            buf = state[0]
            buf[:] = opt.momentum * buf + gg
            p[:] = (p - opt.lr * gg - (opt.momentum * opt.lr) * buf if opt.nesterov
                    else p - opt.lr * buf)
    return p


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov", "sgd_wd", "adam", "adam_l2",
                                  "adamw"])
def test_update_kernels_are_the_array_calls(name: str) -> None:
    from engine.runtime.optim import SGD, Adam, AdamW

    opt = {"sgd": SGD(lr=0.1), "momentum": SGD(lr=0.1, momentum=0.9),
           "nesterov": SGD(lr=0.1, momentum=0.9, nesterov=True),
           "sgd_wd": SGD(lr=0.1, momentum=0.5, weight_decay=0.01),
           "adam": Adam(lr=0.01), "adam_l2": Adam(lr=0.01, weight_decay=0.1),
           "adamw": AdamW(lr=0.01, weight_decay=0.1)}[name]
    np.testing.assert_allclose(_update(opt, True), _update(opt, False), rtol=1e-12)


def test_sce_rows_kernel_is_the_host_kernel() -> None:
    """engine.ops.loss._SCE_ROWS: each row's log-softmax and its labelled entry."""
    from engine.ops.loss import _sce

    rng = np.random.default_rng(3)
    x, labels = rng.standard_normal((5, 7)) * 4, rng.integers(0, 7, 5)
    loss, logp = np.zeros(()), np.zeros_like(x)
    _sce(KernelArgs(np, [x, labels], [loss, logp], np.zeros(1 << 12, np.uint8),
                    {"reduction": "mean", "ignore_index": None}))()
    port_logp, picked = np.zeros_like(x), np.zeros(5)
    for i in range(5):  # one 'thread' per row
        m = x[i, 0]
        for v in x[i, 1:]:
            m = v if v > m else m
        shift = m + np.log(sum(np.exp(v - m) for v in x[i]))
        port_logp[i] = x[i] - shift
        picked[i] = port_logp[i, labels[i]]
    np.testing.assert_allclose(port_logp, logp, rtol=1e-12)
    np.testing.assert_allclose(-picked.sum() / 5, loss, rtol=1e-12)
