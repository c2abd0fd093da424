"""Several ``explore run`` drivers on one study, as an operator starts them: a grid space
whose every point is one trial, processes started together, the study then checked."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
from optuna.trial import TrialState

from explore.live import counted
from explore.storages import connect, release
from explore.study import RECORD_ATTR


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``2m``) mounted at ``folder/disk`` for a disk that fills up
    (as root: the tests that use it skip otherwise), unmounted at the end."""
    disk = folder / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        raise AssertionError(f"cannot mount a tmpfs as root: {mounted.stderr}")
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
    among them, none is left running, and every failure says why."""
    ts = trials(storage, study)
    done = [t for t in ts if counted(t)]
    assert len(done) == total, Counter(t.state.name for t in ts)
    points = Counter(tuple(sorted(t.params.items())) for t in done)
    twice = [p for p, n in points.items() if n > 1]
    assert not twice, [(t.number, t.state.name, t.params, t.user_attrs[RECORD_ATTR].get("driver"),
                        t.datetime_start) for t in done
                       if tuple(sorted(t.params.items())) in twice]
    assert not [t.number for t in ts if t.state == TrialState.RUNNING]
    for t in ts:
        if t.state == TrialState.FAIL:
            assert t.user_attrs[RECORD_ATTR]["fail_reason"], t.number
    return ts


def pids_alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (zombies count as gone)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except (OSError, IndexError):
            pass
    return alive


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
        time.sleep(0.2)
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
