"""Conv taken a few images at a time on the CPU (its columns for a chunk of the batch,
the workspace reused chunk after chunk: :func:`engine.ops.conv.images_per_chunk`) gives
what the whole batch at once gives, forward and both gradients, under both GEMM layouts,
with the workspace sized for one chunk and the heap exact."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ops import conv
from tests.gradcheck import Case, loss_grads_workspace

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
    return loss_grads_workspace(Case("Conv", [x, w, b], attrs))


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
    for op in ("ConvGradWeight", "ConvGradInput"):  # narrow rows: as many, or one more
        assert conv.images_per_chunk(op, geo, x_shape[0], x.dtype.itemsize, "cpu") < \
            x_shape[0] - 1, op
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


def _trained(batches: list[int], images: int | None, monkeypatch: pytest.MonkeyPatch
             ) -> tuple[list[np.ndarray], int]:
    """A float32 program compiled for a batch of 6 (a 3x3 convolution of 4 channels to
    5 at 8x8, its input a parameter's product so that its input gradient is taken too),
    one SGD step at each batch size given: the parameters after them, and the
    workspace.  ``images``: the most images a chunk's columns may hold (None: all)."""
    from engine import SGD, VM, CalcGraph, Init, Mode, compile_graph

    geo = conv.conv_geometry((6, 4, 8, 8), (5, 4, 3, 3),
                             {**conv.CONV_ATTRS, "pads": (1, 1, 1, 1)})
    assert all(conv.wide_rows(op, geo) for op in ("Conv", "ConvGradWeight", "ConvGradInput"))
    per_image = 4 * 9 * 8 * 10 * 4  # every op's rows are 10 wide: one figure for all
    monkeypatch.setattr(conv, "CHUNK_BYTES", (images or 1000) * per_image)
    g = CalcGraph()
    x = g.placeholder("x", (0, 4, 8, 8))
    y = g.placeholder("y", (0,), dtype="int64")
    s0 = g.parameter("s0", (4, 4, 1, 1), init=Init.normal(0.0, 0.5))
    w = g.parameter("w", (5, 4, 3, 3), init=Init.he_uniform())
    wf = g.parameter("wf", (5 * 64, 3), init=Init.he_uniform())
    p = g.path("train", Mode.BACKWARD_ENABLED)
    t = p.Conv(p.Conv(x, s0), w, pads=(1, 1, 1, 1))
    loss, _ = p.SoftmaxCrossEntropyLoss(p.MatMul(p.Reshape(t, shape=(0, 320)), wf), y,
                                        outputs=["loss", "log_prob"])
    p.set_loss(loss)
    vm = VM(compile_graph(g, batch_size=6, optimizer=SGD(lr=0.1)), seed=3)
    assert vm.allocated_bytes == vm.program.total_bytes
    rng = np.random.default_rng(0)
    for b in batches:
        vm.set("x", rng.random((b, 4, 8, 8), dtype=np.float32))
        vm.set("y", rng.integers(0, 3, b))
        vm.train_step("train")
    return [vm.get(name).copy() for name in ("s0", "w", "wf")], \
        vm.program.zone_bytes["workspace"]


def test_every_batch_up_to_the_compiled_one_binds_within_the_workspace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled for 6 images with 5 to a chunk (6 goes as 3 and 3), a batch of 5 binds as
    one chunk of 5: the workspace holds the largest chunk any batch up to 6 binds, and
    each batch trains as the whole batch at once does."""
    batches = [6, 5, 4, 3, 2, 1, 6]
    chunked, ws = _trained(batches, 5, monkeypatch)
    whole, ws_whole = _trained(batches, None, monkeypatch)
    for a, b in zip(chunked, whole, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    assert ws < ws_whole
