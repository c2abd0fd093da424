"""A model of images takes them as the user holds them: digits as scikit-learn gives
them (floats 0..16) or as explore holds them (k / 16), MNIST as 0..255 or k / 256, and
anything else is refused with what is accepted and where the first bad value is."""

from __future__ import annotations

import numpy as np
import pytest

import explore
from explore.datasets import DataError, load_digits
from explore.datasets.quantize import accepted, max_pixel, quantize, to_pixels

sk = pytest.importorskip("sklearn.datasets", reason="the digits data set is scikit-learn's")

DIGITS, MNIST = 1 / 16, 1 / 256


@pytest.fixture(scope="module")
def raw() -> np.ndarray:
    """scikit-learn's digits as it gives them: float64 pixels 0..16."""
    x = sk.load_digits().data
    assert x.dtype == np.float64 and x.min() == 0 and x.max() == 16
    return x


def test_the_largest_pixel_follows_from_the_scale() -> None:
    assert [max_pixel(s) for s in (DIGITS, MNIST, 1.0, 2.0)] == [16, 255, 255, 255]


@pytest.mark.parametrize("form", ["floats 0..16", "float32 0..16", "ints", "uint8",
                                  "k / 16 floats", "8x8 images"])
def test_digits_in_each_form_a_user_has_them_are_the_same_pixels(raw: np.ndarray,
                                                                   form: str) -> None:
    want = raw.astype(np.uint8)
    x = {"floats 0..16": raw, "float32 0..16": raw.astype(np.float32),
         "ints": raw.astype(np.int64), "uint8": want,
         "k / 16 floats": (raw / 16).astype(np.float32),
         "8x8 images": raw.reshape(-1, 8, 8)}[form]
    got = to_pixels(x, DIGITS)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got.reshape(len(raw), -1), want)


def test_explores_own_digits_are_the_pixels_the_search_kept() -> None:
    x = load_digits().train.x
    np.testing.assert_array_equal(to_pixels(x, DIGITS), quantize(x, DIGITS))


def test_uint8_pixels_in_range_are_taken_as_they_are() -> None:
    x = np.arange(256, dtype=np.uint8).reshape(4, 64)
    assert to_pixels(x, MNIST) is x


@pytest.mark.parametrize(("where", "value", "got"), [
    ((3, 12), 8.5, "8.5 at row 3, column 12"),
    ((5, 7), 17.0, "values in [0.0, 17.0], 17.0 at row 5, column 7"),
    ((0, 1), -1.0, "values in [-1.0, 16.0], -1.0 at row 0, column 1"),
    ((9, 63), np.nan, "nan at row 9, column 63"),
])
def test_a_value_that_is_no_pixel_is_refused_saying_what_is_accepted(
        raw: np.ndarray, where: tuple[int, int], value: float, got: str) -> None:
    x = raw[:10].copy()
    x[where] = value
    with pytest.raises(DataError) as e:
        to_pixels(x, DIGITS)
    assert str(e.value) == f"{accepted(DIGITS)}; got {got}"
    assert str(e.value).startswith(
        "this model's pixels are integers 0..16, as ints or floats (scikit-learn's "
        "load_digits gives them as floats), or those divided by 16, floats in [0, 1] (as "
        "explore's data set holds them); got ")


@pytest.mark.parametrize(("x", "got"), [
    (np.array([[0.0, 0.3]]), "0.3 at row 0, column 1"),  # [0, 1], but no k / 16
    (np.array([[0, 200]], np.uint8), "values in [0, 200], 200 at row 0, column 1"),
    (np.array([[1, -2]], np.int64), "values in [-2, 1], -2 at row 0, column 1"),
    (np.array([["a"]]), "values of dtype <U1"),
])
def test_other_forms_of_no_digits_pixel_are_refused(x: np.ndarray, got: str) -> None:
    with pytest.raises(DataError, match=r"integers 0\.\.16") as e:
        to_pixels(x, DIGITS)
    assert str(e.value).endswith(f"; got {got}")


def test_a_bad_value_deep_in_a_large_set_is_found_where_it_is() -> None:
    x = np.tile(np.arange(256.0), (10_000, 4))[:, :784]  # converted a chunk at a time
    x[7000, 300] = 3.5
    with pytest.raises(DataError, match=r"; got 3\.5 at row 7000, column 300$"):
        to_pixels(x, MNIST)


def test_mnist_takes_0_to_255_as_bytes_ints_or_floats_and_its_own_k_over_256() -> None:
    k = np.arange(256).reshape(4, 64)
    for x in (k.astype(np.uint8), k, k.astype(np.float32), (k / 256).astype(np.float32)):
        np.testing.assert_array_equal(to_pixels(x, MNIST), k.astype(np.uint8))
    with pytest.raises(DataError) as e:
        to_pixels(k / 255, MNIST)  # torchvision's ToTensor
    assert str(e.value) == (
        "this model's pixels are integers 0..255, as ints or floats (MNIST's original "
        "files hold them as uint8), or those divided by 256, floats in [0, 1) (as "
        "explore's data set holds them); got 0.00392156862745098 at row 0, column 1; "
        "these look like pixels divided by 255 (torchvision's ToTensor): give "
        "np.rint(x * 255).astype(np.uint8)")


def test_a_users_uint8_arrays_of_scale_1_take_0_to_255() -> None:
    assert to_pixels(np.array([[0.0, 255.0]]), 1.0).tolist() == [[0, 255]]
    assert accepted(1.0) == "this model's pixels are integers 0..255, as ints or floats"
    with pytest.raises(DataError, match=r"got 0\.5 at row 0, column 0"):
        to_pixels(np.array([[0.5]]), 1.0)


def test_quantize_says_what_pixels_of_its_scale_are() -> None:
    with pytest.raises(DataError, match=r"those are integers 0\.\.255 divided by 16$"):
        quantize(np.array([16.5, 17.0], np.float32), DIGITS)


def test_a_digits_model_predicts_scikit_learns_digits_as_they_come(
        raw: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> None:
    storage = f"sqlite:///{tmp_path_factory.mktemp('digits') / 'd.db'}"
    explore.run({"name": "d", "dataset": "digits",
                 "budget": {"trials": 1, "rounds": 1, "memory": "400MB"}, "pruner": "none",
                 "keep_models": 1, "model": {"depth": 1, "width": 16}}, storage=storage)
    model = explore.load_model(storage, "d")
    x = raw[:100]
    want = model.predict((x / 16).astype(np.float32))
    np.testing.assert_array_equal(model.predict(x), want)
    np.testing.assert_array_equal(model.predict(sk.load_digits().images[:100]), want)
    bad = x.copy()
    bad[2, 5] = 3.5
    with pytest.raises(DataError, match=r"integers 0\.\.16.*; got 3\.5 at row 2, column 5$"):
        model.predict(bad)


def test_a_model_of_a_users_pixel_arrays_checks_the_pixels_it_predicts(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Arrays of uint8 images given from Python keep a table's preprocessing and a pixel
    scale: a prediction's values go through the same check, never wrapped into bytes
    (300 was read as 44, -1 as 255)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (200, 1, 4, 4)).astype(np.uint8)
    y = (x.reshape(200, -1).mean(1) > 127).astype(np.int64)
    storage = f"sqlite:///{tmp_path_factory.mktemp('pixels') / 'p.db'}"
    explore.run({"name": "p", "dataset": {"scale": "none"},
                 "budget": {"trials": 1, "rounds": 1, "memory": "400MB"}, "pruner": "none",
                 "keep_models": 1, "model": {"depth": 1, "width": 8}}, data=(x, y),
                storage=storage)
    model = explore.load_model(storage, "p")
    assert model.data.preprocess is not None and model.data.pixel_scale == 1.0
    flat = x[:5].reshape(5, -1)
    np.testing.assert_array_equal(model.predict(flat.astype(np.float64)), model.predict(flat))
    for bad, says in ((300.0, "300.0 at row 0, column 3"), (-1.0, "-1.0 at row 0, column 3")):
        rows = flat.astype(np.float64)
        rows[0, 3] = bad
        with pytest.raises(DataError, match=says):
            model.predict(rows)
