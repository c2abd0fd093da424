"""Images kept as uint8: ``quantize`` stores pixels of a known scale exactly, so the
model's ``DequantizeLinear`` sees the same float32 values bit for bit."""

from __future__ import annotations

import numpy as np

from explore.datasets.errors import DataError

QUANTIZE_CHUNK = 1 << 18  # elements converted at a time: the temporaries stay in cache


def quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """``x`` as uint8 pixels ``q`` with ``float32(q) * float32(scale) == x`` exactly (what
    the model's DequantizeLinear computes), or :class:`DataError` if ``x`` is not such
    an image.  Converted a chunk at a time: whole-array temporaries would be three
    float copies of the data set, and take about three times as long.

    >>> quantize(np.array([[0.0, 0.5, 0.99609375]], np.float32), 1 / 256).tolist()
    [[0, 128, 255]]
    """
    s = np.float32(scale)
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    q = np.empty(flat.shape, np.uint8)
    f = np.empty(min(QUANTIZE_CHUNK, flat.size), np.float32)
    back = np.empty_like(f)
    for start in range(0, flat.size, QUANTIZE_CHUNK):
        part = flat[start:start + QUANTIZE_CHUNK]
        n = len(part)
        np.divide(part, s, out=f[:n])
        np.rint(f[:n], out=f[:n])
        if f[:n].min() < 0 or f[:n].max() > 255:
            raise DataError(f"values in [{x.min()}, {x.max()}] are not pixels of scale {scale}")
        np.copyto(q[start:start + n], f[:n], casting="unsafe")
        np.copyto(back[:n], q[start:start + n], casting="unsafe")
        np.multiply(back[:n], s, out=back[:n])
        if not np.array_equal(back[:n], part):
            bad = start + int(np.argmax(back[:n] != part))
            raise DataError(f"value {flat[bad]} at flat index {bad} is not a multiple of "
                            f"{scale}: the data cannot be kept as uint8 pixels")
    return q.reshape(np.shape(x))
