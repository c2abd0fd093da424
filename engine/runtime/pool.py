"""Many models, one arena: pause, resume and switch models in constant memory.

A :class:`ModelPool` owns an :class:`~engine.runtime.arena.Arena` and any number of models,
at most one of them *active* (its data in the arena); the others are *paused* in
host memory (:class:`~engine.runtime.state.ModelState`).  ``activate(m)`` switches: the
active model's state is copied out, then the arena is re-initialised and ``m``'s
state copied in — one memset and one copy per zone, no allocation.  Models of the
same program — or of programs differing only in optimizer hyperparameters and
inits (:attr:`~engine.runtime.program.Program.code_key`) — share one bytecode (only data
moves, and the optimizer update is rebound when the learning rate differs); a model
of another program rebinds that program onto the arena (a few views and closures,
kept for the most recently used programs).

Host memory for paused models is bounded by ``max_host_bytes``: adding a model
past it is an error that says so, never a swap storm.  ``save``/``load`` write a
paused model to disk and read it back.

>>> import numpy as np
>>> from engine import SGD, compile_graph
>>> from engine.models import paper_mlp
>>> prog = compile_graph(paper_mlp((4, 8, 3)), batch_size=16, optimizer=SGD(lr=0.1))
>>> pool = ModelPool(Arena.for_programs([prog]))
>>> a, b = pool.add(prog, seed=1), pool.add(prog, seed=2)
>>> x, y = np.ones((16, 4), np.float32), np.zeros(16, np.int64)
>>> for m in (a, b, a):
...     vm = pool.activate(m); vm.set("x", x); vm.set("y", y); vm.train_step("train")
>>> a.state.t, b.state.t, pool.active is a
(1, 1, True)
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from engine.errors import BudgetError, EngineError
from engine.runtime.arena import Arena
from engine.runtime.program import Program
from engine.runtime.state import ModelState, initial_state
from engine.runtime.vm import VM


class PoolFullError(BudgetError):
    """Pausing another model would exceed the pool's host-memory bound."""


@dataclass(eq=False)
class Model:
    """A model in a pool: its program and its paused state's host buffers (which
    hold its data whenever it is not the active model)."""

    id: int
    state: ModelState

    @property
    def program(self) -> Program:
        return self.state.program


class ModelPool:
    """Models sharing one arena; see the module docstring."""

    def __init__(self, arena: Arena, max_host_bytes: int | None = None,
                 bound_programs: int = 4) -> None:
        self.arena = arena
        self.max_host_bytes = max_host_bytes
        self.models: dict[int, Model] = {}
        self.active: Model | None = None
        self._vms: OrderedDict[str, VM] = OrderedDict()  # code key -> VM on the arena
        self._bound_programs = max(1, bound_programs)
        self._next = 0
        self.switches = 0

    @property
    def host_bytes(self) -> int:
        """Host bytes held for the models (each model's buffers, paused or not)."""
        return sum(m.state.nbytes for m in self.models.values())

    def add(self, program: Program, seed: int = 0) -> Model:
        """A new model of ``program``, initialised from ``seed``, paused."""
        return self._admit(initial_state(program, seed, self.arena.backend))

    def load(self, path: str | os.PathLike[str]) -> Model:
        """Add the model saved at ``path`` (see :meth:`save`), paused."""
        return self._admit(ModelState.load(path, self.arena.backend))

    def _admit(self, state: ModelState) -> Model:
        prog = state.program
        if not self.arena.fits(prog):
            raise BudgetError(f"program {prog.name!r} needs {prog.total_bytes:,} bytes on "
                              f"{prog.device}; the arena holds {self.arena.nbytes:,} on "
                              f"{self.arena.device}")
        if self.max_host_bytes is not None and \
                self.host_bytes + state.nbytes > self.max_host_bytes:
            raise PoolFullError(
                f"pausing another model of {prog.name!r} needs {state.nbytes:,} bytes of host "
                f"memory; the pool's {len(self.models)} models hold {self.host_bytes:,} of "
                f"its {self.max_host_bytes:,}-byte bound: remove() finished models, save() "
                "them to disk, or raise max_host_bytes")
        model = Model(self._next, state)
        self._next += 1
        self.models[model.id] = model
        return model

    def activate(self, model: Model) -> VM:
        """Switch ``model`` into the arena (pausing the active one) and return its VM."""
        if self.models.get(model.id) is not model:
            raise EngineError(f"model {model.id} is not in this pool")
        if self.active is model:
            return self._vms[model.program.code_key]
        self.pause()
        vm = self._vm(model.program)
        vm.load_state(model.state)
        self.active = model
        self.switches += 1
        return vm

    def pause(self) -> None:
        """Copy the active model's state to its host buffers; no model is active after."""
        if self.active is not None:
            self._vms[self.active.program.code_key].save_state(into=self.active.state)
            self.active = None

    def remove(self, model: Model) -> None:
        """Forget a model (its host buffers are freed)."""
        if self.active is model:
            self.active = None
        self.models.pop(model.id, None)

    def save(self, model: Model, path: str | os.PathLike[str]) -> Path:
        """Write ``model`` to disk (pausing it first if it is active)."""
        if self.active is model:
            self.pause()
        return model.state.save(path)

    def _vm(self, program: Program) -> VM:
        key = program.code_key
        vm = self._vms.get(key)
        if vm is not None:
            self._vms.move_to_end(key)
            vm.retarget(program)  # same code: at most the optimizer update is rebound
            return vm
        vm = self.arena.vm(program, initialize=False)
        self._vms[key] = vm
        while len(self._vms) > self._bound_programs:
            self._vms.popitem(last=False)
        return vm
