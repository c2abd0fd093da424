"""The worker's side of the protocol, driven in-process over a pipe: a trial goes on
after each report without waiting (speculative rounds) and a "stop" ends it at once;
a gated trial waits for "continue"; a trial switched out to a file and back in at
another offset goes on as if it had stayed, and a stack's member switched out alone
as if it had been regrouped; "exit" ends the worker mid-round."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import pytest

from explore import datasets
from explore.binding import bind
from explore.candidate import compile_candidate
from explore.datasets import load_digits, quantize
from explore.sampling import fixed
from explore.scheduler.placement import Stack
from explore.scheduler.protocol import (
    SECONDS,
    ArenaOpened,
    Continue,
    Done,
    Exit,
    FromWorker,
    OpenArena,
    Part,
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
    TrialFailed,
    state_file,
)
from explore.scheduler.shared_arrays import SharedArrays
from explore.scheduler.stacking import Drawn, compile_stack, graph_of, part_program
from explore.scheduler.worker import main
from explore.space import parse_space

ARENA = 8_000_000
# The checkout under test: the spawner script runs outside it, where `explore` could
# otherwise resolve to whatever checkout is installed.
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def worker(tmp_path: Path) -> Any:
    data = load_digits()
    scale = datasets.get("digits").pixel_scale
    pixels = {k: quantize(getattr(data, k).x, scale) for k in ("train", "valid")}
    arrays = SharedArrays({"x_train": pixels["train"], "y_train": data.train.y,
                           "x_valid": pixels["valid"], "y_valid": data.valid.y})
    ours, theirs = Pipe()
    thread = threading.Thread(target=main, args=(theirs, arrays.spec, "cpu"), daemon=True)
    thread.start()
    assert isinstance(ours.recv(), Ready)
    ours.send(OpenArena(ARENA, str(tmp_path / "switched")))
    assert ours.recv() == ArenaOpened()
    yield ours, thread
    ours.send(Exit())
    thread.join(timeout=30)
    arrays.close()
    assert not thread.is_alive()


def start(conn: Any, number: int, offset: int, rounds: int, gated: bool,
          seed: int | None = None) -> Any:
    """Start trial ``number`` (an MLP with dropout, under Adam); its program."""
    space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": rounds,
                                                         "memory": "64MB"},
                         "model": {"dropout": 0.2},
                         "training": {"optimizer": "adam", "batch_size": 8}})
    cand = compile_candidate(bind(space), fixed(space), ARENA // 2)
    conn.send(Start(number, cand.program, offset, number if seed is None else seed, rounds,
                    cand.train_batch, gated))
    return cand.program


def messages(conn: Any, until: Any, timeout: float = 60) -> list[FromWorker]:
    got = []
    while conn.poll(timeout):
        got.append(conn.recv())
        if until(got[-1]):
            return got
    raise AssertionError(f"no closing message; got {got}")


def test_an_ungated_trial_goes_on_without_waiting(worker: Any) -> None:
    conn, _ = worker
    start(conn, 0, 0, rounds=3, gated=False)
    got = messages(conn, lambda m: isinstance(m, Done))
    assert [(type(m), m.number, m.round) for m in got[:-1]] == [(Report, 0, 1), (Report, 0, 2)]
    assert isinstance(got[-1], Done) and got[-1].rounds == 3


def test_stop_ends_a_speculative_round(worker: Any) -> None:
    conn, _ = worker
    start(conn, 0, 0, rounds=50, gated=False)
    first = messages(conn, lambda m: isinstance(m, Report))[-1]
    assert isinstance(first, Report) and (first.number, first.round) == (0, 1)
    conn.send(Stop(0))
    start(conn, 1, ARENA // 2, rounds=1, gated=False)
    got = messages(conn, lambda m: isinstance(m, Done) and m.number == 1)
    # trial 0 may have sent a report or two before the stop arrived, never a Done
    assert all(isinstance(m, Report) and m.number == 0 for m in got[:-1])
    assert len(got) - 1 < 49


def test_a_gated_trial_waits_for_continue(worker: Any) -> None:
    conn, _ = worker
    start(conn, 0, 0, rounds=2, gated=True)
    first = messages(conn, lambda m: isinstance(m, Report))[-1]
    assert isinstance(first, Report) and (first.number, first.round) == (0, 1)
    assert not conn.poll(1.0)  # paused at the rung
    conn.send(Continue(0))
    last = messages(conn, lambda m: isinstance(m, Done))[-1]
    assert isinstance(last, Done) and last.number == 0


def measured(m: Any) -> dict[str, float]:
    return {k: v for k, v in m.metrics.items() if k not in SECONDS}


def test_a_trial_switched_out_and_back_in_elsewhere_goes_on_as_if_it_had_stayed(
        worker: Any, tmp_path: Path) -> None:
    conn, _ = worker
    start(conn, 0, 0, rounds=3, gated=True, seed=7)
    stayed = []
    for _ in range(3):
        stayed.append(messages(conn, lambda m: isinstance(m, Report | Done))[-1])
        conn.send(Continue(0))
    program = start(conn, 1, 0, rounds=3, gated=True, seed=7)  # the same trial again
    moved = [messages(conn, lambda m: isinstance(m, Report))[-1]]
    for offset in (ARENA // 2, 64):  # out, then in at another offset, twice
        conn.send(SwitchOut(1))
        out = messages(conn, lambda m: isinstance(m, SwitchedOut))[-1]
        assert isinstance(out, SwitchedOut) and out.number == 1 and out.nbytes > 0
        path = Path(state_file(str(tmp_path / "switched"), 1))
        assert path.stat().st_size == out.nbytes
        conn.send(SwitchIn(1, program, offset))
        assert not conn.poll(0.5)  # back, waiting for its word
        assert not path.exists()  # read: the trial lives in the arena again
        conn.send(Continue(1))
        moved.append(messages(conn, lambda m: isinstance(m, Report | Done))[-1])
    assert [measured(m) for m in moved] == [measured(m) for m in stayed]
    assert isinstance(moved[-1], Done) and moved[-1].rounds == 3


def test_a_state_that_cannot_be_written_or_read_fails_its_trial(worker: Any,
                                                                 tmp_path: Path) -> None:
    conn, _ = worker
    program = start(conn, 0, 0, rounds=3, gated=True)
    messages(conn, lambda m: isinstance(m, Report))
    (tmp_path / "switched").write_text("a file where the folder should be")
    conn.send(SwitchOut(0))
    failed = messages(conn, lambda m: isinstance(m, TrialFailed))[-1]
    assert isinstance(failed, TrialFailed) and failed.number == 0
    assert failed.reason.startswith("could not be switched out: ")
    conn.send(SwitchIn(5, program, 0))  # no state was ever written for it
    failed = messages(conn, lambda m: isinstance(m, TrialFailed))[-1]
    assert isinstance(failed, TrialFailed) and failed.number == 5
    assert failed.reason.startswith("could not be switched back in: ")
    start(conn, 6, 0, rounds=1, gated=False)  # the regions were given back
    assert isinstance(messages(conn, lambda m: isinstance(m, Done))[-1], Done)


MEMBERS = (10, 11, 12)


def start_stack(conn: Any, number: int, rounds: int) -> Stack:
    """Start a stack of three trials (an MLP with dropout under Adam, differing in
    learning rate) as ``number`` at offset 0, gated; what the scheduler knows of it."""
    space = parse_space({"dataset": "digits", "budget": {"trials": 3, "rounds": rounds,
                                                         "memory": "64MB", "stack": 3},
                         "model": {"dropout": 0.2},
                         "training": {"optimizer": "adam", "batch_size": 8}})
    bound, base = bind(space), fixed(space)
    drawn = [Drawn(None, {**base, "lr": lr}, graph_of(bound, {**base, "lr": lr}), False)
             for lr in (1e-3, 3e-3, 1e-2)]
    pending = compile_stack(bound, drawn, ARENA // 4)
    prog = pending.candidate.program
    conn.send(Start(number, prog, 0, 5, rounds, pending.candidate.train_batch, True,
                    members=MEMBERS, member_save_to=(None,) * len(MEMBERS)))
    return Stack(number, 0, prog.total_bytes, prog, MEMBERS,
                 dict(zip(MEMBERS, pending.graphs, strict=True)),
                 dict(zip(MEMBERS, pending.optimizers, strict=True)))


def to_the_end(conn: Any, trials: set[int]) -> dict[int, list[Any]]:
    """Continue each of ``trials`` after each report until every one is done; each
    one's messages (no other trial may report meanwhile)."""
    got: dict[int, list[Any]] = {n: [] for n in trials}
    left = set(trials)
    while left:
        m = messages(conn, lambda m: isinstance(m, Report | Done))[-1]
        assert m.number in trials, m
        got[m.number].append(m)
        if isinstance(m, Done):
            left.discard(m.number)
        else:
            conn.send(Continue(m.number))
    return got


def first_round(conn: Any) -> None:
    got = [messages(conn, lambda m: isinstance(m, Report))[-1] for _ in MEMBERS]
    assert sorted((m.number, m.round) for m in got) == [(n, 1) for n in MEMBERS]


def test_a_stacks_member_switched_out_alone_goes_on_as_if_regrouped(
        worker: Any, tmp_path: Path) -> None:
    """Member 11 of a stack of three, paused at its first rung, leaves for a file as
    its own program while 10 and 12 run on in the stack; switched back in elsewhere,
    it ends exactly as it does regrouped into a heap of its own.  The others end as
    they do when nobody leaves (a member out is masked, not removed)."""
    conn, _ = worker
    rounds = 3
    # Nobody leaves: every member continues.
    start_stack(conn, -1, rounds)
    stayed = to_the_end(conn, set(MEMBERS))
    # Regrouped: 11 paused alone beside the stack of the two others, then continued.
    stack = start_stack(conn, -2, rounds)
    first_round(conn)
    conn.send(Pause(11))
    for n in (10, 12):
        conn.send(Continue(n))
    own = part_program(stack, [11])
    conn.send(Regroup(-2, (Part(-3, part_program(stack, [10, 12]), ARENA // 4, (10, 12)),
                           Part(11, own, ARENA // 2, (11,), paused=True))))
    assert messages(conn, lambda m: isinstance(m, Regrouped))[-1] == Regrouped(-2)
    to_the_end(conn, {10, 12})
    conn.send(Continue(11))
    regrouped = to_the_end(conn, {11})[11]
    # Switched out of the stack, the others on to their end, then back in elsewhere.
    stack = start_stack(conn, -4, rounds)
    first_round(conn)
    conn.send(Pause(11))
    conn.send(SwitchOut(11, part_program(stack, [11])))
    out = messages(conn, lambda m: isinstance(m, SwitchedOut))[-1]
    path = Path(state_file(str(tmp_path / "switched"), 11))
    assert isinstance(out, SwitchedOut) and out.number == 11
    assert path.stat().st_size == out.nbytes
    for n in (10, 12):
        conn.send(Continue(n))
    others = to_the_end(conn, {10, 12})  # and no word from 11 meanwhile
    assert path.exists()
    conn.send(SwitchIn(11, own, ARENA // 2 + 4096))
    assert not conn.poll(0.5)  # back, waiting for its word
    assert not path.exists()
    conn.send(Continue(11))
    switched = to_the_end(conn, {11})[11]
    assert [measured(m) for m in switched] == [measured(m) for m in regrouped]
    assert [m.round if isinstance(m, Report) else m.rounds for m in switched] == [2, 3]
    for n in (10, 12):
        assert [measured(m) for m in others[n]] == [measured(m) for m in stayed[n][1:]]


def test_a_stacks_member_without_its_own_program_cannot_leave(worker: Any) -> None:
    conn, _ = worker
    start_stack(conn, -1, 2)
    first_round(conn)
    conn.send(Pause(11))
    conn.send(SwitchOut(11))  # no program: it cannot be written as one of its own
    failed = messages(conn, lambda m: isinstance(m, TrialFailed))[-1]
    assert isinstance(failed, TrialFailed) and failed.number == 11
    assert "own program" in failed.reason
    for n in (10, 12):
        conn.send(Continue(n))
    assert set(to_the_end(conn, {10, 12})) == {10, 12}  # the stack goes on without it


SPAWNER = '''
import os, sys
if __name__ == "__mp_main__":  # this script re-run in the child, as spawn does by default
    open(os.environ["MARKER"], "w").close()

def main():
    import contextlib
    import multiprocessing as mp
    from explore.scheduler.processes import main_left_behind
    ctx = mp.get_context("spawn")
    with main_left_behind() if sys.argv[1] == "left" else contextlib.nullcontext():
        p = ctx.Process(target=os.getpid)
        p.start()
    p.join()
    assert p.exitcode == 0

if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize("how", ["left", "default"])
def test_workers_start_without_the_parents_main_script(tmp_path: Any, how: str) -> None:
    """A worker needs nothing from the script that started the run; re-running it in
    each worker (spawn's default) charged its imports to every worker's overhead."""
    script, marker = tmp_path / "spawner.py", tmp_path / "imported"
    script.write_text(SPAWNER)
    subprocess.run([sys.executable, str(script), how], check=True, timeout=60,
                   env={**os.environ, "MARKER": str(marker), "PYTHONPATH": str(ROOT)})
    assert marker.exists() == (how == "default")


def test_workers_start_without_vfork() -> None:
    """While a vfork child has not exec'd, /proc shows the parent's memory in it too, and
    a sum of the run's PSS counts the scheduler twice: workers are forked instead."""
    import subprocess

    from explore.scheduler.processes import forked_not_vforked

    before = subprocess._USE_VFORK  # type: ignore[attr-defined]
    with forked_not_vforked():
        assert subprocess._USE_VFORK is False  # type: ignore[attr-defined]
    assert subprocess._USE_VFORK is before  # type: ignore[attr-defined]


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc")
def test_a_big_trials_set_up_stays_inside_its_heap_and_gives_it_back() -> None:
    """A worker process of its own: while it sets up and trains a 4M-parameter MLP with
    Adam (a 70 MB heap), its memory beyond the heap (what it reports, and its resident
    size sampled from outside) stays within a few MB of its measured constant; once the
    trial is done, its region's pages are given back."""
    import multiprocessing as mp
    import time

    from explore.procmem import rss
    from explore.scheduler.processes import spawn

    space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 2,
                                                         "memory": "1GB"},
                         "model": {"depth": 2, "width": 2048},
                         "training": {"optimizer": "adam", "batch_size": 32}})
    cand = compile_candidate(bind(space), fixed(space), 400_000_000)
    heap = cand.program.total_bytes
    assert heap > 60_000_000
    data = load_digits()
    scale = datasets.get("digits").pixel_scale
    with SharedArrays({"x_train": quantize(data.train.x, scale), "y_train": data.train.y,
                       "x_valid": quantize(data.valid.x, scale),
                       "y_valid": data.valid.y}) as arrays:
        w = spawn(mp.get_context("spawn"), 0, arrays.spec, "cpu", 1)
        try:
            ready = w.conn.recv()
            assert isinstance(ready, Ready)
            w.conn.send(OpenArena(heap + 4096))
            assert isinstance(w.conn.recv(), ArenaOpened)
            base = rss(ready.pid)
            peak = 0
            w.conn.send(Start(0, cand.program, 0, 0, 2, cand.train_batch, False))
            got: list[FromWorker] = []
            while not any(isinstance(m, Done) for m in got):
                peak = max(peak, rss(ready.pid))
                if w.conn.poll(0.005):
                    got.append(w.conn.recv())
            time.sleep(0.05)
            after = rss(ready.pid)
        finally:
            w.conn.send(Exit())
            w.process.join(timeout=30)
    report = next(m for m in got if isinstance(m, Report))
    done = got[-1]
    assert isinstance(done, Done)
    mb = 1_000_000
    assert report.overhead - ready.overhead < 8 * mb, (report.overhead, ready.overhead)
    assert done.overhead - ready.overhead < 8 * mb, (done.overhead, ready.overhead)
    assert peak - base < heap + 8 * mb, (peak - base, heap)
    assert after - base < 8 * mb, (after - base, heap)  # the heap's pages went back


def test_a_compiled_worker_loads_numba_without_scipy() -> None:
    """numba's BLAS check would load scipy's BLAS bindings (scipy.linalg and what it
    imports) into every compiled worker, memory charged to the budget for nothing: the
    engine's kernels call no BLAS from compiled code.  The worker maps numba's LLVM and
    none of scipy.linalg's libraries, and its compiled kernels run (its warm-up trained
    with them)."""
    pytest.importorskip("numba")
    import multiprocessing as mp

    import numpy as np

    from explore.scheduler.processes import await_ready, spawn

    with SharedArrays({"x": np.zeros((4, 4), np.float32)}) as arrays:
        w = spawn(mp.get_context("spawn"), 0, arrays.spec, "cpu", 1, jit="1")
        try:
            await_ready(w)
            maps = Path(f"/proc/{w.pid}/maps").read_text()
        finally:
            w.conn.send(Exit())
            w.process.join(timeout=30)
    assert "llvmlite" in maps  # the fused kernels are on
    assert "/scipy/linalg/" not in maps  # (numba imports scipy itself, for its version)


def test_numba_without_its_blas_check_still_runs_the_fused_kernels() -> None:
    """In a fresh process, as in a worker: after numba_without_blas the fused kernels
    load and run (the warm-up trains with them), no scipy.linalg module is loaded, and
    scipy.linalg can still be imported afterwards."""
    pytest.importorskip("numba")
    pytest.importorskip("scipy")
    code = (
        "import sys\n"
        "from explore.scheduler.worker.device import numba_without_blas, warm_up\n"
        "numba_without_blas()\n"
        "warm_up()\n"
        "from engine.ops import jit\n"
        "assert jit.kernels() is not None, 'the fused kernels did not load'\n"
        "assert not [m for m in sys.modules if m.startswith('scipy.linalg')]\n"
        "import scipy.linalg\n"
        "print('ok')\n")
    env = {**os.environ, "CALCGRAPH_JIT": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
