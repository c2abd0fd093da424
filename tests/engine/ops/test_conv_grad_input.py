"""Conv's input gradient at stride 1 taken as a convolution of dY with the flipped
kernel (:func:`engine.ops.conv.transposed_conv`): equal to the definition summed term by
term, and to col2im's form, for drawn geometries (groups, dilations, uneven pads, chunks
of images), within the workspace its rule declares; where the form does not apply
(strides, pads wider than the kernel, a GPU), col2im runs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.graph import DType, TensorDesc
from engine.ops import conv
from engine.ops._base import KernelArgs


def by_definition(w: np.ndarray, dy: np.ndarray, x_shape: tuple[int, ...],
                  geo: dict[str, Any]) -> np.ndarray:
    """dX[n, c, y, x] = Σ dY[n, m, o, q] · W[m, c', i, j] over the outputs (o, q) whose
    window reads (y, x) through kernel position (i, j), term by term."""
    dx = np.zeros(x_shape)
    g, (kh, kw), (sh, sw), (dh, dw) = geo["group"], geo["k"], geo["s"], geo["d"]
    top, left = geo["pads"][0], geo["pads"][1]
    mg, cg = geo["m"] // g, geo["cg"]
    for i in range(kh):
        for j in range(kw):
            for o in range(geo["out"][0]):
                for q in range(geo["out"][1]):
                    y, x = o * sh + i * dh - top, q * sw + j * dw - left
                    if not (0 <= y < x_shape[2] and 0 <= x < x_shape[3]):
                        continue
                    for gi in range(g):
                        ms, cs = slice(gi * mg, (gi + 1) * mg), slice(gi * cg, (gi + 1) * cg)
                        dx[:, cs, y, x] += dy[:, ms, o, q] @ w[ms, :, i, j]
    return dx


def grad_input(w: np.ndarray, dy: np.ndarray, x_shape: tuple[int, ...],
               attrs: dict[str, Any], col2im: bool = False, compiled: int | None = None
               ) -> tuple[np.ndarray, int]:
    """ConvGradInput's kernel (or its col2im form) run in a workspace of exactly the
    bytes its rule declares for a batch of ``compiled`` (default: this one's), the
    bytes past it poisoned; (dX, those bytes)."""
    attrs = {**conv.CONV_ATTRS, **attrs, "x_shape": x_shape}
    planned = (compiled or x_shape[0], *x_shape[1:])
    f = lambda shape: TensorDesc(DType.FLOAT64, shape)  # noqa: E731
    if col2im:
        nbytes = sum(conv._grad_input_parts(planned, w.shape, attrs, 8, "cpu")[:3])
    else:
        dy_planned = (planned[0], *dy.shape[1:])
        nbytes = conv._grad_input_ws([f(w.shape), f(dy_planned)], [f(planned)], attrs, "cpu")
    ws = np.full(nbytes + 64, 0xFF, np.uint8)
    dx = np.full(x_shape, np.nan)
    k = KernelArgs(xp=np, ins=[w, dy], outs=[dx], ws=ws[:nbytes], attrs=attrs)
    (conv._grad_input_col2im if col2im else conv._conv_grad_input)(k)()
    assert (ws[nbytes:] == 0xFF).all()
    return dx, nbytes


@st.composite
def geometries(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]:
    g = draw(st.sampled_from([1, 1, 2, 3]))
    cg = draw(st.integers(1, 3))
    mg = draw(st.integers(1, 2 * cg))  # at most twice the channels: the form applies
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = tuple(draw(st.integers(0, d * (k - 1))) for d, k in ((dh, kh), (dw, kw)) * 2)
    pads = (pads[0], pads[1], pads[2], pads[3])
    auto = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    low = (1, 1) if auto != "NOTSET" and auto != "VALID" else \
        (dh * (kh - 1) + 1 - (pads[0] + pads[2]) * (auto == "NOTSET"),
         dw * (kw - 1) + 1 - (pads[1] + pads[3]) * (auto == "NOTSET"))
    h, wd = draw(st.integers(max(1, low[0]), 9)), draw(st.integers(max(1, low[1]), 9))
    n = draw(st.integers(1, 5))
    attrs: dict[str, Any] = {"group": g, "dilations": (dh, dw), "auto_pad": auto}
    if auto == "NOTSET":
        attrs["pads"] = pads
    return (n, g * cg, h, wd), (g * mg, cg, kh, kw), attrs


@settings(max_examples=80, deadline=None)
@given(geometries(), st.sampled_from([None, 1, 2]), st.integers(0, 3))
def test_the_transposed_convolution_is_the_input_gradient(
        case: tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]], chunk: int | None,
        fewer: int) -> None:
    """Against the definition, whole or ``chunk`` images of dY's columns at a time (the
    last chunk smaller where they do not divide the batch), in a workspace planned for
    a batch ``fewer`` images larger than the one bound (a program's last mini-batch)."""
    x_shape, w_shape, attrs = case
    geo = conv.conv_geometry(x_shape, w_shape, attrs)
    if min(geo["pads"]) < 0 or conv.transposed_conv(x_shape, w_shape, attrs, "cpu") is None:
        return  # SAME pads wider than the kernel reaches: not this form's
    rng = np.random.default_rng(0)
    w = rng.normal(size=w_shape)
    dy = rng.normal(size=(x_shape[0], geo["m"], *geo["out"]))
    with pytest.MonkeyPatch.context() as mp:
        if chunk is not None:  # a few images at a time, as a large batch goes
            w2, inner = conv.transposed_conv(x_shape, w_shape, attrs, "cpu") or ((), {})
            g2 = conv.conv_geometry(dy.shape, w2, inner)  # dY's columns, an image's bytes
            per_image = g2["c"] * g2["k"][0] * g2["k"][1] * g2["out"][0] * \
                conv.row_width(g2, conv.wide_rows("Conv", g2)) * 8
            mp.setattr(conv, "CHUNK_BYTES", chunk * per_image)
        got, _ = grad_input(w, dy, x_shape, attrs, compiled=x_shape[0] + fewer)
        old, _ = grad_input(w, dy, x_shape, attrs, col2im=True, compiled=x_shape[0] + fewer)
    want = by_definition(w, dy, x_shape, geo)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(old, want, rtol=1e-10, atol=1e-10)


def test_where_the_form_does_not_apply_col2im_runs() -> None:
    x, w = (2, 4, 9, 9), (3, 4, 3, 3)
    assert conv.transposed_conv(x, w, {"strides": (2, 2)}, "cpu") is None
    assert conv.transposed_conv(x, w, {"pads": (3, 1, 1, 1)}, "cpu") is None  # > k - 1
    assert conv.transposed_conv(x, w, {"pads": (1, 1, 1, 1)}, "gpu") is None
    assert conv.transposed_conv(x, (9, 4, 3, 3), {}, "cpu") is None  # M > 2C: col2im
    assert conv.transposed_conv(x, w, {"pads": (2, 2, 2, 2), "dilations": (1, 1)}, "cpu") \
        is not None  # k - 1 itself: dY unpadded
    attrs = {"strides": (2, 2), "pads": (1, 1, 1, 1)}
    geo = conv.conv_geometry(x, w, attrs)
    rng = np.random.default_rng(1)
    wa, dy = rng.normal(size=w), rng.normal(size=(2, 3, *geo["out"]))
    got, _ = grad_input(wa, dy, x, attrs)
    np.testing.assert_allclose(got, by_definition(wa, dy, x, geo), rtol=1e-10, atol=1e-10)


def test_the_cnn_spaces_layers_take_it_in_less_workspace_or_about_as_much() -> None:
    """On the MNIST CNN space's layers the form's workspace (flipped weights, padded dY,
    columns, product) stays within a fifth of col2im's: both take their columns a few
    images at a time (:data:`engine.ops.conv.CHUNK_BYTES`)."""
    for x, w in [((64, 32, 14, 14), (32, 32, 5, 5)), ((64, 32, 7, 7), (16, 32, 5, 5)),
                 ((64, 16, 14, 14), (32, 16, 3, 3)), ((64, 8, 28, 28), (16, 8, 3, 3))]:
        attrs = {**conv.CONV_ATTRS, "pads": ((w[2] - 1) // 2,) * 4, "x_shape": x}
        geo = conv.conv_geometry(x, w, attrs)
        f = lambda shape: TensorDesc(DType.FLOAT32, shape)  # noqa: E731
        ins, outs = [f(w), f((x[0], w[0], *geo["out"]))], [f(x)]
        new = conv._grad_input_ws(ins, outs, attrs, "cpu")
        old = conv._grad_input_ws(ins, outs, attrs, "gpu")  # col2im's rule, at the GPU's
        a, b, c, _, _ = conv._grad_input_parts(x, w, attrs, 4, "cpu")  # chunks, on the CPU
        assert new <= 1.2 * (a + b + c), (x, w, new, a + b + c, old)
