"""A paused model: everything it needs to resume exactly, in host memory.

That is the forward zone's parameter prefix (:attr:`Program.state_bytes`), the whole
optimizer zone, the gradients when the optimizer has not consumed them yet, the
step counter (Adam's bias correction), the rounds done and the random generator's
state (dropout masks).  Activations, placeholders and the workspace are not kept:
they are rewritten before they are read (set a model's inputs again after resuming).

A state can be written to disk and read back: one ``.npz`` file (numpy's own format,
read with ``allow_pickle=False``) holding the bytes and a JSON header with the
program, so a worker that dies does not lose a paused trial.

A state can also go straight between a heap and a file, with no host copy of it
(:meth:`VM.write_state`, :meth:`VM.read_state`: the *stream* format below), where the
host memory a copy would take is what a budget counts (explore's switched-out trials).

>>> from engine import Adam, compile_graph
>>> from engine.models import paper_mlp
>>> prog = compile_graph(paper_mlp((4, 3, 2)), batch_size=8, optimizer=Adam())
>>> s = initial_state(prog, seed=0)
>>> s.forward.nbytes == prog.state_bytes, s.optimizer.nbytes == prog.zone_bytes["optimizer"]
(True, True)
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.runtime import initializers
from engine.runtime.backends import Backend, get_backend
from engine.runtime.initializers import fill_initial, put_initial
from engine.runtime.optim import Optimizer, PerModelLR
from engine.runtime.program import Program
from engine.runtime.zones import OPTIMIZER

FORMAT = "calcgraph-model-state/1"
STREAM_FORMAT = "calcgraph-state-stream/1"
_MAGIC = b"CGSTATE\x01"
# A device's bytes cross to and from the file through a host buffer of at most this
# many bytes (pinned, on the GPU): bounded whatever the model.
STREAM_CHUNK = 4 << 20


@dataclass
class ModelState:
    program: Program
    forward: np.ndarray  # uint8, the parameter prefix of the forward zone
    optimizer: np.ndarray  # uint8, the optimizer zone
    gradient: np.ndarray  # uint8, the gradient region; meaningful when ``dirty``
    t: int = 0  # optimize() calls
    dirty: int = 0  # parameters holding gradients optimize() has not consumed (bit mask)
    round: int = 0
    rng: Any = None  # the backend's snapshot of the random generator

    @property
    def nbytes(self) -> int:
        """Host bytes this state holds."""
        return int(self.forward.nbytes + self.optimizer.nbytes + self.gradient.nbytes)

    def meta(self) -> dict[str, Any]:
        return {"format": FORMAT, "t": self.t, "dirty": self.dirty, "round": self.round,
                "rng": self.rng, "program": self.program.to_dict()}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write this state to ``path`` (atomically: a crash leaves no partial file)."""
        target = Path(path)
        header = np.array(json.dumps(self.meta(), default=_jsonable))
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, forward=self.forward, optimizer=self.optimizer,
                         gradient=self.gradient, header=header)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    @staticmethod
    def load(path: str | os.PathLike[str], backend: Backend | None = None) -> ModelState:
        """Read a state written by :meth:`save` (into host memory of ``backend``)."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["header"]))
                arrays = {k: z[k] for k in ("forward", "optimizer", "gradient")}
        except (OSError, ValueError, KeyError) as e:
            raise EngineError(f"{path}: not a saved model state ({e})") from None
        if meta.get("format") != FORMAT:
            raise EngineError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
        program = Program.from_json(json.dumps(meta["program"]))
        be = backend or get_backend(program.device)
        host = {k: be.host_alloc(v.nbytes) for k, v in arrays.items()}
        for k, v in arrays.items():
            np.copyto(host[k], v.view(np.uint8).reshape(-1))
        return ModelState(program, host["forward"], host["optimizer"], host["gradient"],
                          meta["t"], meta["dirty"], meta["round"], meta["rng"])


@dataclass
class Pieces:
    """A part of a stream made while it is written (see :func:`write_stream`):
    ``nbytes`` in all, drawn from ``pieces()`` in order, each a uint8 view (host or
    device, as a part) valid only until the next is drawn (a staging buffer reused).
    What a stacked model's member is written as (:meth:`VM.write_member_state`): its
    slices of the stack's heap between the bytes its own program keeps elsewhere."""

    nbytes: int
    pieces: Callable[[], Iterable[Any]]


def write_stream(path: str | os.PathLike[str], header: dict[str, Any], parts: list[Any],
                 backend: Backend) -> int:
    """Write ``header`` (JSON-able) and then the bytes of ``parts`` (uint8 views of a
    heap, or :class:`Pieces`, in order) to ``path``; returns the bytes written.  Host
    views go to the file as they are (no copy), device views through a host buffer of
    :data:`STREAM_CHUNK` bytes.  Atomic: written beside ``path``, then renamed, so a
    crash leaves no partial file under the name."""
    target = Path(path)
    head = json.dumps({**header, "parts": [int(p.nbytes) for p in parts]},
                      default=_jsonable).encode()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    written = 0
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            written += _write_all(f, memoryview(_MAGIC + len(head).to_bytes(8, "little") +
                                                head))
            chunk: list[Any] = []  # the host buffer, allocated on the first device bytes
            most = max((int(p.nbytes) for p in parts), default=0)
            for part in parts:
                if not isinstance(part, Pieces):
                    written += _write_part(f, part, chunk, most, backend)
                    continue
                n = sum(_write_part(f, piece, chunk, most, backend)
                        for piece in part.pieces())
                if n != part.nbytes:
                    raise EngineError(f"{path}: a part of {part.nbytes:,} bytes came as "
                                      f"{n:,}")
                written += n
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return written


def _write_part(f: Any, part: Any, chunk: list[Any], most: int, backend: Backend) -> int:
    """Write one uint8 view: a host one as it is, a device one through the host
    buffer ``chunk[0]`` (allocated here once, of at most :data:`STREAM_CHUNK` bytes)."""
    if isinstance(part, np.ndarray):
        return _write_all(f, part.data.cast("B"))
    if not chunk:
        chunk.append(backend.host_alloc(min(STREAM_CHUNK, most)))
    buf, written = chunk[0], 0
    for a in range(0, part.nbytes, len(buf)):
        piece = buf[: min(len(buf), part.nbytes - a)]
        backend.copy_out(piece, part[a : a + len(piece)])
        backend.synchronize()
        written += _write_all(f, piece.data)
    return written


def stream_header(f: Any, path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of a state stream (see :func:`write_stream`), read from the open
    binary file ``f`` (left at the first part's bytes)."""
    lead = f.read(len(_MAGIC) + 8)
    if len(lead) < len(_MAGIC) + 8 or lead[: len(_MAGIC)] != _MAGIC:
        raise EngineError(f"{path}: not a state stream ({STREAM_FORMAT})")
    size = int.from_bytes(lead[len(_MAGIC) :], "little")
    try:
        header: dict[str, Any] = json.loads(f.read(size))
    except ValueError as e:
        raise EngineError(f"{path}: a state stream's header is not JSON ({e})") from None
    if header.get("format") != STREAM_FORMAT:
        raise EngineError(f"{path}: format {header.get('format')!r}, expected "
                          f"{STREAM_FORMAT!r}")
    return header


def read_stream(f: Any, path: str | os.PathLike[str], parts: list[Any],
                backend: Backend) -> None:
    """Read the bytes that follow a stream's header into ``parts`` (uint8 views of a
    heap, each of the size the header lists): into host views directly, into device
    views through a host buffer of :data:`STREAM_CHUNK` bytes."""
    chunk = None
    for part in parts:
        if isinstance(part, np.ndarray):
            _read_all(f, part.data.cast("B"), path)
            continue
        if chunk is None:
            chunk = backend.host_alloc(min(STREAM_CHUNK, max(p.nbytes for p in parts)))
        for a in range(0, part.nbytes, len(chunk)):
            piece = chunk[: min(len(chunk), part.nbytes - a)]
            _read_all(f, piece.data, path)
            backend.copy_in(part[a : a + len(piece)], piece)
            backend.synchronize()  # the host buffer is reused next
    if f.read(1):
        raise EngineError(f"{path}: a state stream longer than its header says")


def _write_all(f: Any, view: memoryview) -> int:
    n = len(view)
    while view:
        view = view[f.write(view):]
    return n


def _read_all(f: Any, view: memoryview, path: str | os.PathLike[str]) -> None:
    while view:
        got = f.readinto(view)
        if not got:
            raise EngineError(f"{path}: a state stream cut short")
        view = view[got:]


def _jsonable(o: Any) -> Any:
    if isinstance(o, tuple | set):
        return list(o)
    if isinstance(o, np.integer):
        return int(o)
    raise TypeError(f"cannot serialise {type(o).__name__}")


def empty_state(program: Program, backend: Backend | None = None) -> ModelState:
    """Host buffers for a paused model of ``program`` (contents undefined)."""
    be = backend or get_backend(program.device)
    return ModelState(program, be.host_alloc(program.state_bytes),
                      be.host_alloc(program.zone_bytes[OPTIMIZER]),
                      be.host_alloc(program.param_region))


def region_dtype(program: Program) -> Any:
    """The element type of the learned parameters, if they all share one."""
    dts = {program.buffers[ps.buffer].dtype for ps in program.params if ps.grad is not None}
    return np.dtype(dts.pop()) if len(dts) == 1 else None


def initial_state(program: Program, seed: int = 0, backend: Backend | None = None
                  ) -> ModelState:
    """The state of a fresh model: parameters drawn from their inits (seeded), the
    optimizer's initial state, no gradients, the random generator seeded."""
    be = backend or get_backend(program.device)
    st = empty_state(program, be)
    st.forward.fill(0)
    st.optimizer.fill(0)
    st.gradient.fill(0)
    write_initial(program, seed, st.forward, st.optimizer, be, host=True)
    st.rng = seeded_rng_state(be, seed)
    return st


def seeded_rng_state(backend: Backend, seed: int) -> Any:
    """The state of ``backend``'s generator seeded with ``seed``."""
    return backend.rng_state(backend.rng(seed))


def write_initial(program: Program, seed: int, forward: Any, optimizer: Any,
                  backend: Backend, host: bool | None = None) -> None:
    """Write a fresh model into zeroed memory: each parameter, drawn from its init (a
    host generator seeded with ``seed``), into ``forward`` (the forward zone's
    parameter prefix, :attr:`Program.state_bytes` or more), and each optimizer slot's
    initial value into ``optimizer`` (the optimizer zone).  Both are uint8 arrays:
    host memory (a paused model's buffers, the CPU's heap) written in place, or
    ``backend``'s device memory (``host=False``; by default, whatever is not a numpy
    array), reached through a bounded host chunk and :meth:`Backend.copy_in`.

    The one writer of initial states, :func:`initial_state`'s and
    :meth:`VM.initialize`'s: host memory it takes is bounded by a constant
    (:data:`~engine.runtime.initializers.CHUNK` values), not by the model, but for a
    stacked parameter that interleaves its models, on a device (staged whole, see
    :func:`~engine.runtime.initializers.put_initial`)."""
    if host is None:
        host = isinstance(forward, np.ndarray)
    rng = np.random.default_rng(seed)
    for ps in program.params:
        spec = program.buffers[ps.buffer]
        dt = np.dtype(spec.dtype)
        place = forward[spec.offset : spec.offset + spec.desc.numel() * dt.itemsize]
        if host:
            fill_initial(ps.init, place.view(dt).reshape(spec.shape), rng)
        else:
            put_initial(ps.init, spec.shape, dt, rng, _putter(backend, place, dt.itemsize))
    if program.optimizer is None or not program.param_region:
        return
    dt, values = initial_slots(program)
    region = program.param_region
    for off, value in zip(program.state_offsets, values, strict=True):
        slot = optimizer[off : off + region].view(dt)
        if isinstance(value, list):  # runs (first, count, value) over a zeroed slot
            for first, count, v in value:
                slot[first : first + count].fill(v)
        elif isinstance(value, np.ndarray):  # a whole slot (PerModelLR, the only one, is runs)
            if host:
                slot[: len(value)] = value
            else:
                put = _putter(backend, optimizer[off : off + region], dt.itemsize)
                chunk = initializers.CHUNK
                buf = np.empty(min(chunk, len(value)), dtype=dt)
                for a in range(0, len(value), chunk):
                    piece = buf[: min(chunk, len(value) - a)]
                    piece[...] = value[a : a + len(piece)]
                    put(a, piece)
        elif value:
            slot.fill(value)


def initial_slots(program: Program) -> tuple[np.dtype[Any], tuple[Any, ...]]:
    """The element type of the optimizer's slots and what each starts from, as
    :func:`write_initial` writes it over the slot's :attr:`Program.param_region`
    bytes (zeroed first): a float filling the slot (none: zero), runs
    ``[(first, count, value)]`` over zeros, or an array of the slot's first values."""
    opt = program.optimizer
    dt = region_dtype(program) or np.dtype(np.float32)
    if opt is None or not program.param_region:
        return dt, ()
    layout = [(spec.offset // dt.itemsize, spec.desc.numel(), *_model_runs(ps.init, spec.shape))
              for ps in program.params if ps.grad is not None
              for spec in (program.buffers[ps.buffer],)]
    return dt, _slot_values(opt, layout)


def initial_bytes(value: Any, dt: np.dtype[Any], start: int, stop: int, buf: np.ndarray
                  ) -> Iterator[np.ndarray]:
    """Bytes ``[start, stop)`` of a slot that starts from ``value`` (see
    :func:`initial_slots`; 0 for memory :func:`write_initial` leaves zeroed), as host
    views of ``buf`` (uint8, at least two elements of ``dt``), one at a time: each is
    valid until the next is drawn.  What the bytes of a fresh model are outside its
    parameters, with no host copy of the model."""
    size = dt.itemsize
    step = (len(buf) // size - 1) * size  # a range not on elements spans one more
    for lo in range(start, stop, step):
        hi = min(stop, lo + step)
        first, last = lo // size, -(-hi // size)
        values = buf[: (last - first) * size].view(dt)
        _fill_elements(values, value, first)
        yield buf[lo - first * size : hi - first * size]


def _fill_elements(values: np.ndarray, value: Any, first: int) -> None:
    """Elements ``first, first + 1, ...`` of a slot starting from ``value``."""
    end = first + len(values)
    if isinstance(value, list):  # runs (first, count, value) over zeros
        values.fill(0)
        for a, count, v in value:
            lo, hi = max(a, first), min(a + count, end)
            if lo < hi:
                values[lo - first : hi - first] = v
    elif isinstance(value, np.ndarray):  # the slot's first values, zeros after
        values.fill(0)
        got = value[first:end]
        values[: len(got)] = got
    else:
        values.fill(value if value else 0)


def _putter(backend: Backend, place: Any, itemsize: int) -> Callable[[int, np.ndarray], None]:
    """Copy host values into the device bytes ``place`` from element ``first`` on, and
    wait for the copy (the host buffer is reused next)."""
    def put(first: int, values: np.ndarray) -> None:
        at = first * itemsize
        backend.copy_in(place[at : at + values.nbytes], values.reshape(-1).view(np.uint8))
        backend.synchronize()

    return put


def _model_runs(init: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``(inner,)`` for a stacked parameter whose models alternate every ``inner``
    elements (its model axis is not the first), else nothing."""
    if init.method != "stacked" or not init.model_axis:
        return ()
    return (math.prod(shape[init.model_axis + 1 :]),)


def _slot_values(opt: Optimizer, layout: list[tuple[int, ...]]) -> tuple[Any, ...]:
    """:meth:`Optimizer.slot_values`, with :class:`PerModelLR`'s rates (and momenta) as
    runs (:meth:`PerModelLR.per_model_runs`) rather than float64 arrays of the whole
    region."""
    if not isinstance(opt, PerModelLR):
        return opt.slot_values(layout)
    return (*_slot_values(opt.base, layout), *opt.per_model_runs(layout))
