"""A worker's conversation with the scheduler: it greets it with its measured
overhead, opens the arena it is told, then runs its residents a round at a time,
handling each message as it comes (between rounds, and every few mini-batches within
one: a "stop" ends the round it interrupts)."""

from __future__ import annotations

import os
from typing import Any

from engine.runtime.arena import Arena
from engine.runtime.train import running_statistics
from explore.scheduler.protocol import (
    ArenaOpened,
    Attach,
    Continue,
    Exit,
    OpenArena,
    Pause,
    Ready,
    Regroup,
    Start,
    Stop,
    SwitchIn,
    SwitchOut,
    ToWorker,
    TrialFailed,
)
from explore.scheduler.shared_arrays import ArraySpec, attach
from explore.scheduler.worker.device import (
    cupy_module,
    device_overhead,
    numba_without_blas,
    warm_up,
)
from explore.scheduler.worker.residents import ArenaHost
from explore.scheduler.worker.rounds import run_round
from explore.scheduler.worker.switching import switch_in, switch_out
from explore.scheduler.worker.validation import Validation


class _Exit(BaseException):
    """The scheduler said exit (a BaseException: it passes the trial's error handler)."""


def main(conn: Any, data: dict[str, ArraySpec] | None, device: str) -> None:
    """Entry point of a worker process (see :mod:`explore.scheduler.worker`).  Without
    ``data`` (started ahead of its run: :mod:`explore.scheduler.prestart`) it warms up,
    then waits for :class:`Attach` to map the data set."""
    arrays = attach(data) if data is not None else None
    if device == "gpu":
        cupy_module().cuda.runtime.getDeviceCount()
    numba_without_blas()  # before the warm-up binds the first kernel
    warm_up(device)
    if arrays is None:
        try:
            msg = conn.recv()
        except (EOFError, ConnectionResetError):
            return  # the driver is gone, or never ran the run
        if not isinstance(msg, Attach):
            return  # Exit: the run did not need this worker
        arrays = attach(msg.data)
    conn.send(Ready(device_overhead(device), os.getpid()))  # measured with the data mapped
    msg = conn.recv()
    if not isinstance(msg, OpenArena):
        return  # Exit before any arena
    h = ArenaHost(conn, arrays, device, Arena(msg.nbytes, device), msg.switch_dir)
    conn.send(ArenaOpened())
    try:
        serve(h)
    except (_Exit, EOFError, BrokenPipeError, ConnectionResetError):
        return  # told to, or the driver is gone: nothing to report to


def serve(h: ArenaHost) -> None:
    """Run the residents until the scheduler says exit: depth first (:meth:`ArenaHost.pick`),
    a round at a time, its messages handled between rounds and within them."""
    last = -1
    while True:
        drain(h)
        nxt = h.pick()
        if nxt is None:
            handle(h, h.conn.recv())  # nothing to run: wait for the scheduler's word
            continue
        res = h.residents[nxt]
        if nxt != last:
            res.switches += 1
        last = nxt

        def stopped(number: int = nxt) -> bool:
            drain(h)  # a speculative round ends early when its trial is pruned
            return number not in h.residents

        h.running = nxt
        try:
            run_round(h, res, stopped)
        finally:
            h.running = None
            while h.deferred:  # in order; those left are still in ``deferred``
                msg = h.deferred.pop(0)
                if isinstance(msg, Regroup):
                    h.regroup(msg)
                else:
                    switch_out(h, msg)


def drain(h: ArenaHost) -> None:
    """Handle every message that has come, without waiting for one."""
    while h.conn.poll(0):
        handle(h, h.conn.recv())


def handle(h: ArenaHost, msg: ToWorker) -> None:
    """Carry out one message of the scheduler's (:mod:`explore.scheduler.protocol`); what
    touches the resident in the middle of a round waits for the round's end."""
    match msg:
        case Exit():
            raise _Exit
        case Start():
            prog = msg.program
            members = list(msg.members) or [msg.number]
            saves = dict(zip(msg.members, msg.member_save_to, strict=True)) \
                if msg.members else {msg.number: msg.save_to}
            try:
                r = h.host(msg.number, prog, msg.offset, msg.seed, msg.rounds,
                           msg.train_batch, msg.gated,
                           Validation.of(prog, h.valid_rows(), msg.target_std),
                           members, saves)
                r.vm.check("x", h.arrays["x_train"])
                r.vm.check("y", h.arrays["y_train"])
                r.validate_every = msg.validate_every
                r.refresh = msg.refresh_statistics if running_statistics(prog) else 0
            except Exception as e:  # a candidate that cannot run: report it, go on
                h.drop(msg.number)
                for m in members:
                    h.conn.send(TrialFailed(m, f"{type(e).__name__}: {e}"))
                return
        case Regroup():
            if h.running == msg.number:
                h.deferred.append(msg)  # at the end of the round it is in
            else:
                h.regroup(msg)
        case SwitchOut(number):
            if h.running == h.owner.get(number, number):
                h.deferred.append(msg)  # a stack's member, at the round's end
            else:
                switch_out(h, msg)
        case SwitchIn():
            switch_in(h, msg)
        case Continue(number) | Pause(number):
            if number in h.owner:
                h.residents[h.owner[number]].word(number, isinstance(msg, Continue))
        case Stop(number):
            if number in h.owner:
                r = h.residents[h.owner[number]]
                r.word(number, None)
                if not r.live and not (h.running == r.number and h.deferred):
                    h.drop(r.number)
