"""A trial switched out of the arena to its file (:func:`explore.scheduler.protocol.state_file`)
and back into any region with room, exactly as it left."""

from __future__ import annotations

import contextlib
import os
import struct
import time

from explore.scheduler.protocol import SwitchedOut, SwitchIn, SwitchOut, TrialFailed, state_file
from explore.scheduler.worker.residents import ArenaHost
from explore.scheduler.worker.validation import Validation


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


def switch_out(h: ArenaHost, msg: SwitchOut) -> None:
    """Write the trial's state to its file, then give its region back.  A stack's
    member (``msg.program``: its own, compiled apart) is written as that program's
    state (:meth:`VM.write_member_state`) and leaves the stack as a stopped member
    does (masked: trained on, no longer reported); the stack's region goes back
    once no member is left in it."""
    number = msg.number
    r = h.residents.get(h.owner.get(number, number))
    if r is None or number not in r.live:
        h.conn.send(TrialFailed(number, "could not be switched out: the worker does not "
                                        "hold it"))
        return
    if r.stacked and msg.program is None:
        h.leave(r, number)  # failed: as any trial that fails, it stops here
        h.conn.send(TrialFailed(number, "could not be switched out: a member of a stack "
                                        "leaves as its own program, and none was sent"))
        return
    t0 = time.perf_counter()
    try:
        os.makedirs(h.switch_dir, exist_ok=True)
        extra = {"rounds": r.rounds, "batch": r.batch, "gated": r.gated,
                 "validate_every": r.validate_every, "refresh": r.refresh,
                 "target_std": r.validation.target_std, "save_to": r.save_to.get(number),
                 "round": r.round, "clock": clock_text(r.started, r.busy_s, r.valid_s),
                 "switches": r.switches, "data_order": r.rng.bit_generator.state}
        path = state_file(h.switch_dir, number)
        if r.stacked:
            nbytes = r.vm.write_member_state(r.index(number), msg.program, path, extra)
        else:
            nbytes = r.vm.write_state(path, extra=extra)
    except Exception as e:  # a full or read-only disk: the trial cannot wait out
        h.leave(r, number)
        h.conn.send(TrialFailed(number, f"could not be switched out: {type(e).__name__}: "
                                        f"{e}"))
        return
    h.leave(r, number)  # first: the memory is given back before the scheduler counts it so
    seconds = time.perf_counter() - t0
    h.spent["switch"] += seconds
    h.conn.send(SwitchedOut(number, nbytes, seconds, h.overhead_now(), dict(h.spent)))


def switch_in(h: ArenaHost, msg: SwitchIn) -> None:
    """Bind the trial's program at its new offset and read its state back into it,
    exactly as it left: it waits for its word (Continue)."""
    path = state_file(h.switch_dir, msg.number)
    t0 = time.perf_counter()
    try:
        r = h.host(msg.number, msg.program, msg.offset, 0, 0, 0, True,
                   Validation.of(msg.program, h.valid_rows()), [msg.number], {},
                   initialize=False)
        t0 = time.perf_counter()  # binding it counts as setup (host); reading it back here
        got = r.vm.read_state(path)
        r.rounds, r.batch, r.gated = got["rounds"], got["batch"], got["gated"]
        r.validate_every, r.refresh = got["validate_every"], got["refresh"]
        r.validation.target_std = got["target_std"]
        r.save_to = {msg.number: got["save_to"]}
        r.round, r.switches = got["round"], got["switches"]
        r.started, r.busy_s, r.valid_s = clock_of(got["clock"])
        r.rng.bit_generator.state = got["data_order"]
        r.vm.check("x", h.arrays["x_train"])
        r.vm.check("y", h.arrays["y_train"])
    except Exception as e:  # a lost or corrupt file: the trial cannot resume
        h.drop(msg.number)
        h.conn.send(TrialFailed(msg.number, f"could not be switched back in: "
                                            f"{type(e).__name__}: {e}"))
        return
    with contextlib.suppress(OSError):
        os.unlink(path)  # read: the trial lives in the arena again
    h.spent["switch"] += time.perf_counter() - t0
    r.waiting, r.runnable = {msg.number}, False
