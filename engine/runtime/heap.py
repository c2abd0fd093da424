"""CalcHeap: the four zones of a program, each one contiguous allocation.

>>> from engine.runtime.backends import get_backend
>>> h = CalcHeap(get_backend("cpu"), {"forward": 128, "gradient": 64, "optimizer": 0,
...                                   "workspace": 64})
>>> h.allocated_bytes
256
"""

from __future__ import annotations

from typing import Any

from engine.alignment import align_up
from engine.runtime.backends import Backend
from engine.runtime.zones import ZONES


class CalcHeap:
    """Allocates each zone once (on a GPU the four as one block); views are carved out
    of them by offset.

    With ``buffer`` (an arena's memory), the zones are carved out of it one after the
    other, 64-byte aligned, and nothing is allocated.
    """

    def __init__(self, backend: Backend, zone_bytes: dict[str, int],
                 buffer: Any | None = None) -> None:
        self.backend = backend
        self.owned = buffer is None
        self._block: Any = None
        if buffer is None and backend.name == "cpu":
            self.zones: dict[str, Any] = {z: backend.alloc(int(zone_bytes.get(z, 0)))
                                          for z in ZONES}
            return
        if buffer is None:
            # A device maps its memory in pages (2 MiB on a CUDA GPU), each allocation
            # rounded up to them: four zones would cost up to four pages beyond the
            # plan, one block at most one.
            buffer = self._block = backend.alloc(carved_bytes(zone_bytes))
        need = carved_bytes(zone_bytes)
        if need > buffer.nbytes:
            raise ValueError(f"the zones need {need:,} bytes, the buffer holds "
                             f"{buffer.nbytes:,}")
        self.zones = {}
        at = 0
        for z in ZONES:
            n = int(zone_bytes.get(z, 0))
            self.zones[z] = buffer[at : at + n]
            at += align_up(n)

    @property
    def allocated_bytes(self) -> int:
        """Bytes this heap allocated itself (0 when carved out of an arena)."""
        if not self.owned:
            return 0
        if self._block is not None:
            return self.backend.allocated_bytes([self._block])
        return self.backend.allocated_bytes(list(self.zones.values()))

    def capacity(self, zone: str) -> int:
        return int(self.zones[zone].nbytes)

    def view(self, zone: str, offset: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
        raw = self.zones[zone][offset : offset + nbytes]
        return raw.view(dtype).reshape(shape)


def carved_bytes(zone_bytes: dict[str, int]) -> int:
    """Bytes the four zones take carved one after the other, 64-byte aligned."""
    return sum(align_up(zone_bytes.get(z, 0)) for z in ZONES)
