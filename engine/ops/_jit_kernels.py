"""The fused kernels themselves, compiled by numba (see :mod:`engine.ops.jit`, which
imports this module only once numba has imported).

Each kernel does in one loop what the numpy kernel does in several calls, in the same
order and in the array's own type (``y.dtype.type(1)``, not a Python float, which
numba would widen to float64), so results agree with numpy's to float32 rounding.
Scalars that vary per step (Adam's bias corrections) arrive in a small array of the
parameters' type, written in place by the caller: nothing is allocated per call.
Transcendental functions stay in numpy where it has SIMD loops, with two exceptions: the
cross-entropy's forward calls ``exp``/``log`` here (its rows are short, and numpy's
per-row reductions cost more than the scalar calls), and float32's ``tanh`` (so also
the sigmoid, ``tanh(x / 2) / 2 + 1/2``) is a rational function here (:func:`tanh1`),
which LLVM vectorises: numpy's float32 tanh is a scalar loop on AVX2 machines, about 3
ns an element, 5-6x the rational one.  It agrees with the exact tanh to 3.3e-7 (6
units in the last place at most, half a unit on average) where numpy's is within 1.4
units, so the float32 tanh and sigmoid are the one place the two kinds of kernel
differ by more than float32 rounding; float64 keeps numpy's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

numba: Any
try:
    import numba
except Exception:  # never used then: jit.kernels() returns None
    numba = None


def _jit(f: Any) -> Any:
    if numba is None:
        return f
    return numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)(f)


def _jit_sum(f: Any) -> Any:
    """A reduction allowed to reassociate its additions, so that LLVM keeps one partial
    sum per vector lane (a float sum in strict order does not vectorise): 8-10x faster
    than numpy's sum over the non-adjacent axes of a bias gradient, and no less exact
    than numpy's pairwise order (many partial sums, not one running one)."""
    if numba is None:
        return f
    return numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False,
                      fastmath={"reassoc"})(f)


def _jit_poly(f: Any) -> Any:
    """A kernel whose polynomials may use fused multiply-adds (LLVM's ``contract``):
    the rational tanh's error bound was measured with them, and they halve its time."""
    if numba is None:
        return f
    return numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False,
                      fastmath={"contract"})(f)


def _inline(f: Any) -> Any:
    if numba is None:
        return f
    return numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False,
                      fastmath={"contract"}, inline="always")(f)


# The rational tanh of Eigen and onnxruntime (MLAS): an odd polynomial of degree 13 over
# an even one of degree 6, fitted on [-9, 9].  Past 9 float32's tanh is +-1; the clamp
# of the quotient keeps it there (it reaches 1 + 2 ulp near 9) and lets NaN through.
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
           5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
           4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
           4.89352518554385e-03)
_P0, _P1, _P2, _P3, _P4, _P5, _P6 = (np.float32(c) for c in _TANH_P)
_Q0, _Q1, _Q2, _Q3 = (np.float32(c) for c in _TANH_Q)
_NINE, _ONE, _TINY = np.float32(9.0), np.float32(1.0), np.float32(4e-4)
_HALF = np.float32(0.5)


@_inline
def tanh1(x: Any) -> Any:
    """float32 tanh of one value, as branch-free selects LLVM vectorises (NaN stays NaN,
    +-inf gives +-1, and below 4e-4 in magnitude tanh(x) is x to float32 rounding)."""
    v = _NINE if x > _NINE else x
    v = -_NINE if v < -_NINE else v
    v2 = v * v
    p = v2 * _P0 + _P1
    p = v2 * p + _P2
    p = v2 * p + _P3
    p = v2 * p + _P4
    p = v2 * p + _P5
    p = v2 * p + _P6
    q = v2 * _Q0 + _Q1
    q = v2 * q + _Q2
    q = v2 * q + _Q3
    r = v * p / q
    r = _ONE if r > _ONE else r
    r = -_ONE if r < -_ONE else r
    return x if abs(x) < _TINY else r


@_inline
def sigmoid1(x: Any) -> Any:
    """float32 sigmoid of one value, tanh(x / 2) / 2 + 1/2: no overflow for large |x|."""
    return tanh1(x * _HALF) * _HALF + _HALF


@_jit_poly
def tanh(x: Any, y: Any) -> None:
    """y = tanh(x) over float32 1-D views (:func:`tanh1`)."""
    for i in range(x.size):
        y[i] = tanh1(x[i])


@_jit_poly
def tanh_in_place(y: Any) -> None:
    """y = tanh(y): the in-place form, which LLVM vectorises where the two-array one,
    given the same array twice, fails its overlap check and runs scalar (10x slower)."""
    for i in range(y.size):
        y[i] = tanh1(y[i])


@_jit_poly
def sigmoid_in_place(y: Any) -> None:
    """y = sigmoid(y), the in-place form (see :func:`tanh_in_place`)."""
    for i in range(y.size):
        y[i] = sigmoid1(y[i])


@_jit_poly
def sigmoid(x: Any, y: Any) -> None:
    """y = sigmoid(x) over float32 1-D views (:func:`sigmoid1`)."""
    for i in range(x.size):
        y[i] = sigmoid1(x[i])


@_jit_poly
def bias_sigmoid(y: Any, b: Any) -> None:
    """y = sigmoid(y + b) over the rows of a 2-D float32 y: a Linear layer's bias and
    its activation in one pass."""
    n, m = y.shape
    for i in range(n):
        for j in range(m):
            y[i, j] = sigmoid1(y[i, j] + b[j])


@_jit_poly
def bias_tanh(y: Any, b: Any) -> None:
    """y = tanh(y + b) over the rows of a 2-D float32 y."""
    n, m = y.shape
    for i in range(n):
        for j in range(m):
            y[i, j] = tanh1(y[i, j] + b[j])


# -- activations and their gradients (1-D views) ---------------------------------------


@_jit
def sigmoid_grad(y: Any, dy: Any, dx: Any) -> None:
    one = y.dtype.type(1)
    for i in range(y.size):
        dx[i] = (one - y[i]) * y[i] * dy[i]


@_jit
def tanh_grad(y: Any, dy: Any, dx: Any) -> None:
    one = y.dtype.type(1)
    for i in range(y.size):
        dx[i] = (one - y[i] * y[i]) * dy[i]


@_jit
def relu_grad(y: Any, dy: Any, dx: Any) -> None:
    for i in range(y.size):
        dx[i] = np.sign(y[i]) * dy[i]


# The same three gradients written over one of their inputs (an op run in place): given
# one array twice, the loops above fail LLVM's overlap check and run scalar, 1.3-2.5x
# slower on a large tensor.


@_jit
def sigmoid_grad_over_y(y: Any, dy: Any) -> None:
    one = y.dtype.type(1)
    for i in range(y.size):
        y[i] = (one - y[i]) * y[i] * dy[i]


@_jit
def sigmoid_grad_over_dy(y: Any, dy: Any) -> None:
    one = y.dtype.type(1)
    for i in range(y.size):
        dy[i] = (one - y[i]) * y[i] * dy[i]


@_jit
def tanh_grad_over_y(y: Any, dy: Any) -> None:
    one = y.dtype.type(1)
    for i in range(y.size):
        y[i] = (one - y[i] * y[i]) * dy[i]


@_jit
def tanh_grad_over_dy(y: Any, dy: Any) -> None:
    one = y.dtype.type(1)
    for i in range(y.size):
        dy[i] = (one - y[i] * y[i]) * dy[i]


@_jit
def relu_grad_over_y(y: Any, dy: Any) -> None:
    for i in range(y.size):
        y[i] = np.sign(y[i]) * dy[i]


@_jit
def relu_grad_over_dy(y: Any, dy: Any) -> None:
    for i in range(y.size):
        dy[i] = np.sign(y[i]) * dy[i]


@_jit
def half(x: Any, y: Any) -> None:
    """y = x / 2: a sigmoid's argument for numpy's tanh (float64)."""
    h = x.dtype.type(0.5)
    for i in range(x.size):
        y[i] = x[i] * h


@_jit
def half_plus_half(y: Any) -> None:
    """y = y / 2 + 1/2: a sigmoid from tanh(x / 2)."""
    h = y.dtype.type(0.5)
    for i in range(y.size):
        y[i] = y[i] * h + h


@_jit
def bias_half(y: Any, b: Any) -> None:
    """y = (y + b) / 2 over the rows of a 2-D y: a Linear layer's bias, then a
    sigmoid's argument for tanh."""
    h = y.dtype.type(0.5)
    n, m = y.shape
    for i in range(n):
        for j in range(m):
            y[i, j] = (y[i, j] + b[j]) * h


@_jit
def bias_relu(y: Any, b: Any) -> None:
    """y = max(y + b, 0) over the rows of a 2-D y (NaN stays NaN, as numpy's maximum)."""
    z = y.dtype.type(0)
    n, m = y.shape
    for i in range(n):
        for j in range(m):
            v = y[i, j] + b[j]
            y[i, j] = z if v < z else v


@_jit
def column_sums(x: Any, out: Any) -> None:
    """out[j] = sum over rows of x[:, j], row by row: numpy's order for an axis-0 sum."""
    n, m = x.shape
    for j in range(m):
        out[j] = x[0, j]
    for i in range(1, n):
        for j in range(m):
            out[j] += x[i, j]


@_jit_sum
def outer_inner_sums(x: Any, out: Any, scale: Any) -> None:
    """out[j] = scale * the sum of x[:, j, :], x being [A, B, C]: a reduction over the
    axes before and after a kept block (a convolution's bias gradient, over N, H and
    W)."""
    a, b, c = x.shape
    z = x.dtype.type(0)
    for j in range(b):
        out[j] = z
    for i in range(a):
        for j in range(b):
            s = z
            for k in range(c):
                s += x[i, j, k]
            out[j] += s
    if scale != 1:
        for j in range(b):
            out[j] *= scale


# -- softmax cross-entropy (2-D scores, integer labels) -------------------------------


@_jit
def sce_forward(x: Any, labels: Any, logp: Any, loss: Any, scale: float) -> int:
    """logp = log_softmax(x) by rows; loss[0] = scale * sum of the labelled logp.
    Returns how many labels lie outside [0, C) (the caller raises)."""
    n, c = x.shape
    zero = x.dtype.type(0)
    bad = 0
    total = 0.0
    for i in range(n):
        m = x[i, 0]
        for j in range(1, c):
            if x[i, j] > m:
                m = x[i, j]
        s = zero
        for j in range(c):
            s += math.exp(x[i, j] - m)
        ls = math.log(s)
        for j in range(c):
            logp[i, j] = (x[i, j] - m) - ls
        k = labels[i]
        if k < 0 or k >= c:
            bad += 1
        else:
            total += logp[i, k]
    loss[0] = x.dtype.type(total) * x.dtype.type(scale)
    return bad


@_jit
def sce_grad(dx: Any, labels: Any, dloss: Any, inv: float) -> None:
    """dx = (dx - onehot(labels)) * dloss * inv, by rows, where dx holds the softmax
    (numpy's SIMD exp of log_prob: numba's scalar exp would cost 3x this pass)."""
    n, c = dx.shape
    one = dx.dtype.type(1)
    k = dx.dtype.type(dloss[0] * inv)
    for i in range(n):
        lab = labels[i]
        for j in range(c):
            e = dx[i, j]
            if j == lab:
                e -= one
            dx[i, j] = e * k


@_jit
def stacked_sce_forward(x: Any, labels: Any, logp: Any, loss: Any, scale: float) -> int:
    """:func:`sce_forward` for each model of a stack: ``x`` and ``logp`` are
    ``[b, K, C]``, ``loss[k]`` is ``scale`` times the sum of model k's labelled logp
    (summed in float64, model by model).  Returns how many labels lie outside [0, C)."""
    b, m, c = x.shape
    zero = x.dtype.type(0)
    bad = 0
    for k in range(m):
        total = 0.0
        for i in range(b):
            top = x[i, k, 0]
            for j in range(1, c):
                if x[i, k, j] > top:
                    top = x[i, k, j]
            s = zero
            for j in range(c):
                s += math.exp(x[i, k, j] - top)
            ls = math.log(s)
            for j in range(c):
                logp[i, k, j] = (x[i, k, j] - top) - ls
            lab = labels[i]
            if lab < 0 or lab >= c:
                bad += 1
            else:
                total += logp[i, k, lab]
        loss[k] = x.dtype.type(total) * x.dtype.type(scale)
    return bad


@_jit
def stacked_sce_grad(dx: Any, labels: Any, dloss: Any, inv: float) -> None:
    """:func:`sce_grad` for each model of a stack: ``dx`` ``[b, K, C]`` holds the
    softmax; model k's rows are scaled by ``dloss[k] * inv``."""
    b, m, c = dx.shape
    one = dx.dtype.type(1)
    for i in range(b):
        lab = labels[i]
        for k in range(m):
            f = dx.dtype.type(dloss[k] * inv)
            for j in range(c):
                e = dx[i, k, j]
                if j == lab:
                    e -= one
                dx[i, k, j] = e * f


# -- optimizer updates over the flat parameter region ---------------------------------
# ``c`` holds the scalars in the parameters' type; ``lr`` holds a rate per parameter
# (a stack of models, engine.runtime.optim.PerModelLR) unless ``one``: then the one
# rate is folded into ``c``.  So does SGD's ``mus`` its momentum, unless ``one_mu``.


@_jit
def sgd(p: Any, g: Any, buf: Any, lr: Any, one: bool, c: Any, momentum: bool,
        nesterov: bool, mus: Any, one_mu: bool) -> None:
    # c: [lr (scalar case), mu (scalar case), wd, mu * lr (both scalar)]
    wd = c[2]
    for i in range(p.size):
        gi = g[i]
        if wd != 0:
            gi = gi + p[i] * wd
            g[i] = gi
        r = c[0] if one else lr[i]
        if not momentum:
            p[i] = p[i] - gi * r
            continue
        mu = c[1] if one_mu else mus[i]
        b = buf[i] * mu + gi
        buf[i] = b
        if nesterov:
            q = p[i] - gi * r
            p[i] = q - (b * c[3] if one and one_mu else b * r * mu)
        else:
            p[i] = p[i] - b * r


@_jit
def adam(p: Any, g: Any, m: Any, v: Any, lr: Any, one: bool, c: Any, decoupled: bool) -> None:
    # c: [b1, b2, eps / k, step (coef * lr, or coef), wd, 1 - lr * wd, wd * (array lr)]
    b1, b2, eps, step, wd = c[0], c[1], c[2], c[3], c[4]
    for i in range(p.size):
        gi = g[i]
        pi = p[i]
        if wd != 0:
            if decoupled:
                pi = pi * c[5] if one else pi - pi * lr[i] * wd
            else:
                gi = gi + pi * wd
                g[i] = gi
        mi = m[i] * b1 + gi
        vi = v[i] * b2 + gi * gi
        m[i] = mi
        v[i] = vi
        s = mi / (math.sqrt(vi) + eps)
        p[i] = pi - (s * step if one else s * lr[i] * step)


@_jit
def rmsprop(p: Any, g: Any, sq: Any, buf: Any, lr: Any, one: bool, c: Any,
            momentum: bool) -> None:
    # c: [alpha, eps / k, mu, step (lr / k, or 1 / k)]
    alpha, eps, mu, step = c[0], c[1], c[2], c[3]
    for i in range(p.size):
        gi = g[i]
        si = sq[i] * alpha + gi * gi
        sq[i] = si
        d = gi / (math.sqrt(si) + eps)
        if momentum:
            d = buf[i] * mu + d
            buf[i] = d
        p[i] = p[i] - (d * step if one else d * lr[i] * step)


@_jit
def adagrad(p: Any, g: Any, acc: Any, lr: Any, one: bool, c: Any) -> None:
    # c: [eps, lr (scalar case)]
    eps = c[0]
    for i in range(p.size):
        gi = g[i]
        a = acc[i] + gi * gi
        acc[i] = a
        d = gi / (math.sqrt(a) + eps)
        p[i] = p[i] - d * (c[1] if one else lr[i])


# -- pooling -----------------------------------------------------------------------------


@_jit
def max_pool_grad_2d(x: Any, y: Any, dy: Any, dx: Any, kh: int, kw: int, sh: int, sw: int,
                     dh: int, dw: int, ph: int, pw: int) -> None:
    """dX of a 2-D max pooling in one pass: each window's dY to its first maximum (in
    the order the numpy kernel visits the window), nothing where that maximum is a
    padding cell.  ``dx`` is zeroed here."""
    n, c, h, w = x.shape
    oh, ow = y.shape[2], y.shape[3]
    fill = -np.inf
    for a in range(n):
        for b in range(c):
            for i in range(h):
                for j in range(w):
                    dx[a, b, i, j] = 0
            for p in range(oh):
                for q in range(ow):
                    top = y[a, b, p, q]
                    found = False
                    for u in range(kh):
                        r = p * sh + u * dh - ph
                        for v in range(kw):
                            s = q * sw + v * dw - pw
                            inside = 0 <= r < h and 0 <= s < w
                            value = x[a, b, r, s] if inside else fill
                            if value == top:
                                if inside:
                                    dx[a, b, r, s] += dy[a, b, p, q]
                                found = True
                                break
                        if found:
                            break


@_jit
def _planes(x: Any, y: Any, dy: Any, dx: Any) -> Any:
    """A pooling's four arrays as stacks of 2-D planes, one per image and channel."""
    n, c, h, w = x.shape
    oh, ow = y.shape[2], y.shape[3]
    return (x.reshape(n * c, h, w), y.reshape(n * c, oh, ow), dy.reshape(n * c, oh, ow),
            dx.reshape(n * c, h, w))


@_jit
def max_pool_grad_tiled(x: Any, y: Any, dy: Any, dx: Any, kh: int, kw: int) -> None:
    """:func:`max_pool_grad_2d` for windows that tile the input (stride = kernel, no
    padding, no dilation; the 2x2 pooling of most CNNs): each input cell is in at most
    one window, so every cell is written once, the zeros with it, and the loop has no
    branch (a window's "not found yet" is a number, 1 or 0)."""
    n, c, h, w = x.shape
    oh, ow = y.shape[2], y.shape[3]
    zero, one = dx.dtype.type(0), dx.dtype.type(1)
    xs, ys, gs, ds = _planes(x, y, dy, dx)
    for a in range(n * c):
        for i in range(oh * kh, h):  # rows no window reaches
            for j in range(w):
                ds[a, i, j] = zero
        for p in range(oh):
            for u in range(kh):
                for j in range(ow * kw, w):
                    ds[a, p * kh + u, j] = zero
            for q in range(ow):
                top = ys[a, p, q]
                g = gs[a, p, q]
                free = one
                for u in range(kh):
                    for v in range(kw):
                        e = free if xs[a, p * kh + u, q * kw + v] == top else zero
                        ds[a, p * kh + u, q * kw + v] = e * g
                        free -= e


# The 2x2 pooling of most CNNs, windows tiling the input: each output row reads two
# input rows as slices, and the window is four named values, so LLVM vectorises the
# row (stride-2 loads); 3x faster than numpy's three maximum calls over strided views
# and 2x faster than the general tiled loop above (measured on the MNIST CNN's two
# poolings, docs/measurements.md).  ``x`` may be taller or wider than 2·oH, 2·oW (a
# floored pooling): the cells past the last window get zero gradient.


@_jit
def max_pool_2x2(x: Any, y: Any) -> None:
    n, c, h, w = x.shape
    oh, ow = y.shape[2], y.shape[3]
    xs = x.reshape(n * c, h, w)
    ys = y.reshape(n * c, oh, ow)
    for a in range(n * c):
        for p in range(oh):
            r0, r1, out = xs[a, 2 * p], xs[a, 2 * p + 1], ys[a, p]
            for q in range(ow):
                a0, a1, b0, b1 = r0[2 * q], r0[2 * q + 1], r1[2 * q], r1[2 * q + 1]
                top = max(max(a0, a1), max(b0, b1))
                # numpy's maximum propagates NaN, max() does not: the sum is NaN then
                nan = (a0 != a0) | (a1 != a1) | (b0 != b0) | (b1 != b1)
                out[q] = a0 + a1 + b0 + b1 if nan else top


@_jit
def max_pool_grad_2x2(x: Any, y: Any, dy: Any, dx: Any) -> None:
    """:func:`max_pool_grad_tiled` for 2x2 windows: the first maximum in the window's
    row-major order takes dY, as there."""
    n, c, h, w = x.shape
    oh, ow = y.shape[2], y.shape[3]
    zero, one = dx.dtype.type(0), dx.dtype.type(1)
    xs, ys, gs, ds = _planes(x, y, dy, dx)
    for a in range(n * c):
        for i in range(oh * 2, h):  # rows no window reaches
            for j in range(w):
                ds[a, i, j] = zero
        for p in range(oh):
            r0, r1, d0, d1 = xs[a, 2 * p], xs[a, 2 * p + 1], ds[a, 2 * p], ds[a, 2 * p + 1]
            top, g = ys[a, p], gs[a, p]
            for j in range(ow * 2, w):
                d0[j] = zero
                d1[j] = zero
            for q in range(ow):
                t, gq = top[q], g[q]
                ea = one if r0[2 * q] == t else zero
                eb = (one if r0[2 * q + 1] == t else zero) * (one - ea)
                ec = (one if r1[2 * q] == t else zero) * (one - ea - eb)
                d0[2 * q] = gq * ea
                d0[2 * q + 1] = gq * eb
                d1[2 * q] = gq * ec
                ed = (one - ea - eb - ec) if t == t else zero  # a NaN maximum: none
                d1[2 * q + 1] = gq * ed


# -- products of mostly-zero data (a stack's first layer on pixels) --------------------


def _jit_parallel(f: Any) -> Any:
    if numba is None:
        return f
    return numba.njit(cache=True, nogil=True, parallel=True, error_model="numpy",
                      boundscheck=False)(f)


@_jit
def sparse_rows_product(x: Any, w: Any, y: Any, first: int, last: int) -> None:
    """``y[i] = x[i] @ w`` for rows ``first..last-1``, skipping ``x``'s zeros: each
    nonzero ``x[i, p]`` adds ``x[i, p] * w[p]`` to ``y[i]`` (``w``'s rows contiguous, the
    sum in ``p``'s order)."""
    n = w.shape[1]
    zero = y.dtype.type(0)
    for i in range(first, last):  # 2-D indexing: LLVM vectorises it, not row views
        for j in range(n):
            y[i, j] = zero
        for p in range(x.shape[1]):
            v = x[i, p]
            if v != zero:
                for j in range(n):
                    y[i, j] += v * w[p, j]


@_jit
def sparse_rows_weight_grad(x: Any, dy: Any, dw: Any, first: int, last: int) -> None:
    """``dw[p] = x[:, p] @ dy`` for rows ``first..last-1`` of ``dw`` (``x^T dy``),
    skipping ``x``'s zeros (the sum in the batch's order)."""
    n = dw.shape[1]
    zero = dw.dtype.type(0)
    for p in range(first, last):
        for j in range(n):
            dw[p, j] = zero
        for i in range(x.shape[0]):
            v = x[i, p]
            if v != zero:
                for j in range(n):
                    dw[p, j] += v * dy[i, j]


@_jit_parallel
def sparse_rows_product_parallel(x: Any, w: Any, y: Any, parts: int) -> None:
    """:func:`sparse_rows_product` over all rows, in ``parts`` blocks of rows run on
    numba's threads."""
    rows = x.shape[0]
    for t in numba.prange(parts):
        sparse_rows_product(x, w, y, t * rows // parts, (t + 1) * rows // parts)


@_jit_parallel
def sparse_rows_weight_grad_parallel(x: Any, dy: Any, dw: Any, parts: int) -> None:
    """:func:`sparse_rows_weight_grad` over all of ``dw``, in ``parts`` blocks of rows."""
    rows = dw.shape[0]
    for t in numba.prange(parts):
        sparse_rows_weight_grad(x, dy, dw, t * rows // parts, (t + 1) * rows // parts)
