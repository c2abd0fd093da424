"""A dataset is one module: a throwaway one, registered here, is searched by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from explore import datasets
from explore.binding import bind
from explore.candidate import compile_candidate
from explore.datasets import BaseDataset, DataError, LoadedData, Split, load, quantize
from explore.results import load as load_results
from explore.sampling import fixed
from explore.space import parse_space
from tests.explore.cli_run import run_here


class Stripes(BaseDataset):
    """4x4 images: class 0 has a bright top half, class 1 a bright bottom half."""

    features, classes, image, valid = 16, 2, (1, 4, 4), 40
    pixel_scale = 1 / 16

    def load(self) -> LoadedData:
        rng = np.random.default_rng(0)
        y = rng.integers(0, 2, 200)
        x = rng.integers(0, 8, (200, 16)).astype(np.float32)
        x[y == 0, :8] += 8
        x[y == 1, 8:] += 8
        x /= 16
        return LoadedData("stripes", Split(x[:120], y[:120]), Split(x[120:160], y[120:160]),
                          Split(x[160:], y[160:]), 2)


@pytest.fixture
def stripes() -> Iterator[None]:
    datasets.register("stripes")(Stripes)
    yield
    datasets.DATASETS.unregister("stripes")


def test_a_registered_dataset_is_used_by_name(stripes: None, tmp_path: Path) -> None:
    space = parse_space({"dataset": "stripes", "budget": {"trials": 1, "rounds": 1,
                                                          "memory": "64MB"}})
    cand = compile_candidate(bind(space), fixed(space), share=8_000_000)
    prog = cand.program
    assert prog.buffers[prog.params[0].buffer].shape == (64, 16)  # Linear [out, in]: 16 features in
    assert prog.buffers[prog.params[-2].buffer].shape == (2, 64)  # [out, in]: 2 classes out
    data = load("stripes")
    assert datasets.get("stripes").pixel_scale == 1 / 16
    assert quantize(data.train.x, 1 / 16).max() == 15
    # and a whole run: the scheduler quantizes it and the workers train on it
    f = tmp_path / "s.yaml"
    f.write_text("dataset: stripes\nbudget: {trials: 2, rounds: 2, memory: 300MB, workers: 1}\n"
                 "sampler: {name: random, seed: 0}\ntraining: {lr: 0.05, batch_size: 16}\n")
    run_here(f)
    df = load_results(f"sqlite:///{tmp_path / 's.db'}", "s")
    assert (df["state"] == "complete").all() and df["value"].max() > 0.9


def test_an_unknown_dataset_lists_the_registered_ones() -> None:
    with pytest.raises(DataError, match="unknown dataset 'nope'; available: mnist, digits"):
        load("nope")
    assert "stripes" not in datasets.names()
