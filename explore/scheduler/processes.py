"""Starting, greeting and ending the worker processes.

Workers are spawned (not forked: no inherited locks, and the same code on every OS),
each with its share of the cores for BLAS and without re-running the parent's main
script.  A worker answers :class:`explore.scheduler.protocol.Ready` with its measured overhead,
then allocates the arena it is told (:class:`explore.scheduler.protocol.OpenArena`).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from multiprocessing.context import SpawnContext

from engine.free_list import FreeList
from explore.scheduler.errors import SchedulerError
from explore.scheduler.kernels import jit_set
from explore.scheduler.placement import Worker
from explore.scheduler.protocol import ArenaOpened, Attach, Exit, FromWorker, OpenArena, Ready
from explore.scheduler.shared_arrays import ArraySpec
from explore.scheduler.worker import process_main as worker_main

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


@contextlib.contextmanager
def thread_share(workers: int) -> Iterator[None]:
    """Give each spawned worker its share of the cores for BLAS (unless the user set
    the thread counts): W workers each using every core would fight over them."""
    cores = os.cpu_count() or 1
    saved = {k: os.environ.get(k) for k in THREAD_VARS}
    for k in THREAD_VARS:
        if saved[k] is None:
            os.environ[k] = str(max(1, cores // workers))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


@contextlib.contextmanager
def main_left_behind() -> Iterator[None]:
    """Start spawned workers without re-importing the parent's ``__main__``.

    By default a spawned child runs the parent's main script (as ``__mp_main__``) so
    that objects defined there unpickle; a worker needs none of it (its target is
    :func:`explore.scheduler.worker.main`), yet would hold everything that script imports (a
    script importing optuna makes each worker's PSS well over half again as big), all
    of it charged to the budget as fixed overhead.  ``multiprocessing`` skips a main
    module whose spec is named ``__main__`` (as it does for ``python -m pkg``), so the
    spec says so while the worker starts."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = getattr(main, "__spec__", None)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        main.__spec__ = saved


@contextlib.contextmanager
def forked_not_vforked() -> Iterator[None]:
    """Start child processes with fork + exec rather than vfork + exec.

    Between a vfork and its exec the child borrows the parent's whole address space,
    and ``/proc`` reports that memory for both: anything that sums the PSS of the run's
    processes at that instant (the run's own sampler, or a user's) counts the scheduler
    twice, over the budget by the scheduler's size for a moment.  After a fork the pages are shared
    copy-on-write and their PSS is split, so the sum stays true; it costs a copy of the
    page tables (milliseconds) per worker started.  ``subprocess._USE_VFORK`` is the
    switch CPython documents for this, and multiprocessing reads it."""
    saved = getattr(subprocess, "_USE_VFORK", None)
    if saved is None:  # before Python 3.11 (no vfork) or after a rename: nothing to do
        yield
        return
    subprocess._USE_VFORK = False  # type: ignore[misc]
    try:
        yield
    finally:
        subprocess._USE_VFORK = saved  # type: ignore[misc]


@contextlib.contextmanager
def one_gpu(device: str, ordinal: int) -> Iterator[None]:
    """Start a GPU worker seeing only GPU ``ordinal`` (as its device 0), through
    ``CUDA_VISIBLE_DEVICES``: then no library in it (cupy, a user's model code) can
    touch another device, and its overhead is read on its own.  An ordinal counts
    within the parent's ``CUDA_VISIBLE_DEVICES`` where that is set, as CUDA's do."""
    if device != "gpu":
        yield
        return
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [v.strip() for v in saved.split(",")] if saved else None
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[ordinal] if visible else str(ordinal)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def spawn(ctx: SpawnContext, index: int, data: dict[str, ArraySpec] | None, device: str,
          workers: int, ordinal: int = 0, jit: str | None = None) -> Worker:
    """Start worker ``index`` of ``workers`` on device ``ordinal`` (it reports its
    overhead later: see :func:`await_ready`), its kernels numpy's or compiled as
    ``jit`` says (:mod:`explore.scheduler.kernels`; None: as this process's
    environment says).  Without ``data`` it warms up and waits for :func:`attach_data`
    (:mod:`explore.scheduler.prestart`)."""
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=worker_main, args=(child, data, device),
                       name=f"explore-worker-{index}", daemon=True)
    with thread_share(workers), main_left_behind(), forked_not_vforked(), \
            one_gpu(device, ordinal), \
            jit_set(jit) if jit is not None else contextlib.nullcontext():
        proc.start()
    child.close()
    return Worker(index, proc, parent, device=ordinal)


def attach_data(w: Worker, data: dict[str, ArraySpec]) -> None:
    """Give a worker spawned without data the run's data set (it answers Ready once it
    has mapped it: :func:`await_ready`)."""
    try:
        w.conn.send(Attach(data))
    except (BrokenPipeError, OSError):
        w.process.join(timeout=5)
        raise SchedulerError(f"worker {w.index} exited while starting (exit code "
                             f"{w.process.exitcode})") from None


def receive(w: Worker, timeout: float) -> FromWorker:
    """The worker's next message, waiting at most ``timeout`` seconds (used while it
    starts: a worker that dies or stays silent then stops the run)."""
    try:
        if w.conn.poll(timeout):
            msg: FromWorker = w.conn.recv()
            return msg
    except (EOFError, OSError):
        w.process.join(timeout=5)
        raise SchedulerError(f"worker {w.index} exited while starting (exit code "
                             f"{w.process.exitcode})") from None
    raise SchedulerError(f"worker {w.index} did not answer in {timeout:.0f} s")


def await_ready(w: Worker) -> Worker:
    """Wait for ``w`` to start and record its overhead and process id."""
    msg = receive(w, timeout=120)
    if not isinstance(msg, Ready):
        raise SchedulerError(f"worker {w.index} sent {msg!r} before it was ready")
    w.overhead, w.pid = msg.overhead, msg.pid
    return w


def open_arena(w: Worker, nbytes: int, switch_dir: str = "") -> None:
    """Have ``w`` allocate its arena of ``nbytes``, all of it free; ``switch_dir``: where
    it writes the states of trials switched out of it."""
    w.conn.send(OpenArena(nbytes, switch_dir))
    msg = receive(w, timeout=120)
    if not isinstance(msg, ArenaOpened):
        raise SchedulerError(f"worker {w.index} sent {msg!r} instead of opening its arena")
    w.arena = nbytes
    w.free = FreeList([(0, nbytes)])


def stop_all(workers: Iterable[Worker]) -> None:
    """Tell every worker to exit; kill those that do not within 10 seconds."""
    workers = list(workers)
    for w in workers:
        with contextlib.suppress(BrokenPipeError, OSError):
            w.conn.send(Exit())
    for w in workers:
        w.process.join(timeout=10)
        if w.process.is_alive():
            w.process.kill()
