"""An arena: device memory allocated once, onto which programs are mapped.

Mapping a program carves its four zones out of the arena, one after the other:
new views at new offsets, never a new allocation.  Any program whose zones fit
can be mapped, so one arena hosts a whole search.

>>> from engine import Adam, compile_graph
>>> from engine.models import paper_mlp
>>> small = compile_graph(paper_mlp((8, 4, 3)), batch_size=16, optimizer=Adam())
>>> big = compile_graph(paper_mlp((8, 32, 3)), batch_size=64, optimizer=Adam())
>>> arena = Arena.for_programs([small, big])
>>> arena.nbytes == big.total_bytes, arena.fits(small)
(True, True)
>>> vm = arena.vm(small); vm.heap.allocated_bytes      # views only
0
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.errors import BudgetError, EngineError
from engine.runtime.backends import get_backend
from engine.runtime.heap import CalcHeap, carved_bytes
from engine.runtime.program import Program
from engine.runtime.vm import VM


class Arena:
    """``nbytes`` of device memory on ``device``, allocated once."""

    def __init__(self, nbytes: int, device: str = "cpu") -> None:
        if nbytes < 0:
            raise EngineError(f"an arena cannot hold {nbytes} bytes")
        self.device = device
        self.backend = get_backend(device)
        self.buffer: Any = self.backend.alloc_arena(int(nbytes))

    @classmethod
    def for_programs(cls, programs: Iterable[Program], device: str | None = None) -> Arena:
        """An arena just big enough for the largest of ``programs``."""
        progs = list(programs)
        if not progs:
            raise EngineError("Arena.for_programs needs at least one program")
        devices = {p.device for p in progs}
        if len(devices) > 1 or (device is not None and devices != {device}):
            raise EngineError(f"programs for different devices {sorted(devices)} cannot "
                              "share an arena")
        return cls(max(carved_bytes(p.zone_bytes) for p in progs), progs[0].device)

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    def fits(self, program: Program) -> bool:
        return program.device == self.device and carved_bytes(program.zone_bytes) <= self.nbytes

    def release(self, offset: int, nbytes: int) -> int:
        """Give back to the system the memory of ``[offset, offset + nbytes)``, a part no
        model uses any more (on the CPU its whole pages; device memory stays): an
        arena then costs what its models use now, not the most they ever used.  Returns
        the bytes given back."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise EngineError(f"cannot release [{offset}, {offset + nbytes}) of an arena of "
                              f"{self.nbytes:,} bytes")
        return self.backend.release(self.buffer, offset, nbytes)

    def heap(self, program: Program) -> CalcHeap:
        """The program's zones as views of the arena."""
        if program.device != self.device:
            raise EngineError(f"program {program.name!r} runs on {program.device}, the arena "
                              f"is on {self.device}")
        need = carved_bytes(program.zone_bytes)
        if need > self.nbytes:
            raise BudgetError(f"program {program.name!r} needs {need:,} bytes; the arena "
                              f"holds {self.nbytes:,}")
        return CalcHeap(self.backend, program.zone_bytes, buffer=self.buffer)

    def vm(self, program: Program, seed: int = 0, initialize: bool = True) -> VM:
        """A VM running ``program`` on this arena (binding is views, no allocation)."""
        return VM(program, seed=seed, heap=self.heap(program), initialize=initialize)
