"""The CPU backend: numpy."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.runtime.backends._base import Backend


class NumpyBackend(Backend):
    name = "cpu"
    xp = np

    def alloc(self, nbytes: int) -> np.ndarray:
        return np.empty(int(nbytes), dtype=np.uint8)

    def to_device(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src, casting="same_kind")

    def gather_rows(self, dst: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:
        # mode="clip": the default ("raise") copies through a temporary buffer, twice
        # the time and an allocation; VM.gather has checked the rows already.
        np.take(src, rows, axis=0, out=dst, mode="clip")

    def to_host(self, src: np.ndarray) -> np.ndarray:
        return np.array(src, copy=True)

    def rng(self, seed: int) -> Any:
        return np.random.default_rng(seed)
