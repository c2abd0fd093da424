"""Conv's wide rows (stride 1: each kernel position's columns one run of the padded
input, see :mod:`engine.ops.conv`) give what the narrow rows give, forward and both
gradients, with exact memory; where the input is not contiguous they fall back to
narrow rows inside the same workspace."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ops import conv
from tests.gradcheck import Case, loss_grads_workspace

R = np.random.default_rng(11)

GEOMETRIES = [  # (x, w, attrs): every one at stride 1, so the forward is wide
    ((3, 8, 7, 6), (5, 8, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((2, 3, 9, 9), (4, 3, 3, 2), {"pads": (0, 2, 1, 0)}),  # asymmetric pads
    ((2, 4, 10, 9), (6, 2, 3, 3), {"group": 2, "dilations": (2, 1), "pads": (2, 1, 2, 1)}),
    ((2, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "pads": (1, 1, 1, 1)}),  # depthwise
    ((2, 3, 8, 8), (4, 3, 3, 3), {}),  # no padding: the input itself is read in runs
    ((1, 2, 5, 20), (3, 2, 2, 3), {"auto_pad": "SAME_UPPER"}),  # rows over 16
]


def _run(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: dict
         ) -> tuple[float, dict[str, np.ndarray], int]:
    return loss_grads_workspace(Case("Conv", [x, w, b], attrs))


@pytest.mark.parametrize("x_shape, w_shape, attrs", GEOMETRIES)
def test_wide_rows_match_narrow_rows(x_shape: tuple, w_shape: tuple, attrs: dict,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    x = R.normal(size=x_shape)
    w = R.normal(size=w_shape)
    b = R.normal(size=w_shape[0])
    geo = conv.conv_geometry(x_shape, w_shape, {**conv.CONV_ATTRS, **attrs})
    assert conv.wide_rows("Conv", geo)
    loss, grads, ws = _run(x, w, b, attrs)
    monkeypatch.setattr(conv, "wide_rows", lambda op, geo: False)
    loss_n, grads_n, ws_n = _run(x, w, b, attrs)
    assert loss == pytest.approx(loss_n, rel=1e-12)
    for name, g in grads.items():
        np.testing.assert_allclose(g, grads_n[name], rtol=1e-10, atol=1e-12, err_msg=name)
    assert ws > ws_n  # wide rows are Wp/oW longer, and their workspace says so


def test_which_ops_take_wide_rows() -> None:
    def geo(x: tuple, w: tuple, **attrs: object) -> dict:
        return conv.conv_geometry(x, w, {**conv.CONV_ATTRS, **attrs})

    cnn = geo((64, 8, 14, 14), (16, 8, 3, 3), pads=(1, 1, 1, 1))
    assert all(conv.wide_rows(op, cnn) for op in ("Conv", "ConvGradWeight", "ConvGradInput"))
    first = geo((64, 1, 28, 28), (8, 1, 3, 3), pads=(1, 1, 1, 1))
    assert conv.wide_rows("Conv", first)
    assert not conv.wide_rows("ConvGradWeight", first)  # rows of 28: the GEMM dominates
    assert not conv.wide_rows("ConvGradInput", first)  # one channel a group
    head = geo((64, 256, 6, 6), (1024, 256, 6, 6))  # a classifier as a convolution
    assert not conv.wide_rows("Conv", head)  # rows of 6 for 1 output column: 6x the GEMM
    strided = geo((2, 8, 9, 9), (4, 8, 3, 3), strides=(2, 2))
    assert not any(conv.wide_rows(op, strided)
                   for op in ("Conv", "ConvGradWeight", "ConvGradInput"))


def test_a_strided_input_falls_back_to_narrow_rows_in_the_same_workspace() -> None:
    """A view that is not contiguous cannot be read as runs: the narrow columns are
    taken instead, inside the workspace sized for the wide ones."""
    x = R.normal(size=(2, 3, 6, 12)).astype(np.float32)
    geo = conv.conv_geometry((2, 3, 6, 6), (4, 3, 3, 3), dict(conv.CONV_ATTRS))
    view = x[:, :, :, ::2]
    ws = np.zeros(conv._im2col_ws(*_descs(view), dict(conv.CONV_ATTRS), "cpu"), np.uint8)
    step, cols, r, _ = conv._im2col(np, view, ws, geo, 0, wide=True)
    step()
    assert r == geo["out"][1]  # narrow
    windows = np.lib.stride_tricks.sliding_window_view(view, (3, 3), axis=(2, 3))
    expected = windows.transpose(1, 4, 5, 0, 2, 3).reshape(27, -1)
    np.testing.assert_array_equal(cols, expected)


def _descs(x: np.ndarray) -> tuple[list, list]:
    from engine import DType, TensorDesc

    ins = [TensorDesc(DType.FLOAT32, x.shape), TensorDesc(DType.FLOAT32, (4, 3, 3, 3))]
    return ins, [TensorDesc(DType.FLOAT32, (2, 4, 4, 4))]
