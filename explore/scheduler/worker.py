"""A worker process: one arena for its life, trials switched in and out of it.

The scheduler starts workers with the ``spawn`` method.  A worker maps the shared
data set (no copy on the CPU), measures its own fixed overhead and reports it, then
allocates its arena once, of the size the scheduler sends.  From then on it hosts
the trials the scheduler places in it, each in its own region of the arena (their
heaps are packed side by side), and runs them a round at a time, depth first (the
trial furthest along goes on; the others wait, ready, in their regions).  After each
round it reports the validation metrics and goes straight on with the same trial:
the pruner's answer comes back soon, and a "stop" ends the round it interrupts within
``engine.runtime.train.STOP_EVERY`` mini-batches: the worker never idles waiting for
it.  A *gated* trial (one the pruner may pause at a rung) instead waits for "continue"
after each report; "pause" tells it that the trial waits at a rung, so the worker
starts a trial not yet begun in the meantime.

Messages: :mod:`.protocol`; the scheduler's side: :mod:`.core` and :mod:`.loop`.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import multiprocessing
import os
import signal
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import Adam, compile_graph
from engine.models import paper_mlp
from engine.runtime.arena import Arena
from engine.runtime.heap import CalcHeap
from engine.runtime.members import member_losses, move_member
from engine.runtime.train import evaluate_metrics, train_epoch
from engine.runtime.vm import VM
from explore import metrics
from explore.metrics.evaluation import MEANS, ROWS, SUMS, Evaluation, compute_all
from explore.procmem import gpu_bytes, pss
from explore.scheduler.protocol import (
    SPENT,
    ArenaOpened,
    Continue,
    Done,
    Exit,
    OpenArena,
    Pause,
    Ready,
    Regroup,
    Regrouped,
    Report,
    Start,
    Stop,
    SwitchedOut,
    SwitchIn,
    SwitchOut,
    ToWorker,
    TrialFailed,
    state_file,
)
from explore.scheduler.shared_arrays import ArraySpec, attach
from explore.weights import save_weights


@dataclass
class Resident:
    number: int
    vm: Any
    rounds: int
    rng: np.random.Generator
    batch: int  # training mini-batch (the program may be compiled for a bigger one)
    offset: int  # its region of the arena, given back when the trial leaves
    nbytes: int
    validation: Validation  # what the eval path measures, and the metrics made of it
    gated: bool = False  # after a report, wait for "continue" (or "pause": at a rung)
    validate_every: int = 1  # validate after every k-th round, and after the last
    paused: bool = False  # at a rung: the worker may start another trial meanwhile
    round: int = 0
    runnable: bool = True
    started: float = field(default_factory=time.time)
    switches: int = 0
    busy_s: float = 0.0  # seconds it has run (training and validating)
    valid_s: float = 0.0  # of those, validating
    # A stack (Start.members): its trials in model order; otherwise [number].  The
    # others are a stack's alone: members still running, members whose word after a
    # report has not come (gated), members paused at a rung (the stack waits for the
    # scheduler's Regroup), and where each member's weights are written.
    members: list[int] = field(default_factory=list)
    live: set[int] = field(default_factory=set)
    waiting: set[int] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    save_to: dict[int, str | None] = field(default_factory=dict)
    losses: str | None = None  # the per-member training losses of a stack

    def __post_init__(self) -> None:
        if not self.members:
            self.members = [self.number]
        self.live = set(self.members) if not self.live else self.live

    @property
    def stacked(self) -> bool:
        return self.losses is not None

    def index(self, member: int) -> int | None:
        """The member's model in the program (None: the program runs one model)."""
        return self.members.index(member) if self.stacked else None

    def word(self, member: int, go: bool | None) -> None:
        """The scheduler's word on ``member``: go on (True), pause at a rung (False),
        or stop (None); what the resident may do next follows."""
        self.waiting.discard(member)
        self.held.discard(member)
        if go is None:
            self.live.discard(member)
        elif not go:
            self.held.add(member)
        self.paused = bool(self.held)
        self.runnable = not self.waiting and not self.held


def _cupy() -> Any:
    """The ``cupy`` module, which only a GPU worker uses."""
    import cupy  # noqa: PLC0415 (optional dependency: the gpu extra)

    return cupy


def release_heap_memory() -> None:
    """Hand the C heap's free memory back to the system (glibc's ``malloc_trim``): what
    a trial's set-up allocated and freed would otherwise stay counted in the worker."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


def warm_up(device: str = "cpu") -> None:
    """Run once, on a throwaway model, what every trial will run (a VM's set-up, training
    and validation steps, BLAS's first products, which allocate its buffers), so that
    the overhead measured next is what the worker costs with a model, not before one.
    On a GPU the model runs there: cuBLAS's handle and workspace and the compiled
    kernels exist from then on, and are in the device memory measured next."""
    rng = np.random.default_rng(0)
    x = rng.random((64, 64), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    vm = VM(compile_graph(paper_mlp((64, 256, 10)), batch_size=32, optimizer=Adam(),
                          device=device))
    train_epoch(vm, x, y, rng, batch=32)
    evaluate_metrics(vm, x, y, ("accuracy",), path="eval")
    a = rng.random((512, 512), dtype=np.float32)
    a @ a  # a product big enough for BLAS to use all of its packing buffers
    del vm, a
    gc.collect()
    release_heap_memory()
    if device == "gpu":  # the throwaway heap's blocks, which CuPy's pool would keep
        _cupy().get_default_memory_pool().free_all_blocks()


def device_overhead(device: str) -> int:
    """Fixed bytes this worker occupies on its device before any arena.  On the CPU its
    proportional set size: the interpreter, numpy and the engine, with the shared
    libraries the scheduler maps too counted at their share (a worker's resident size
    counts them whole, about 12 MB more, though starting it does not load them
    again).  On the GPU the device memory this process holds once its CUDA context and
    cuBLAS handle exist (:func:`explore.procmem.gpu_bytes`), or, where the driver does
    not list it, the device's memory in use (conservative: it includes what other
    processes hold, the workers started beside it among them)."""
    if device == "gpu":
        own = gpu_bytes()
        if own is not None:
            return own
        free, total = _cupy().cuda.runtime.memGetInfo()
        return int(total - free)
    return pss()


@dataclass
class Validation:
    """What a trial's validation pass reads from its eval path, and the metrics it
    computes from that (every registered metric whose outputs the program has)."""

    metrics: tuple[str, ...]
    means: tuple[str, ...]
    sums: tuple[str, ...]
    per_row: dict[str, np.ndarray]  # one host value per validation row (ROC AUC)
    target_std: float = 1.0

    @classmethod
    def of(cls, program: Any, valid_rows: int, target_std: float = 1.0,
           ) -> Validation:
        have = {b.name for b in program.buffers}
        names = tuple(n for n, m in metrics.METRICS.items()
                      if m.needs and all(o in have for o in m.needs))
        return cls(names, tuple(o for o in MEANS if o in have),
                   tuple(o for o in SUMS if o in have),
                   {o: np.empty(valid_rows, np.float32) for o in ROWS if o in have},
                   target_std)

    def measure(self, vm: Any, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """Every metric over the validation rows ``(x, y)``, by name."""

        return self._compute(self._evaluate(vm, x, y), y, None)

    def measure_members(self, vm: Any, x: np.ndarray, y: np.ndarray, models: int
                        ) -> list[dict[str, float]]:
        """:meth:`measure` for each model of a stack, from one pass over the rows (each
        output read holds one value per model)."""
        got = self._evaluate(vm, x, y)
        return [self._compute(got, y, k) for k in range(models)]

    def _evaluate(self, vm: Any, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        return evaluate_metrics(vm, x, y, self.means, check=False, sums=self.sums,
                                per_row=self.per_row)

    def _compute(self, got: dict[str, Any], y: np.ndarray, k: int | None) -> dict[str, float]:
        def of(v: Any) -> Any:
            return v if k is None else np.asarray(v)[k]

        ev = Evaluation(len(y), "regression" if "regression_sums" in got else
                        "classification", {m: of(got[m]) for m in self.means},
                        {m: of(got[m]) for m in self.sums}, self.per_row,
                        y if self.per_row else None, self.target_std)
        return compute_all(self.metrics, ev)


def clock_text(started: float, busy_s: float, valid_s: float = 0.0) -> str:
    """A trial's clock (when it started, the seconds it has run, the part of them spent
    validating) as its switched-out state's header keeps it: 48 hex digits whatever the
    times, so that the file's size, which the run records as the trial's bytes switched
    out, is the same in every run (the digits of a time in decimal are not).

    >>> clock_of(clock_text(1795767527.2922776, 0.5, 0.25)) == (1795767527.2922776, 0.5, 0.25)
    True
    >>> len(clock_text(0.0, 0.0)) == len(clock_text(1e9, 123.456, 7.5)) == 48
    True
    """
    return struct.pack("<ddd", started, busy_s, valid_s).hex()


def clock_of(text: str) -> tuple[float, float, float]:
    """:func:`clock_text`'s times, bit for bit."""
    started, busy_s, valid_s = struct.unpack("<ddd", bytes.fromhex(text))
    return started, busy_s, valid_s


class _Exit(BaseException):
    """The scheduler said exit (a BaseException: it passes the trial's error handler)."""


def diverged(loss: Any, which: str, round_: int) -> str | None:
    """The reason a trial whose ``which`` loss after round ``round_`` is NaN or
    infinite fails (checked once a round, on the host), or None.

    >>> diverged(float("nan"), "training", 1), diverged(0.3, "training", 1)
    ('diverged: training loss nan at round 1', None)
    """
    if loss is None or bool(np.all(np.isfinite(loss))):
        return None
    shown = float(loss) if np.ndim(loss) == 0 else np.asarray(loss).tolist()
    return f"diverged: {which} loss {shown} at round {round_}"


def process_main(conn: Any, data: dict[str, ArraySpec], device: str) -> None:
    """Entry point of a worker process: :func:`main`, tied to its driver's life."""
    stay_with_the_driver()
    os.environ.setdefault("CALCGRAPH_JIT", JIT_DEFAULT)  # before any kernel is bound
    main(conn, data, device)


JIT_DEFAULT = "0"
"""A worker runs the engine's numpy kernels unless ``CALCGRAPH_JIT=1`` is set: the
fused kernels (numba, :mod:`engine.ops.jit`) are 1.1-13x faster per op but numba's
LLVM adds about 130 MB to the worker's measured overhead, several times the worker's
own (``docs/measurements.md``), memory that a budget of a few hundred MB per worker
needs for trials."""


def main(conn: Any, data: dict[str, ArraySpec], device: str) -> None:
    """Entry point of a worker process (see the module docstring)."""
    arrays = attach(data)
    if device == "gpu":
        _cupy().cuda.runtime.getDeviceCount()
    warm_up(device)
    conn.send(Ready(device_overhead(device), os.getpid()))
    msg = conn.recv()
    if not isinstance(msg, OpenArena):
        return  # Exit before any arena
    arena = Arena(msg.nbytes, device)
    switch_dir = msg.switch_dir
    conn.send(ArenaOpened())
    residents: dict[int, Resident] = {}
    owner: dict[int, int] = {}  # a trial's number -> the resident (a stack) holding it
    order: list[int] = []
    running: list[int] = []  # the resident in the middle of a round, if any
    deferred: list[Regroup | SwitchOut] = []  # for that resident, at the round's end
    spent = dict.fromkeys(SPENT, 0.0)  # this worker's seconds, by what they went to

    def pick() -> int | None:
        """Depth first: the runnable trial furthest along; a trial not yet begun waits
        while another part way can run (it is ready for the moment that one ends, so
        the worker never idles between trials, and the pruner learns as early as it
        can).  One part way that waits for its word does not hold it back: in rotation
        that word comes only after the new trial's turn."""
        runnable = [n for n in order if residents[n].runnable]
        if not runnable:
            return None
        best = max(runnable, key=lambda n: (residents[n].round, -order.index(n)))
        if residents[best].round == 0 and any(r.round > 0 and not r.paused and r.runnable
                                              for r in residents.values()):
            return None
        return best

    def overhead_now() -> int:
        """This process's memory beyond the heaps of the trials it holds (their regions
        are in use, page for page): on the CPU, what its measured constant has become."""
        if device != "cpu":
            return 0
        return max(0, pss() - sum(r.nbytes for r in residents.values()))

    def drop(number: int) -> None:
        r = residents.pop(number, None)
        if number in order:
            order.remove(number)
        if r is not None:  # its region of the arena stops counting as used
            for m in r.members:
                if owner.get(m) == number:
                    del owner[m]
            r.vm = None
            arena.release(r.offset, r.nbytes)
            release_heap_memory()

    def host(number: int, prog: Any, offset: int, seed: int, rounds: int, batch: int,
             gated: bool, validation: Validation, members: list[int],
             save_to: dict[int, str | None], initialize: bool = True) -> Resident:
        t0 = time.perf_counter()
        region = arena.buffer[offset:offset + prog.total_bytes]
        vm = VM(prog, seed=seed, heap=CalcHeap(arena.backend, prog.zone_bytes, buffer=region),
                initialize=initialize)
        r = Resident(number, vm, rounds, np.random.default_rng(seed), batch, offset,
                     prog.total_bytes, validation, gated=gated, members=list(members),
                     save_to=save_to, losses=member_losses(prog))
        residents[number] = r
        for m in r.members:
            owner[m] = number
        order.append(number)
        spent["setup"] += time.perf_counter() - t0
        return r

    def regroup(msg: Regroup) -> None:
        """Move the stack's members into the parts, then drop the stack."""
        old = residents.get(msg.number)
        if old is None:  # it ended (its last round) before the regroup reached it
            conn.send(Regrouped(msg.number))
            return
        for part in msg.parts:
            r = host(part.number, part.program, part.offset, 0, old.rounds, old.batch,
                     old.gated, Validation.of(part.program, len(arrays["y_valid"]),
                                              old.validation.target_std),
                     list(part.members), {m: old.save_to.get(m) for m in part.members})
            for m in part.members:
                move_member(old.vm, old.index(m), r.vm, r.index(m))
            r.rng = copy.deepcopy(old.rng)
            r.round, r.started, r.switches, r.busy_s, r.valid_s = \
                old.round, old.started, old.switches, old.busy_s, old.valid_s
            r.validate_every = old.validate_every
            r.waiting = old.waiting & set(part.members)
            r.held = set(part.members) if part.paused else set()
            r.paused = part.paused
            r.runnable = not r.waiting and not r.held
        for m in old.members:  # those in no part end with the stack (not one gone out)
            if owner.get(m) == old.number:
                del owner[m]
        for part in msg.parts:
            for m in part.members:
                owner[m] = part.number
        drop(msg.number)
        conn.send(Regrouped(msg.number))

    def switch_out(msg: SwitchOut) -> None:
        """Write the trial's state to its file, then give its region back.  A stack's
        member (``msg.program``: its own, compiled apart) is written as that program's
        state (:meth:`VM.write_member_state`) and leaves the stack as a stopped member
        does (masked: trained on, no longer reported); the stack's region goes back
        once no member is left in it."""
        number = msg.number
        r = residents.get(owner.get(number, number))
        if r is None or number not in r.live:
            conn.send(TrialFailed(number, "could not be switched out: the worker does not "
                                          "hold it"))
            return
        if r.stacked and msg.program is None:
            leave(r, number)  # failed: as any trial that fails, it stops here
            conn.send(TrialFailed(number, "could not be switched out: a member of a stack "
                                          "leaves as its own program, and none was sent"))
            return
        t0 = time.perf_counter()
        try:
            os.makedirs(switch_dir, exist_ok=True)
            extra = {"rounds": r.rounds, "batch": r.batch, "gated": r.gated,
                     "validate_every": r.validate_every,
                     "target_std": r.validation.target_std, "save_to": r.save_to.get(number),
                     "round": r.round, "clock": clock_text(r.started, r.busy_s, r.valid_s),
                     "switches": r.switches, "data_order": r.rng.bit_generator.state}
            path = state_file(switch_dir, number)
            if r.stacked:
                nbytes = r.vm.write_member_state(r.index(number), msg.program, path, extra)
            else:
                nbytes = r.vm.write_state(path, extra=extra)
        except Exception as e:  # a full or read-only disk: the trial cannot wait out
            leave(r, number)
            conn.send(TrialFailed(number, f"could not be switched out: {type(e).__name__}: "
                                          f"{e}"))
            return
        leave(r, number)  # first: the memory is given back before the scheduler counts it so
        seconds = time.perf_counter() - t0
        spent["switch"] += seconds
        conn.send(SwitchedOut(number, nbytes, seconds, overhead_now(), dict(spent)))

    def leave(r: Resident, number: int) -> None:
        """Trial ``number`` leaves resident ``r``: a trial alone is dropped; a stack's
        member stops there, and the stack ends with its last member (unless a Regroup
        of it waits for the round's end)."""
        if not r.stacked:
            drop(r.number)
            return
        r.word(number, None)
        if owner.get(number) == r.number:
            del owner[number]
        if not r.live and not any(isinstance(d, Regroup) and d.number == r.number
                                  for d in deferred):
            drop(r.number)

    def switch_in(msg: SwitchIn) -> None:
        """Bind the trial's program at its new offset and read its state back into it,
        exactly as it left: it waits for its word (Continue)."""
        path = state_file(switch_dir, msg.number)
        t0 = time.perf_counter()
        try:
            r = host(msg.number, msg.program, msg.offset, 0, 0, 0, True,
                     Validation.of(msg.program, len(arrays["y_valid"])), [msg.number], {},
                     initialize=False)
            t0 = time.perf_counter()  # binding it counts as setup (host); reading it back here
            got = r.vm.read_state(path)
            r.rounds, r.batch, r.gated = got["rounds"], got["batch"], got["gated"]
            r.validate_every = got["validate_every"]
            r.validation.target_std = got["target_std"]
            r.save_to = {msg.number: got["save_to"]}
            r.round, r.switches = got["round"], got["switches"]
            r.started, r.busy_s, r.valid_s = clock_of(got["clock"])
            r.rng.bit_generator.state = got["data_order"]
            r.vm.check("x", arrays["x_train"])
            r.vm.check("y", arrays["y_train"])
        except Exception as e:  # a lost or corrupt file: the trial cannot resume
            drop(msg.number)
            conn.send(TrialFailed(msg.number, f"could not be switched back in: "
                                              f"{type(e).__name__}: {e}"))
            return
        with contextlib.suppress(OSError):
            os.unlink(path)  # read: the trial lives in the arena again
        spent["switch"] += time.perf_counter() - t0
        r.waiting, r.runnable = {msg.number}, False

    def handle(msg: ToWorker) -> None:
        match msg:
            case Exit():
                raise _Exit
            case Start():
                prog = msg.program
                members = list(msg.members) or [msg.number]
                saves = dict(zip(msg.members, msg.member_save_to, strict=True)) \
                    if msg.members else {msg.number: msg.save_to}
                try:
                    r = host(msg.number, prog, msg.offset, msg.seed, msg.rounds,
                             msg.train_batch, msg.gated,
                             Validation.of(prog, len(arrays["y_valid"]), msg.target_std),
                             members, saves)
                    r.vm.check("x", arrays["x_train"])
                    r.vm.check("y", arrays["y_train"])
                    r.validate_every = msg.validate_every
                except Exception as e:  # a candidate that cannot run: report it, go on
                    drop(msg.number)
                    for m in members:
                        conn.send(TrialFailed(m, f"{type(e).__name__}: {e}"))
                    return
            case Regroup():
                if running and running[0] == msg.number:
                    deferred.append(msg)  # at the end of the round it is in
                else:
                    regroup(msg)
            case SwitchOut(number):
                if running and running[0] == owner.get(number, number):
                    deferred.append(msg)  # a stack's member, at the round's end
                else:
                    switch_out(msg)
            case SwitchIn():
                switch_in(msg)
            case Continue(number) | Pause(number):
                if number in owner:
                    residents[owner[number]].word(number, isinstance(msg, Continue))
            case Stop(number):
                if number in owner:
                    r = residents[owner[number]]
                    r.word(number, None)
                    if not r.live and not (running and running[0] == r.number and deferred):
                        drop(r.number)

    def drain() -> None:
        while conn.poll(0):
            handle(conn.recv())

    def run_round(res: Resident, stopped: Any) -> None:
        """One round of ``res``, then its report (each member's, for a stack)."""
        xv, yv = arrays["x_valid"], arrays["y_valid"]
        try:
            t0 = time.perf_counter()
            loss = train_epoch(res.vm, arrays["x_train"], arrays["y_train"], res.rng,
                               batch=res.batch, stop=stopped, loss=res.losses)
            t1 = time.perf_counter()
            if loss is None:
                spent["lost"] += t1 - t0
                return
            spent["train"] += t1 - t0
            res.round += 1
            live = [m for m in res.members if m in res.live]
            losses = {m: loss if res.index(m) is None else loss[res.index(m)] for m in live}
            bad = {m: diverged(losses[m], "training", res.round) for m in live}
            measured: dict[int, dict[str, float]] = {m: {} for m in live}
            validated = res.round % res.validate_every == 0 or res.round >= res.rounds
            if validated and not all(bad.values()):
                if res.stacked:
                    every = res.validation.measure_members(res.vm, xv, yv, len(res.members))
                    measured = {m: every[res.members.index(m)] for m in live}
                else:
                    measured = {live[0]: res.validation.measure(res.vm, xv, yv)}
            t2 = time.perf_counter()
            spent["valid"] += t2 - t1
            res.valid_s += t2 - t1
            for m in live:  # a NaN or infinite loss never recovers: the trial fails now
                why = bad[m] or diverged(measured[m].get("loss", 0.0), "validation",
                                         res.round)
                if why:
                    conn.send(TrialFailed(m, why))
                    res.word(m, None)
            res.busy_s += time.perf_counter() - t0
            live = [m for m in live if m in res.live]
            saved, unsaved = set(), {}
            if res.round >= res.rounds:
                for m in live:
                    if res.save_to.get(m):
                        try:
                            save_weights(res.vm, res.save_to[m], member=res.index(m))  # type: ignore[arg-type]
                        except OSError as e:  # the model store full or read-only: the
                            unsaved[m] = f"its model could not be kept: {e}"  # result stands
                        else:
                            saved.add(m)
        except Exception:
            for m in [m for m in res.members if m in res.live]:
                conn.send(TrialFailed(m, traceback.format_exc(limit=3)))
            drop(res.number)
            return
        for m in live:
            measured[m]["train_loss"] = float(losses[m])
            measured[m]["train_seconds"] = res.busy_s
            measured[m]["valid_seconds"] = res.valid_s
        if res.round >= res.rounds or not live:
            drop(res.number)  # first: the memory is given back before the scheduler counts it so
            now = overhead_now()  # once for the stack: reading PSS walks every mapping
            for m in live:
                conn.send(Done(m, measured[m], res.round, res.switches, res.busy_s,
                               res.started, time.time(), now, m in saved,
                               unsaved.get(m, ""), dict(spent)))
            return
        # Ungated, the next round starts at once, before the pruner's answer: that answer
        # stops it within STOP_EVERY mini-batches if it is "prune".
        res.runnable = not res.gated
        if res.gated:
            res.waiting = set(live)
        now = overhead_now()
        for m in live:
            conn.send(Report(m, res.round, measured[m], res.started, now, dict(spent),
                             validated))

    last = -1
    try:
        while True:
            drain()
            nxt = pick()
            if nxt is None:
                handle(conn.recv())  # nothing to run: wait for the scheduler's word
                continue
            res = residents[nxt]
            if nxt != last:
                res.switches += 1
            last = nxt

            def stopped(number: int = nxt) -> bool:
                drain()  # a speculative round ends early when its trial is pruned
                return number not in residents

            running[:] = [nxt]
            try:
                run_round(res, stopped)
            finally:
                running.clear()
                while deferred:  # in order; those left are still in ``deferred``
                    msg = deferred.pop(0)
                    if isinstance(msg, Regroup):
                        regroup(msg)
                    else:
                        switch_out(msg)
    except (_Exit, EOFError, BrokenPipeError, ConnectionResetError):
        return  # told to, or the driver is gone: nothing to report to


def stay_with_the_driver() -> None:
    """Tie this worker's life to its driver's: the kernel kills it when the driver dies
    (even by ``kill -9``: Linux's parent-death signal), and Ctrl-C, which the terminal
    sends to every process of the group, is the driver's to handle (it stops the
    workers itself; a worker's own KeyboardInterrupt only printed tracebacks).  So are
    SIGTERM and SIGHUP, which systemd and SLURM send to every process of a job: a
    worker ended by one would have its trial failed as died instead of queued again."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(0)  # the driver died before the signal was set: nothing to work for
