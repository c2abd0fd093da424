"""Images kept as uint8: ``quantize`` stores pixels of a known scale exactly, so the
model's ``DequantizeLinear`` sees the same float32 values bit for bit; ``to_pixels``
takes images in any of the forms a user holds them (integer pixels, or the scaled
values) and refuses, saying what it accepts, values a model's pixels cannot be."""

from __future__ import annotations

from typing import Any

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
        if not (f[:n].min() >= 0 and f[:n].max() <= 255):  # NaN fails too
            raise DataError(f"values in [{x.min()}, {x.max()}] are not pixels of scale "
                            f"{scale}: those are integers 0..255 {_scaled(scale)}")
        np.copyto(q[start:start + n], f[:n], casting="unsafe")
        np.copyto(back[:n], q[start:start + n], casting="unsafe")
        np.multiply(back[:n], s, out=back[:n])
        if not np.array_equal(back[:n], part):
            bad = start + int(np.argmax(back[:n] != part))
            raise DataError(f"value {flat[bad]} at flat index {bad} is not a multiple of "
                            f"{scale}: the data cannot be kept as uint8 pixels")
    return q.reshape(np.shape(x))


def max_pixel(scale: float) -> int:
    """The largest pixel ``k`` of images of ``scale`` (a model sees ``k * scale``).
    Those of a scale below 1 hold values in [0, 1] (the built-in digits, ``k / 16`` for
    k in 0..16; MNIST, ``k / 256`` for k in 0..255); those of scale 1 (a user's uint8
    arrays) the raw bytes.

    >>> max_pixel(1 / 16), max_pixel(1 / 256), max_pixel(1.0)
    (16, 255, 255)
    """
    if scale >= 1:
        return 255
    return min(255, int(np.floor(1 / scale + 1e-6)))


def to_pixels(x: Any, scale: float) -> np.ndarray:
    """Images as a model of pixel ``scale`` takes them: uint8 pixels ``k`` in
    ``0..max_pixel(scale)``, the model seeing ``k * scale``.  Each array is taken whole,
    in one of two forms:

    - the pixels themselves: integers, of an integer dtype or as floats (scikit-learn's
      ``load_digits`` gives digits' 0..16 as floats), read so when the array is of an
      integer dtype or a value is above 1;
    - the scaled values ``k * scale``: floats in [0, 1], as the built-in data set holds
      them (:func:`explore.datasets.load_digits`).

    Anything else raises :class:`DataError` saying what is accepted and the first value
    at fault, with its row and column (of the images flattened).

    >>> to_pixels(np.array([[0.0, 8.0, 16.0]]), 1 / 16).tolist()  # scikit-learn's digits
    [[0, 8, 16]]
    >>> to_pixels(np.array([[0.0, 0.5, 1.0]]), 1 / 16).tolist()  # explore's digits
    [[0, 8, 16]]
    >>> to_pixels(np.array([[0.0, 8.5]]), 1 / 16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    explore.datasets.errors.DataError: this model's pixels are ...; got 8.5 at row 0, column 1
    """
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise DataError(f"{accepted(scale)}; got values of dtype {a.dtype}")
    if a.size == 0:
        return np.zeros(a.shape, np.uint8)
    top, low, high = max_pixel(scale), a.min(), a.max()
    if a.dtype == np.uint8 and high <= top:
        return a
    flat = a.reshape(-1)
    if not np.isfinite(high):  # a NaN anywhere, or an infinity
        raise DataError(f"{accepted(scale)}; got {_at(a, int(np.argmax(~np.isfinite(flat))))}")
    scaled = a.dtype.kind == "f" and scale < 1 and high <= 1
    s = np.float32(scale)
    out = np.empty(flat.shape, np.uint8)
    # a chunk at a time, as quantize: whole-array temporaries would be copies of the set
    for start in range(0, flat.size, QUANTIZE_CHUNK):
        part = flat[start:start + QUANTIZE_CHUNK]
        if scaled:
            f = part.astype(np.float32)
            k = np.rint(f / s)
            bad = (k < 0) | (k > top) | (k * s != f)
        else:
            k = part
            bad = (k < 0) | (k > top)
            if a.dtype.kind == "f":
                bad |= k != np.rint(k)
        if bad.any():
            i = start + int(np.argmax(bad))
            got = _at(a, i)
            if scaled:
                got += _hint(a, scale)
            elif not 0 <= flat[i] <= top:
                got = f"values in [{low}, {high}], {got}"
            raise DataError(f"{accepted(scale)}; got {got}")
        np.copyto(out[start:start + len(part)], k, casting="unsafe")
    return out.reshape(a.shape)


# Where users' copies of the built-in image sets come from, by their pixel scale: named
# in messages, since the form those give is the one a user has at hand.
KNOWN_SOURCES = {1 / 16: "scikit-learn's load_digits gives them as floats",
                 1 / 256: "MNIST's original files hold them as uint8"}


def accepted(scale: float) -> str:
    """What :func:`to_pixels` accepts for images of ``scale``, said for a message.

    >>> accepted(1 / 16)  # doctest: +NORMALIZE_WHITESPACE
    "this model's pixels are integers 0..16, as ints or floats (scikit-learn's
    load_digits gives them as floats), or those divided by 16, floats in [0, 1] (as
    explore's data set holds them)"
    """
    top = max_pixel(scale)
    source = KNOWN_SOURCES.get(scale)
    ints = f"this model's pixels are integers 0..{top}, as ints or floats" + \
        (f" ({source})" if source else "")
    if scale >= 1:
        return ints
    closed = "]" if top * scale >= 1 else ")"
    return f"{ints}, or those {_scaled(scale)}, floats in [0, 1{closed} (as explore's " \
        "data set holds them)"


def _at(a: np.ndarray, i: int) -> str:
    """The value at flat index ``i`` of ``a``, and where: row and column of the images
    flattened (``[n, ...]``)."""
    value = a.reshape(-1)[i].item()
    if a.ndim == 0:
        return str(value)
    width = int(np.prod(a.shape[1:], dtype=np.int64)) or 1
    return f"{value} at row {i // width}, column {i % width}"


def _scaled(scale: float) -> str:
    """``divided by 16`` rather than ``times 0.0625`` where the scale is one over an
    integer."""
    n = round(1 / scale)
    return f"divided by {n}" if n >= 1 and np.float32(1 / n) == np.float32(scale) else \
        f"times {scale}"


def _hint(a: np.ndarray, scale: float) -> str:
    """What a common other form looks like: pixels / 255 (torchvision's ToTensor), for
    a model whose pixels are 0..255."""
    if max_pixel(scale) != 255 or scale >= 1:
        return ""
    k = np.asarray(a, np.float64) * 255
    if np.abs(k - np.rint(k)).max() < 1e-4:
        return "; these look like pixels divided by 255 (torchvision's ToTensor): give " \
               "np.rint(x * 255).astype(np.uint8)"
    return ""
