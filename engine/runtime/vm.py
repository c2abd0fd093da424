"""The interpreter: runs a Program's bytecode over one preallocated CalcHeap.

Everything a step touches is bound when the program is loaded: each instruction
becomes a zero-argument function closed over views of the heap, so running a path is
``for f in steps: f()`` — no graph walking, no dictionary look-up, no allocation.

A smaller batch than the compiled one (the last mini-batch) uses prefixes of the same
buffers; its bindings are made once, on first use, and kept.

The API follows the paper: ``forward(path)``, ``apply_loss(path)``, ``backward(path)``,
``optimize()``, ``end_round()``; placeholders have setters, variables getters.
``backward`` *accumulates* parameter gradients until ``optimize()`` consumes them, so
one learning batch may be split into several technical batches
(:meth:`VM.learn_batch`).

>>> import numpy as np
>>> from engine import CalcGraph, Init, Mode, compile_graph, VM, SGD
>>> g = CalcGraph()
>>> x = g.placeholder("x", (0, 2)); t = g.placeholder("t", (0, 1))
>>> w = g.parameter("w", (2, 1), init=Init.zeros())
>>> p = g.path("fit", Mode.BACKWARD_ENABLED)
>>> _ = p.set_loss(p.MSELoss(p.MatMul(x, w), t))
>>> vm = VM(compile_graph(g, batch_size=2, optimizer=SGD(lr=0.5)))
>>> vm.set("x", np.eye(2)); vm.set("t", np.ones((2, 1)))
>>> for _ in range(100): vm.train_step("fit")
>>> np.round(vm.get("w").ravel(), 2).tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.alignment import align_up
from engine.autotune import Tuner, autotune_refused
from engine.errors import EngineError, InputError
from engine.ops import KernelArgs, get_op
from engine.ops._base import Step, data_ptr, is_numpy, variant_named
from engine.runtime.backends import get_backend
from engine.runtime.heap import CalcHeap
from engine.runtime.members import member_parts
from engine.runtime.program import Program
from engine.runtime.state import (
    STREAM_FORMAT,
    ModelState,
    empty_state,
    read_stream,
    region_dtype,
    seeded_rng_state,
    stream_header,
    write_initial,
    write_stream,
)
from engine.runtime.zones import FORWARD, GRADIENT, OPTIMIZER, WORKSPACE, ZONES


@dataclass
class _Binding:
    """The steps of every path at one batch size."""

    views: list[Any]
    forward: list[tuple[Step, ...]]
    backward: dict[tuple[int, int], tuple[Step, ...]] = field(default_factory=dict)


class VM:
    """Loads a :class:`Program` onto a heap and runs it (see the module docstring)."""

    def __init__(self, program: Program, *, seed: int = 0, heap: CalcHeap | None = None,
                 check_inputs: bool = True, initialize: bool = True,
                 tune: bool | Tuner | None = None) -> None:
        self.program = program
        self.backend = get_backend(program.device)
        self.xp = self.backend.xp
        if heap is None:
            heap = CalcHeap(self.backend, program.zone_bytes)
        for z in ZONES:
            if heap.capacity(z) < program.zone_bytes[z]:
                raise EngineError(f"heap zone {z!r} holds {heap.capacity(z):,} bytes; the program "
                                  f"needs {program.zone_bytes[z]:,}")
        self.heap = heap
        self.check_inputs = check_inputs
        self.round = 0
        self._t = [0]  # optimize() calls: Adam's bias correction reads it
        self._dirty = 0  # bit i: parameter i holds gradients optimize() has not consumed
        self._forwarded = -1  # the path whose forward ran last: backward reads its values
        self._fed: set[str] = set()
        self._checked: dict[str, tuple[Any, Any]] = {}  # placeholder -> array checked whole
        self._placeholders = {b.name: i for i, b in enumerate(program.buffers)
                              if b.kind == "placeholder"}
        self._names = {b.name: i for i, b in enumerate(program.buffers)}
        self._path_mask = [sum(1 << j for j in p.params) for p in program.paths]
        self._learned = [i for i, ps in enumerate(program.params) if ps.grad is not None]
        self._all_learned = sum(1 << i for i in self._learned)
        self._bindings: dict[int, _Binding] = {}
        # Placeholders read in place: index -> the caller's array (a read-only view),
        # and the bindings made for such sets of arrays, most recent last.
        self._external: dict[int, Any] = {}
        self._external_bindings: dict[tuple[Any, ...], _Binding] = {}
        self._stale = False  # _external changed since self._binding was chosen
        self._update_cache: dict[int, tuple[Step, ...]] = {}
        # One generator for the VM's life: kernels hold it; models swap its state.
        self.rng = self.backend.rng(seed)
        self._state_views = self._make_state_views()
        self._batch = program.batch_size
        self.autotune = self._tuner(tune)
        self._binding = self._bind(self._batch)
        self._flat_update = self._bind_update(self._all_learned)
        if initialize:
            self.initialize(seed)

    # -- set-up --------------------------------------------------------------------------
    def initialize(self, seed: int = 0) -> None:
        """Zero the heap (one memset per zone), write the parameters' initial values
        and the optimizer's initial state straight into their zones, and reset the
        random generator and counters: what ``load_state(initial_state(...))`` makes,
        without a host copy of the model (the values are drawn a bounded chunk at a
        time, :func:`~engine.runtime.state.write_initial`)."""
        params, rest, _, no_grads, opt, ws = self._state_views
        be = self.backend
        for view in (params, rest, no_grads, opt, ws):
            be.memset(view)
        write_initial(self.program, seed, params, opt, be)
        self._reset(0, 0, 0, seeded_rng_state(be, seed))

    # -- model switching -----------------------------------------------------------------
    def save_state(self, into: ModelState | None = None) -> ModelState:
        """Copy what this model needs to resume (parameters, optimizer state,
        unconsumed gradients, counters, the random state) to host memory; ``into``
        reuses the buffers of an earlier state of the same program."""
        st = into if into is not None else empty_state(self.program, self.backend)
        self._check_state(st)
        params, _, grads, _, opt, _ = self._state_views
        be = self.backend
        be.copy_out(st.forward, params)
        be.copy_out(st.optimizer, opt)
        if self._dirty:  # once the optimizer consumed them, gradients are not kept
            be.copy_out(st.gradient, grads)
        st.t, st.dirty, st.round = self._t[0], self._dirty, self.round
        st.rng = be.rng_state(self.rng)
        be.synchronize()
        return st

    def load_state(self, st: ModelState) -> None:
        """Make this VM run the model ``st`` describes: one memset and at most one copy
        per zone (the copied prefix is not memset: it is overwritten)."""
        self._check_state(st)
        params, rest, grads, no_grads, opt, ws = self._state_views
        be = self.backend
        be.copy_in(params, st.forward)
        be.memset(rest)
        if st.dirty:
            be.copy_in(grads, st.gradient)
            be.memset(no_grads[grads.nbytes:])
        else:
            be.memset(no_grads)
        be.copy_in(opt, st.optimizer)
        be.memset(ws)
        self._reset(st.t, st.dirty, st.round, st.rng)

    def write_state(self, path: str | os.PathLike[str],
                    extra: Mapping[str, Any] | None = None) -> int:
        """Write what :meth:`save_state` keeps to the file ``path``, straight from the
        heap: no host copy of the model (a device's bytes pass through a bounded host
        buffer), where host memory is what a budget counts.  ``extra``: JSON-able
        values of the caller's, which :meth:`read_state` gives back.  Atomic; returns
        the bytes written.  The model stays here: drop the VM (or its region) after."""
        params, _, grads, _, opt, _ = self._state_views
        be = self.backend
        be.synchronize()
        header = self._stream_header(self.program, self._dirty, extra)
        return write_stream(path, header, [params, opt, *([grads] if self._dirty else [])],
                            be)

    def write_member_state(self, k: int, program: Program, path: str | os.PathLike[str],
                           extra: Mapping[str, Any] | None = None) -> int:
        """Write model ``k`` of this VM's stack to the file ``path`` as the state of
        ``program``, the member's own (compiled apart, one model): byte for byte what
        a VM of ``program`` would write (:meth:`write_state`) after
        :func:`~engine.runtime.members.move_member` had copied model ``k`` into it
        (its parameters and optimizer slots, the step count, rounds and generator),
        so that :meth:`read_state` on a VM of ``program`` resumes it, exactly.  No
        host copy of the model, and no heap of ``program``: each of the member's
        slices goes from this heap to the file (a strided one staged in this VM's
        workspace; :func:`~engine.runtime.members.member_parts`).  Between learning
        batches only (not with gradients ``optimize()`` has not consumed).  The
        stack is unchanged; returns the bytes written."""
        if self._dirty:
            raise EngineError("the stack holds gradients optimize() has not consumed: "
                              "write a member between learning batches")
        parts = member_parts(self, k, program)
        self.backend.synchronize()
        return write_stream(path, self._stream_header(program, 0, extra), parts,
                            self.backend)

    def _stream_header(self, program: Program, dirty: int,
                       extra: Mapping[str, Any] | None) -> dict[str, Any]:
        """A state stream's header: ``program``'s layout, this VM's counters and
        generator, the caller's ``extra``."""
        return {"format": STREAM_FORMAT, "program": _identity(program), "t": self._t[0],
                "dirty": dirty, "round": self.round,
                "rng": self.backend.rng_state(self.rng), "extra": dict(extra or {})}

    def read_state(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Make this VM run the model :meth:`write_state` wrote to ``path``, read
        straight into the heap (as :meth:`load_state`: the rest of each zone zeroed,
        the counters and the generator restored), exactly; returns the writer's
        ``extra``.  The file must come from a program of this VM's layout."""
        params, rest, grads, no_grads, opt, ws = self._state_views
        be = self.backend
        with open(path, "rb", buffering=0) as f:
            header = stream_header(f, path)
            if header["program"] != _identity(self.program):
                raise EngineError(f"{path}: a state of program {header['program']}, not of "
                                  f"{_identity(self.program)}")
            read_stream(f, path, [params, opt, *([grads] if header["dirty"] else [])], be)
        be.memset(rest)
        be.memset(no_grads[grads.nbytes:] if header["dirty"] else no_grads)
        be.memset(ws)
        self._reset(header["t"], header["dirty"], header["round"], header["rng"])
        extra: dict[str, Any] = header["extra"]
        return extra

    def _reset(self, t: int, dirty: int, rounds: int, rng_state: Any) -> None:
        """Counters, generator and batch of a model just written into the heap."""
        be = self.backend
        self._t[0], self._dirty, self.round = t, dirty, rounds
        be.set_rng_state(self.rng, rng_state)
        self._forwarded = -1
        self._fed.clear()
        self._drop_external()
        if self._batch != self.program.batch_size:
            self._use_batch(self.program.batch_size)
        be.synchronize()

    def _make_state_views(self) -> tuple[Any, ...]:
        """(parameters, rest of forward, gradient region, gradient zone, optimizer zone,
        workspace): the slices a switch copies or clears, made once."""
        z, prog = self.heap.zones, self.program
        n, size = prog.state_bytes, prog.zone_bytes
        return (z[FORWARD][:n], z[FORWARD][n : size[FORWARD]],
                z[GRADIENT][: prog.param_region], z[GRADIENT][: size[GRADIENT]],
                z[OPTIMIZER][: size[OPTIMIZER]], z[WORKSPACE][: size[WORKSPACE]])

    def retarget(self, program: Program) -> None:
        """Run ``program`` from now on; it must have this VM's code
        (:attr:`Program.code_key`: it may differ in optimizer hyperparameters and
        inits).  Only the optimizer update is rebound."""
        if program is self.program:
            return
        if program.code_key != self.program.code_key:
            raise EngineError(f"program {program.name!r} does not have the code of the "
                              f"program this VM runs ({self.program.name!r})")
        self.program = program
        self._update_cache.clear()
        self._flat_update = self._bind_update(self._all_learned)

    def _check_state(self, st: ModelState) -> None:
        if st.program is not self.program and st.program != self.program:
            raise EngineError(f"a state of program {st.program.name!r} cannot run on a VM of "
                              f"program {self.program.name!r}: they differ")

    def _view(self, i: int, batch: int) -> Any:
        b = self.program.buffers[i]
        desc = b.desc.at_batch(batch)
        return self.heap.view(b.zone, b.offset, desc.nbytes(), self.xp.dtype(b.dtype),
                              desc.shape)

    def _bind(self, batch: int) -> _Binding:
        if batch in self._bindings:
            return self._bindings[batch]
        views = [self._view(i, batch) for i in range(len(self.program.buffers))]
        fwd = [tuple(s for k in p.forward for s in self._bind_instr(k, views, False))
               for p in self.program.paths]
        binding = _Binding(views, fwd)
        self._bindings[batch] = binding
        return binding

    def _bind_instr(self, k: int, views: list[Any], accumulate: bool) -> list[Step]:
        ins = self.program.instrs[k]
        ws = self.heap.zones[WORKSPACE]
        outs = [views[j] for j in ins.outs]
        extra: list[Step] = []
        if ins.param_sink is not None and accumulate:
            grad = outs[0]
            scratch = ws[: grad.nbytes].view(grad.dtype).reshape(grad.shape)
            ws = ws[align_up(grad.nbytes) :]
            outs[0] = scratch
            xp = self.xp
            extra.append(lambda: xp.add(grad, scratch, out=grad))
        inputs = [views[j] for j in ins.ins]
        if self.program.device != "cpu":
            inputs = [_as_output(v, outs) for v in inputs]
        args = KernelArgs(self.xp, inputs, outs, ws, dict(ins.attrs), self.rng,
                          self.program.device)
        return [self._kernel(k, args), *extra]

    # -- kernel auto-tuning (engine.autotune) ------------------------------------------------
    def _tuner(self, tune: bool | Tuner | None) -> Tuner | None:
        """The tuner of a program with tunable instructions: ``tune`` (a Tuner, or True),
        or by default one with the cache file, unless ``tune=False`` or
        ``ENGINE_AUTOTUNE=0`` ask for the default variants."""
        if not self.program.tunable or tune is False or (tune is None and autotune_refused()):
            return None
        tuner = tune if isinstance(tune, Tuner) else Tuner()
        sync = self.backend.synchronize if self.program.device != "cpu" else None
        return tuner.attach(self.program, self._bind_winners, sync)

    def _kernel(self, k: int, args: KernelArgs) -> Step:
        ins = self.program.instrs[k]
        op = get_op(ins.op)
        if not ins.variants or self.autotune is None:
            return op.kernel(args)
        return self.autotune.kernel(
            k, lambda name: variant_named(ins.op, op.variants, name).kernel(args),
            self._batch == self.program.batch_size)

    def _bind_winners(self) -> None:
        """The tuner froze its decisions: bind again, the winners' steps directly."""
        self._bindings.clear()
        self._binding = self._bind(self._batch)

    def _bind_update(self, mask: int) -> tuple[Step, ...]:
        """Regularization then the optimizer update for the parameters in ``mask``."""
        prog, opt = self.program, self.program.optimizer
        if opt is None or mask == 0:
            return ()
        ws = self.heap.zones[WORKSPACE]
        steps: list[Step] = []
        for i in self._learned:
            ps = prog.params[i]
            if not mask >> i & 1 or ps.regularization is None:
                continue
            p, g = self._view(ps.buffer, 1), self._view(ps.grad, 1)  # type: ignore[arg-type]
            s = ws[: p.nbytes].view(p.dtype).reshape(p.shape)
            steps.append(_regularize(self.xp, ps.regularization.kind, ps.regularization.coef,
                                     p, g, s))
        dtype = region_dtype(self.program)
        if mask == self._all_learned and dtype is not None:
            n = prog.param_region // dtype.itemsize
            zones = self.heap.zones
            p = zones[FORWARD][: prog.param_region].view(dtype)
            g = zones[GRADIENT][: prog.param_region].view(dtype)
            state = [zones[OPTIMIZER][o : o + prog.param_region].view(dtype)
                     for o in prog.state_offsets]
            steps.append(opt.bind(self.xp, p, g, state, ws[: n * dtype.itemsize].view(dtype),
                                  self._t))
            return tuple(steps)
        for i in self._learned:
            if not mask >> i & 1:
                continue
            ps = prog.params[i]
            spec = prog.buffers[ps.buffer]
            p, g = self._view(ps.buffer, 1), self._view(ps.grad, 1)  # type: ignore[arg-type]
            state = [self.heap.view(OPTIMIZER, o + spec.offset, p.nbytes, p.dtype, p.shape)
                     for o in prog.state_offsets]
            s = ws[: p.nbytes].view(p.dtype).reshape(p.shape)
            steps.append(opt.bind(self.xp, p, g, state, s, self._t))
        return tuple(steps)

    # -- data in and out --------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """The batch the bindings currently run at (<= the compiled batch)."""
        return self._batch

    def set(self, name: str, value: Any, check: bool | None = None) -> None:
        """Feed ``value`` to placeholder ``name``.  Its leading dimension may be smaller
        than the compiled batch (the last mini-batch).  ``check`` (default: the VM's
        ``check_inputs``) looks for non-finite values first, except in an array
        :meth:`check` validated or a contiguous slice of it (checked once).

        A numpy array of the placeholder's dtype, C-contiguous and of at least
        :data:`IN_PLACE_BYTES` is *read in place*: the instructions read the caller's
        memory, as PyTorch reads a tensor, so changing the array before a step changes
        what the step reads; the VM keeps a reference to it until the placeholder is
        fed again.  Anything else (and everything on the GPU) is copied into the
        placeholder's heap buffer, whose bytes stay planned either way."""
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        i, spec = self._placeholder(name, arr.shape, arr.shape[0] if arr.ndim else 0)
        if (self.check_inputs if check is None else check) and not self._seen(name, arr):
            _check_values(name, arr, spec.dtype)
        if value is arr and self._in_place(arr, spec):
            self._read_in_place(i, arr)
        else:
            self._forget_external(i)
            try:
                self.backend.to_device(self._bind(self._batch).views[i], arr)
            except TypeError as e:
                raise InputError(f"placeholder {name!r} ({spec.dtype}) cannot take "
                                 f"{arr.dtype} data: {e}") from None
        self._fed.add(name)

    def gather(self, name: str, source: np.ndarray, rows: np.ndarray,
               check: bool | None = None) -> None:
        """``set(name, source[rows])`` with the rows copied straight into the heap (no
        intermediate array): how an epoch feeds shuffled mini-batches.  ``rows`` are
        integers in ``[0, len(source))`` (no negative indices)."""
        rows = np.asarray(rows)
        if rows.dtype.kind not in "iu":
            raise InputError(f"gather {name!r}: rows must be integers, not {rows.dtype}")
        # Seen as unsigned, a negative row is huge: one max() checks both ends.
        if len(rows) and int(rows.view(rows.dtype.str.replace("i", "u")).max()) >= \
                len(source):
            raise InputError(f"gather {name!r}: rows must lie in [0, {len(source)}); got "
                             f"values in [{int(rows.min())}, {int(rows.max())}]")
        shape = (len(rows), *source.shape[1:])
        i, spec = self._placeholder(name, shape, len(rows))
        if self.check_inputs if check is None else check:
            _check_values(name, source[rows], spec.dtype)
        if source.dtype != np.dtype(spec.dtype):
            raise InputError(f"placeholder {name!r} ({spec.dtype}) cannot take "
                             f"{source.dtype} data")
        self._forget_external(i)
        self.backend.gather_rows(self._bind(self._batch).views[i], source, rows)
        self._fed.add(name)

    def check(self, name: str, value: np.ndarray) -> None:
        """Raise :class:`InputError` if ``value`` (for placeholder ``name``) holds a
        non-finite value, or non-integers for an integer placeholder.  The same array
        is checked once (a data set fed epoch after epoch): changing it in place
        afterwards is not noticed."""
        i, _ = self._placeholder_index(name)
        seen = self._checked.get(name)
        if seen is not None and seen[0]() is value and seen[1] == _layout(value):
            return
        _check_values(name, value, self.program.buffers[i].dtype)
        self._checked[name] = (weakref.ref(value), _layout(value))

    def _seen(self, name: str, arr: np.ndarray) -> bool:
        """Whether ``arr`` is, or lies inside, the array :meth:`check` validated for
        ``name`` (a contiguous slice of a checked data set: same root buffer, same
        dtype, its bytes within the checked ones)."""
        seen = self._checked.get(name)
        whole = seen[0]() if seen is not None else None
        if whole is None or seen[1] != _layout(whole):  # type: ignore[index]
            return False
        if arr is whole:
            return True
        if arr.dtype != whole.dtype or not (arr.flags.c_contiguous and
                                            whole.flags.c_contiguous):
            return False
        if _root(arr) is not _root(whole):
            return False
        lo, at = _address(whole), _address(arr)
        return lo <= at and at + arr.nbytes <= lo + whole.nbytes

    def placeholder_dtype(self, name: str) -> np.dtype:
        """The element type of placeholder ``name``."""
        return np.dtype(self._placeholder_index(name)[1].dtype)

    def _placeholder_index(self, name: str) -> tuple[int, Any]:
        i = self._placeholders.get(name)
        if i is None:
            kind = self.program.buffers[self._names[name]].kind if name in self._names else None
            raise InputError(f"{name!r} is not a placeholder" + (f" (it is a {kind} variable)"
                             if kind else f"; placeholders: {sorted(self._placeholders)}"))
        return i, self.program.buffers[i]

    def _placeholder(self, name: str, shape: tuple[int, ...], batch: int) -> tuple[int, Any]:
        """The buffer of placeholder ``name`` after checking a value's shape, switched to
        that value's batch size."""
        i, spec = self._placeholder_index(name)
        if spec.desc.batched:
            if len(shape) != len(spec.shape) or tuple(shape[1:]) != spec.shape[1:] or \
                    not 1 <= batch <= self.program.batch_size:
                raise InputError(f"placeholder {name!r} expects shape (b, "
                                 f"{', '.join(map(str, spec.shape[1:]))}) with 1 <= b <= "
                                 f"{self.program.batch_size}, got {tuple(shape)}")
            if batch != self._batch:
                if self._fed:
                    raise InputError(f"placeholder {name!r} has batch {batch} but "
                                     f"{sorted(self._fed)} were set with batch {self._batch}")
                self._use_batch(batch)
        elif tuple(shape) != spec.shape:
            raise InputError(f"placeholder {name!r} expects shape {spec.shape}, got "
                             f"{tuple(shape)}")
        return i, spec

    def assign(self, name: str, value: Any) -> None:
        """Overwrite the values of parameter ``name`` (trained weights, a restart)."""
        i = self._index(name)
        spec = self.program.buffers[i]
        if spec.kind != "param":
            raise InputError(f"{name!r} is a {spec.kind} variable, not a parameter")
        arr = np.asarray(value)
        if tuple(arr.shape) != spec.shape:
            raise InputError(f"parameter {name!r} has shape {spec.shape}, got {arr.shape}")
        self.backend.to_device(self._bind(self._batch).views[i], arr)

    def feed(self, values: Mapping[str, Any]) -> None:
        """Set several placeholders at once."""
        for k, v in values.items():
            self.set(k, v)

    def view(self, name: str) -> Any:
        """The live device view of a variable at the current batch (no copy)."""
        i = self._index(name)
        if self.program.buffers[i].shared:
            raise InputError(f"variable {name!r} is a temporary whose memory other values "
                             "reuse, so it cannot be read back; declare it with "
                             "graph.output(...) or compile with keep=[...]")
        if self._stale:
            self._choose_binding()
        return self._binding.views[i]

    def get(self, name: str) -> np.ndarray:
        """A host copy of variable ``name`` at the current batch."""
        return self.backend.to_host(self.view(name))

    def grad(self, name: str) -> np.ndarray:
        """A host copy of the gradient of parameter ``name``."""
        i = self._index(name)
        for ps in self.program.params:
            if ps.buffer == i and ps.grad is not None:
                return self.backend.to_host(self._binding.views[ps.grad])
        raise InputError(f"{name!r} is not a parameter learned by a BACKWARD_ENABLED path")

    def _index(self, name: str) -> int:
        try:
            return self._names[name]
        except KeyError:
            raise InputError(f"no variable {name!r} in program {self.program.name!r}") from None

    def _use_batch(self, batch: int) -> None:
        self._batch = batch
        self._external.clear()  # arrays of the other batch size: fed again at this one
        self._stale = False
        self._binding = self._bind(batch)

    # -- placeholders read in place -------------------------------------------------------
    def _in_place(self, arr: np.ndarray, spec: Any) -> bool:
        """Whether the instructions can read ``arr`` where it is: host memory, the
        placeholder's exact dtype, C-contiguous, aligned, and large enough that the
        copy it saves costs more than binding the steps once to it."""
        return (arr.nbytes >= IN_PLACE_BYTES and is_numpy(self.xp)
                and arr.dtype == np.dtype(spec.dtype) and arr.flags.c_contiguous
                and arr.flags.aligned)

    def _read_in_place(self, i: int, arr: np.ndarray) -> None:
        old = self._external.get(i)
        if old is not None and _same_memory(old, arr):
            return  # the same array again: its binding is kept
        view = arr.view()
        view.flags.writeable = False  # no kernel may write the caller's memory
        self._external[i] = view
        self._stale = True

    def _forget_external(self, i: int) -> None:
        if self._external.pop(i, None) is not None:
            self._stale = True

    def _drop_external(self) -> None:
        """Read every placeholder from the heap again, and let the callers' arrays go
        (a model switched in reads its own data)."""
        self._external.clear()
        self._external_bindings.clear()
        self._stale = False
        self._binding = self._bind(self._batch)

    def _choose_binding(self) -> None:
        """Make ``self._binding`` the steps for the arrays now read in place: those of
        the heap when there are none, else bound to the arrays once, kept while they
        are fed (the few most recent sets of arrays: full-batch training feeds the same
        one every round)."""
        self._stale = False
        base = self._bind(self._batch)
        if not self._external:
            self._binding = base
            return
        key = (self._batch, *((i, _layout(a)) for i, a in sorted(self._external.items())))
        binding = self._external_bindings.pop(key, None)
        if binding is None:
            binding = self._bind_external(base)
            while len(self._external_bindings) >= EXTERNAL_BINDINGS:
                del self._external_bindings[next(iter(self._external_bindings))]
        self._external_bindings[key] = binding  # most recent last
        self._binding = binding

    def _bind_external(self, base: _Binding) -> _Binding:
        """The base binding with the placeholders of ``self._external`` read from the
        callers' arrays: a path none of whose instructions reads them keeps its steps;
        backward programs are bound on first use, as for the heap."""
        views = list(base.views)
        for i, a in self._external.items():
            views[i] = a
        ext = set(self._external)
        fwd = []
        for pi, p in enumerate(self.program.paths):
            if any(j in ext for k in p.forward for j in self.program.instrs[k].ins):
                fwd.append(tuple(s for k in p.forward
                                 for s in self._bind_instr(k, views, False)))
            else:
                fwd.append(base.forward[pi])
        return _Binding(views, fwd)

    # -- execution -----------------------------------------------------------------------
    def forward(self, path: int | str = 0) -> None:
        """Run the forward program of ``path``."""
        pi = self.program.path_index(path)
        if self._stale:
            self._choose_binding()
        for f in self._binding.forward[pi]:
            f()
        self._fed.clear()
        self._forwarded = pi

    def apply_loss(self, path: int | str = 0, scale: float = 1.0) -> None:
        """Seed the gradient of ``path``'s loss with ``scale`` (1: this batch is a whole
        learning batch; ``b / B`` for a technical batch of ``b`` out of ``B``)."""
        pc = self.program.paths[self.program.path_index(path)]
        if pc.seed is None:
            raise EngineError(f"path {pc.name!r} is FORWARD_ONLY: it has no loss to apply")
        self._binding.views[pc.seed].fill(scale)

    def backward(self, path: int | str = 0) -> None:
        """Run the backward program of ``path``, accumulating parameter gradients."""
        pi = self.program.path_index(path)
        if self._forwarded != pi:
            self._not_forwarded(pi)
        if self._stale:
            self._choose_binding()
        key = self._dirty & self._path_mask[pi]
        steps = self._binding.backward.get((pi, key))
        if steps is None:
            steps = self._bind_backward(pi, key)
        for f in steps:
            f()
        self._dirty |= self._path_mask[pi]

    def _not_forwarded(self, pi: int) -> None:
        name = self.program.paths[pi].name
        if self._forwarded < 0:
            raise EngineError(f"backward({name!r}) needs forward({name!r}) first")
        other = self.program.paths[self._forwarded].name
        raise EngineError(f"backward({name!r}) must follow forward({name!r}); forward({other!r}) "
                          f"ran since, and may reuse the memory of what the gradients read: "
                          f"run forward({name!r}) again")

    def _bind_backward(self, pi: int, key: int) -> tuple[Step, ...]:
        pc = self.program.paths[pi]
        if pc.seed is None:
            raise EngineError(f"path {pc.name!r} is FORWARD_ONLY: it has no backward program")
        views = self._binding.views
        steps: list[Step] = []
        for k in pc.backward:
            sink = self.program.instrs[k].param_sink
            steps.extend(self._bind_instr(k, views, sink is not None and bool(key >> sink & 1)))
        out = tuple(steps)
        self._binding.backward[(pi, key)] = out
        return out

    def optimize(self) -> None:
        """Update every parameter that has gradients, then mark them consumed."""
        if self.program.optimizer is None:
            raise EngineError("this program was compiled without an optimizer; pass "
                              "optimizer= to compile_graph")
        if self._dirty == 0:
            raise EngineError("optimize() found no gradients: run backward(path) first")
        self._t[0] += 1
        if self._dirty == self._all_learned:
            steps = self._flat_update
        else:
            steps = self._update_cache.get(self._dirty) or self._bind_update(self._dirty)
            self._update_cache[self._dirty] = steps
        for f in steps:
            f()
        self._dirty = 0

    def take_counters(self, other: VM) -> None:
        """Continue ``other``'s counters: the optimizer's step count, the rounds done and
        the random generator's state (what :func:`engine.runtime.members.move_member`
        carries besides the values).  Its gradients must have been consumed."""
        if other._dirty:
            raise EngineError("the source holds gradients optimize() has not consumed: "
                              "move a model between steps")
        self._reset(other._t[0], 0, other.round, other.backend.rng_state(other.rng))

    def end_round(self) -> int:
        """Mark the end of a training round (an epoch); returns the rounds done."""
        self.round += 1
        return self.round

    def train_step(self, path: int | str = 0) -> None:
        """forward + apply_loss + backward + optimize on the data already set."""
        self.forward(path)
        self.apply_loss(path)
        self.backward(path)
        self.optimize()

    def learn_batch(self, data: Mapping[str, np.ndarray], path: int | str = 0) -> None:
        """One optimizer step over a learning batch larger than the compiled (technical)
        batch: split it into technical batches and accumulate their gradients."""
        n = {len(v) for v in data.values()}
        if len(n) != 1:
            raise InputError(f"learn_batch: arrays have different lengths {sorted(n)}")
        total = n.pop()
        tech = self.program.batch_size
        for start in range(0, total, tech):
            stop = min(start + tech, total)
            self.feed({k: v[start:stop] for k, v in data.items()})
            self.forward(path)
            self.apply_loss(path, (stop - start) / total)
            self.backward(path)
        self.optimize()

    @property
    def allocated_bytes(self) -> int:
        """Bytes the heap holds (equals ``program.total_bytes`` for an own heap)."""
        return self.heap.allocated_bytes


def _as_output(view: Any, outs: list[Any]) -> Any:
    """The output ``view`` is, where the planner ran the instruction in place (the same
    memory, shape, strides and type): the output object itself.  CuPy's ufuncs copy an
    input that overlaps ``out=`` into a temporary unless the two are one object, so an
    in-place Relu or Add run with two views of one buffer would allocate at every step
    (all of an onnx ResNet's 67 allocations a step, measured on an H100)."""
    for o in outs:
        if (data_ptr(o) == data_ptr(view) and o.shape == view.shape
                and o.strides == view.strides and o.dtype == view.dtype):
            return o
    return view


def _regularize(xp: Any, kind: str, coef: float, p: Any, g: Any, s: Any) -> Step:
    if kind == "l2":
        def l2() -> None:
            xp.multiply(p, coef, out=s)
            xp.add(g, s, out=g)

        return l2
    if kind == "l1":
        def l1() -> None:
            xp.sign(p, out=s)
            xp.multiply(s, coef, out=s)
            xp.add(g, s, out=g)

        return l1
    raise EngineError(f"unknown regularization {kind!r}; known: l1, l2")


IN_PLACE_BYTES = 2 << 20
"""Arrays from this size on are read in place by :meth:`VM.set`; smaller ones are
copied.  Reading a new array in place costs binding the steps that read it once,
which for the paper MLP is about what copying 2 MiB costs (``docs/measurements.md``,
"The VM and the auto-tuner"); an array fed again is read with the steps already
bound."""

EXTERNAL_BINDINGS = 4
"""Sets of in-place arrays whose bindings a VM keeps (and whose arrays it keeps alive)."""


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _layout(a: np.ndarray) -> tuple[Any, ...]:
    return (_address(a), a.shape, a.strides, a.dtype)


def _root(a: np.ndarray) -> Any:
    """The object that owns ``a``'s memory (the first base that is not an array view)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base if a.base is not None else a


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return _layout(a) == _layout(b) and _root(a) is _root(b)


def _check_values(name: str, arr: np.ndarray, dtype: str) -> None:
    if arr.dtype.kind in "iub" and dtype.startswith("float"):
        return
    if arr.dtype.kind == "f":
        if dtype.startswith(("int", "uint", "bool")):
            raise InputError(f"placeholder {name!r} is {dtype}; got {arr.dtype} values")
        total = float(np.add.reduce(arr, axis=None))
        if not math.isfinite(total):
            bad = np.argwhere(~np.isfinite(arr))
            if len(bad):
                where = tuple(int(v) for v in bad[0])
                raise InputError(f"placeholder {name!r} holds {arr[where]} at index {where} "
                                 f"({len(bad)} non-finite value(s) in all)")


def _identity(program: Program) -> dict[str, Any]:
    """What a state stream's layout depends on: a file is read only into a program with
    the same (as JSON reads it back)."""
    return {"name": program.name, "zone_bytes": dict(program.zone_bytes),
            "state_bytes": program.state_bytes, "param_region": program.param_region}
