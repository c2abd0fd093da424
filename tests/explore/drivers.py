"""Several ``explore run`` drivers on one study, as an operator starts them: a grid space
whose every point is one trial, processes started together, the study then checked."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
from optuna.trial import TrialState

from explore.live import counted
from explore.live.names import final_record
from explore.scheduler.shared_arrays import PREFIX
from explore.storages import connect, release
from explore.study import RECORD_ATTR
from tests.conftest import _unavailable


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``2m``) mounted at ``folder/disk`` for a disk that fills up,
    unmounted at the end.  Mounting needs root (and a container allowed to mount): where
    it cannot, the test skips, or fails under CI (``$CI``, as for PostgreSQL), so that
    a CI that cannot mount never passes these tests silently."""
    if os.name != "posix" or os.geteuid() != 0:
        _unavailable("mounting a small tmpfs needs root")
    disk = folder / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        _unavailable(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk: Path) -> Path:
    """Fill ``disk`` up with one file (returned: unlink it to make room again)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    return filler


GRID = """\
name: grid
dataset: {{name: digits, train: 300, valid: 100}}
budget: {{trials: {trials}, rounds: {rounds}, memory: {memory}, workers: {workers},
          grace: {grace}}}
sampler: grid
pruner: none
keep_models: {keep}
model:
  depth: 1
  width: {{choice: {widths}}}
  activation: relu
training:
  optimizer: adam
  lr: {{choice: {lrs}}}
  batch_size: 32
"""


def grid_space(folder: Path, points: int, rounds: int = 1, workers: int = 1,
               memory: str = "300MB", grace: float = 60, keep: int = 0) -> Path:
    """A grid of ``points`` trials (widths x learning rates), its total the grid;
    ``keep`` best models kept (``keep_models``)."""
    lrs = [0.001, 0.002, 0.005, 0.01, 0.02]
    n_lr = next(k for k in (5, 4, 2, 1) if points % k == 0)
    widths = [8 + 2 * i for i in range(points // n_lr)]
    f = folder / "grid.yaml"
    f.write_text(GRID.format(trials=points, rounds=rounds, memory=memory, workers=workers,
                             grace=grace, widths=widths, lrs=lrs[:n_lr], keep=keep))
    return f


def start(space: Path, storage: str, study: str = "grid", *extra: str) -> subprocess.Popen:
    """One driver: ``explore run`` in a process (and a process group) of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "explore.cli", "run", str(space), "--storage", storage,
         "--study", study, "--quiet", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def finish(procs: list[subprocess.Popen], timeout: float = 600) -> list[tuple[int, str]]:
    """Each driver's exit status and output, waiting at most ``timeout`` for all."""
    deadline = time.time() + timeout
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            text += "\n(killed: over the time limit)"
        out.append((p.returncode, text))
    return out


def finish_watching(p: subprocess.Popen, timeout: float = 600) -> tuple[int, str, list[int]]:
    """One driver's exit status and output, as :func:`finish`, and every process seen
    below it while it ran (looked at every 0.1 s: the workers it starts late, a dead
    one's replacement, are there too, which :func:`descendants` taken once misses)."""
    stream = p.stdout
    assert stream is not None
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.append(stream.read()), daemon=True)
    reader.start()
    family: dict[int, None] = {}
    deadline = time.time() + timeout
    while p.poll() is None and time.time() < deadline:
        family.update(dict.fromkeys(descendants(p.pid)))
        time.sleep(0.1)
    late = ""
    if p.poll() is None:
        p.kill()
        p.wait()
        late = "\n(killed: over the time limit)"
    reader.join(30)  # the pipe ends when the last process holding it does
    text = (said[0] if said else "(its output never ended: a process below it still "
            "holds the pipe)") + late
    return int(p.returncode), text, list(family)


def signal_once_said(p: subprocess.Popen, words: str, signum: int, timeout: float = 60) -> str:
    """Read the driver's output until a line holds ``words``, then send ``signum`` to its
    process group (it may have ended meanwhile); returns what was read.  Past ``timeout``
    the group is killed, so that a driver that never says them cannot hang the test."""
    assert p.stdout is not None
    watchdog = threading.Timer(timeout, _signal_group, (p.pid, signal.SIGKILL))
    watchdog.start()
    said = []
    try:
        for line in p.stdout:
            said.append(line)
            if words in line:
                _signal_group(p.pid, signum)
                break
    finally:
        watchdog.cancel()
    return "".join(said)


def _signal_group(pid: int, signum: int) -> None:
    """``signum`` to the process group of ``pid``, unless it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def shared_files(pid: int) -> list[str]:
    """The shared data files (``explore.scheduler.shared_arrays``) that the driver
    ``pid`` made and that are still there."""
    return glob.glob(f"/dev/shm/{PREFIX}{pid}-*")


def trials(storage: str, study: str = "grid") -> list[optuna.trial.FrozenTrial]:
    """The study's trials now; the connections closed again, as a reader that comes and
    goes would (a test polls many times while drivers write)."""
    opened = connect(storage, write=False)
    try:
        return optuna.load_study(study_name=study, storage=opened).get_trials(deepcopy=False)
    finally:
        release(opened)


def check_study(storage: str, total: int, study: str = "grid") -> list[optuna.trial.FrozenTrial]:
    """The study has exactly ``total`` counted trials, every grid point ran at most once
    among them, none is left running or queued, and every failure says why."""
    ts = trials(storage, study)
    done = [t for t in ts if counted(t)]
    assert len(done) == total, Counter(t.state.name for t in ts)
    points = Counter(tuple(sorted(t.params.items())) for t in done)
    twice = [p for p, n in points.items() if n > 1]
    assert not twice, [(t.number, t.state.name, t.params, t.user_attrs[RECORD_ATTR].get("driver"),
                        t.datetime_start, t.user_attrs.get("requeued_from"),
                        t.user_attrs[RECORD_ATTR].get("requeued_from")) for t in done
                       if tuple(sorted(t.params.items())) in twice] + [
        (t.number, t.state.name, t.params, final_record(t).get("fail_reason"),
         t.user_attrs.get("requeued_from"), t.datetime_start) for t in ts if not counted(t)]
    assert not [t.number for t in ts if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    for t in ts:
        if t.state == TrialState.FAIL:
            assert final_record(t).get("fail_reason"), t.number
    return ts


def pids_alive(pids: list[int], wait: float = 0) -> list[int]:
    """Those of ``pids`` that still run (zombies count as gone), after waiting at most
    ``wait`` seconds for them all to end."""
    deadline = time.time() + wait
    while True:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except (OSError, IndexError):
                pass
        if not alive or time.time() >= deadline:
            return alive
        time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, now."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def running_trials(storage: str, least: int, timeout: float = 120,
                   driver: subprocess.Popen | None = None) -> list[optuna.trial.FrozenTrial]:
    """The study's running trials once ``least`` of them are placed (their record has
    the worker, the arena offset and the planned bytes).  Past ``timeout`` it fails
    with the trials' states and, given the ``driver``, what it printed (it is ended)."""
    deadline = time.time() + timeout
    ts: list[optuna.trial.FrozenTrial] = []
    while time.time() < deadline:
        try:
            ts = trials(storage)
        except Exception:  # the study is not there yet
            ts = []
        placed = [t for t in ts if t.state == TrialState.RUNNING
                  and "worker" in t.user_attrs.get(RECORD_ATTR, {})]
        if len(placed) >= least:
            return placed
        if driver is not None and driver.poll() is not None:
            break  # it ended: no trial will run now
        time.sleep(0.05)
    said = ""
    if driver is not None:  # stopped as Ctrl-C does, so that its summary says why
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGINT)
        try:
            text = driver.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            text = driver.communicate()[0]
        said = "; the driver said:\n" + text[-3000:]
    raise AssertionError(f"fewer than {least} trials ever ran (the study: "
                         f"{[(t.number, t.state.name) for t in ts]}){said}")


def _write_locks(pid: int, inodes: set[int]) -> list[str]:
    """The POSIX write locks process ``pid`` holds on files of ``inodes``
    (``/proc/locks``: "N: POSIX ADVISORY WRITE PID MAJ:MIN:INODE START END")."""
    held = []
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if len(f) >= 8 and f[1] != "->" and f[1] == "POSIX" and f[3] == "WRITE" and \
                f[4] == str(pid) and int(f[5].rsplit(":", 1)[1]) in inodes:
            held.append(line)
    return held


def stop_between_writes(p: subprocess.Popen, files: list[Path], timeout: float = 30) -> None:
    """SIGSTOP driver ``p`` and its workers at a moment it holds no write lock on
    ``files`` (a SQLite database and its ``-shm``): stopped inside a write, it would
    hold every other driver off for as long as it stays stopped, which SQLite's own
    locking allows no way around (PostgreSQL ends such a session, see
    ``explore.storages._check.POSTGRES_OPTIONS``)."""
    inodes = {f.stat().st_ino for f in files if f.exists()}
    deadline = time.time() + timeout
    while True:
        os.killpg(p.pid, signal.SIGSTOP)
        time.sleep(0.01)  # the stop has landed on every thread
        if not _write_locks(p.pid, inodes):
            return
        os.killpg(p.pid, signal.SIGCONT)
        assert time.time() < deadline, "the driver never stopped writing"
        time.sleep(0.005)


def _open_for_writing(pids: list[int], folder: Path) -> list[str]:
    """The files under ``folder`` that any of ``pids`` holds open for writing now
    (``/proc/PID/fdinfo``'s flags, O_WRONLY or O_RDWR)."""
    held = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    flags = int(next(x for x in f if x.startswith("flags:")).split()[1], 8)
            except (OSError, StopIteration, ValueError):
                continue
            if target.startswith(f"{folder}/") and flags & os.O_ACCMODE in (os.O_WRONLY,
                                                                              os.O_RDWR):
                held.append(target)
    return held


def stop_with_nothing_open(p: subprocess.Popen, folder: Path, timeout: float = 30) -> None:
    """SIGSTOP driver ``p`` and its workers at a moment none of them holds a file under
    ``folder`` open for writing (a journal is opened for each append): a file system
    with a file open for writing cannot be remounted read-only ("busy")."""
    deadline = time.time() + timeout
    while True:
        os.killpg(p.pid, signal.SIGSTOP)
        time.sleep(0.01)  # the stop has landed on every thread
        if not _open_for_writing([p.pid, *descendants(p.pid)], folder):
            return
        os.killpg(p.pid, signal.SIGCONT)
        assert time.time() < deadline, "the driver never closed its files"
        time.sleep(0.005)


def stopped_by(space: Path, storage: str, fault: Callable[[], object], least: int = 2,
               timeout: float = 180, frozen: bool = False,
               closed: Path | None = None) -> tuple[subprocess.Popen, str]:
    """One driver on ``space``, and ``fault()`` once ``least`` of its trials run: it
    must stop by itself, exit 1, without a traceback, no worker of it left.  Returns
    the driver and what it printed.  ``frozen``: the driver and its workers are stopped
    (SIGSTOP) while the fault happens, so that it lands mid-run however fast the trials
    run (a server's own faults: the server ends the connections itself); with
    ``closed``, at a moment none holds a file under that folder open for writing."""
    driver = start(space, storage)
    running_trials(storage, least, driver=driver)
    family = descendants(driver.pid)
    if frozen and closed is not None:
        stop_with_nothing_open(driver, closed)
    elif frozen:
        os.killpg(driver.pid, signal.SIGSTOP)
    try:
        fault()
    finally:
        if frozen:
            os.killpg(driver.pid, signal.SIGCONT)
    (code, out), = finish([driver], timeout=timeout)
    assert code == 1, out
    assert "Traceback" not in out, out
    assert not pids_alive(family, wait=2), "a worker outlived its driver"
    return driver, out


def runs_again(space: Path, storage: str, total: int) -> None:
    """The next run on the study completes it exactly (:func:`check_study`)."""
    (code, out), = finish([start(space, storage)])
    assert code == 0, out
    check_study(storage, total)

