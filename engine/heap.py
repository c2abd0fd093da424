"""CalcHeap: the four zones of a program, each one contiguous allocation.

>>> from engine.backends import get_backend
>>> h = CalcHeap(get_backend("cpu"), {"forward": 128, "gradient": 64, "optimizer": 0,
...                                   "workspace": 64})
>>> h.allocated_bytes
256
"""

from __future__ import annotations

from typing import Any

from engine.backends import Backend
from engine.passes.ir import ZONES


class CalcHeap:
    """Allocates each zone once; views are carved out of them by offset."""

    def __init__(self, backend: Backend, zone_bytes: dict[str, int]) -> None:
        self.backend = backend
        self.zones: dict[str, Any] = {z: backend.alloc(int(zone_bytes.get(z, 0))) for z in ZONES}

    @property
    def allocated_bytes(self) -> int:
        return self.backend.allocated_bytes(list(self.zones.values()))

    def capacity(self, zone: str) -> int:
        return int(self.zones[zone].nbytes)

    def memset(self) -> None:
        """Zero every zone: one memset each."""
        for buf in self.zones.values():
            self.backend.memset(buf, 0)

    def view(self, zone: str, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
        raw = self.zones[zone][offset : offset + nbytes]
        return raw.view(dtype).reshape(shape)
