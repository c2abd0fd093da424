"""Conv taken a few images at a time on the CPU (its columns for a chunk of the batch,
the workspace reused chunk after chunk: :func:`engine.ops.conv.images_per_chunk`) gives
what the whole batch at once gives, forward and both gradients, under both GEMM layouts,
with the workspace sized for one chunk and the heap exact."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ops import conv
from tests.gradcheck import Case, build, loss_value

R = np.random.default_rng(5)

GEOMETRIES = [  # (x, w, attrs): wide and narrow rows, groups, strides, no padding
    ((5, 8, 7, 6), (5, 8, 3, 3), {"pads": (1, 1, 1, 1)}),
    ((7, 3, 9, 9), (4, 3, 3, 2), {"pads": (0, 2, 1, 0)}),
    ((4, 4, 10, 9), (6, 2, 3, 3), {"group": 2, "dilations": (2, 1), "pads": (2, 1, 2, 1)}),
    ((5, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "pads": (1, 1, 1, 1)}),  # depthwise
    ((6, 3, 8, 8), (4, 3, 3, 3), {}),  # no padding: the input chunk itself is read
    ((5, 8, 9, 9), (4, 8, 3, 3), {"strides": (2, 2), "pads": (1, 1, 1, 1)}),  # narrow
]


def _run(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: dict
         ) -> tuple[float, dict[str, np.ndarray], int]:
    """The checked scalar, the gradients of x, w and b, and the workspace bytes."""
    vm, params = build(Case("Conv", [x, w, b], attrs))
    assert vm.allocated_bytes == vm.program.total_bytes
    loss = loss_value(vm, vm.rng.bit_generator.state)
    vm.apply_loss(0)
    vm.backward(0)
    return loss, {p: vm.grad(p) for p in params}, vm.program.zone_bytes["workspace"]


@pytest.mark.parametrize("layout", ["im2col/tn", "im2col/nt"])
@pytest.mark.parametrize("x_shape, w_shape, attrs", GEOMETRIES)
def test_chunks_of_images_match_the_whole_batch(x_shape: tuple, w_shape: tuple, attrs: dict,
                                               layout: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    x = R.normal(size=x_shape)
    w = R.normal(size=w_shape)
    b = R.normal(size=w_shape[0])
    attrs = {**attrs, "algorithm": layout}
    whole, grads_whole, ws_whole = _run(x, w, b, attrs)
    geo = conv.conv_geometry(x_shape, w_shape, {**conv.CONV_ATTRS, **attrs})
    # two images' columns at most: chunks of 2, the last of one where the batch is odd
    per_image = geo["c"] * geo["k"][0] * geo["k"][1] * geo["out"][0] * \
        conv.row_width(geo, conv.wide_rows("Conv", geo)) * x.dtype.itemsize
    monkeypatch.setattr(conv, "CHUNK_BYTES", 2 * per_image)
    assert conv.images_per_chunk("Conv", geo, x_shape[0], x.dtype.itemsize, "cpu") == 2
    loss, grads, ws = _run(x, w, b, attrs)
    assert loss == pytest.approx(whole, rel=1e-12)
    for name, g in grads.items():
        np.testing.assert_allclose(g, grads_whole[name], rtol=1e-10, atol=1e-12, err_msg=name)
    assert ws < ws_whole  # the workspace holds a chunk, not the batch


def test_a_chunk_is_as_many_images_as_the_bytes_allow_and_never_on_a_gpu() -> None:
    geo = conv.conv_geometry((64, 32, 14, 14), (32, 32, 5, 5),
                             {**conv.CONV_ATTRS, "pads": (2, 2, 2, 2)})
    per_image = 32 * 25 * 14 * 18 * 4  # wide rows of 18
    fit = conv.CHUNK_BYTES // per_image
    per = conv.images_per_chunk("Conv", geo, 64, 4, "cpu")
    assert per <= fit and len(conv.chunks(64, per)) == -(-64 // fit)  # as few as fit
    sizes = [hi - lo for lo, hi in conv.chunks(64, per)]
    assert max(sizes) - min(sizes) < len(sizes)  # alike in size: no small last chunk
    assert conv.images_per_chunk("Conv", geo, 64, 4, "gpu") == 64
    small = conv.conv_geometry((64, 1, 28, 28), (8, 1, 3, 3),
                               {**conv.CONV_ATTRS, "pads": (1, 1, 1, 1)})
    assert conv.images_per_chunk("Conv", small, 64, 4, "cpu") == 64  # one chunk, as before
    huge = conv.conv_geometry((2, 512, 64, 64), (8, 512, 3, 3), dict(conv.CONV_ATTRS))
    assert conv.images_per_chunk("ConvGradWeight", huge, 2, 4, "cpu") == 1
