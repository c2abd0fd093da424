"""A shared-memory file system too small for the data set (a container's default
``/dev/shm`` is 64 MB): the run is refused before a byte is written, with what is
needed and how to make room, instead of dying of SIGBUS ("Bus error") on the first page
that cannot be backed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from explore.scheduler import shared_arrays
from explore.scheduler.shared_arrays import SharedArrays, SharedMemoryFull
from tests.conftest import _unavailable
from tests.explore.drivers import small_disk

SPACE = """\
name: big
dataset: {name: digits}
budget: {trials: 2, rounds: 1, memory: 400MB, workers: 1}
sampler: {name: random, seed: 0}
pruner: none
model: {depth: 1, width: 16, activation: relu}
training: {optimizer: adam, lr: 0.01, batch_size: 32}
"""


def test_an_array_with_no_room_is_refused_and_leaves_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with small_disk(tmp_path, "64k") as disk:
        monkeypatch.setattr(shared_arrays, "_directory", lambda: str(disk))
        shared = SharedArrays({"small": np.ones(1_000, np.float32)})
        with pytest.raises(SharedMemoryFull, match=r"has no room for the data set's 'big' "
                                                   r"\(400,000 bytes, 404,032 in all"):
            shared.put("big", np.ones(100_000, np.float32))
        assert shared.arrays["small"].sum() == 1_000  # what fitted is there
        shared.close()
        assert not list(disk.iterdir())


def test_a_run_on_a_small_dev_shm_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """``explore run`` in a mount namespace of its own whose ``/dev/shm`` holds 64 KB
    (the digits' rows take 115 KB): exit 2, the message, no study written."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        _unavailable("a /dev/shm of its own needs root and unshare")
    space = tmp_path / "big.yaml"
    space.write_text(SPACE)
    script = (f"mount -t tmpfs -o size=64k tmpfs /dev/shm && exec {sys.executable} -m "
              f"explore.cli run {space} --quiet")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 2 and ("mount" in r.stderr or "unshare" in r.stderr):
        _unavailable(f"cannot mount a tmpfs in a namespace of its own: {r.stderr.strip()}")
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2, out
    assert "the shared-memory file system /dev/shm has no room for the data set's" in out
    assert "--shm-size" in out and "Traceback" not in out and "Bus error" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.yaml"]


@pytest.mark.slow  # CI's slow step: the README's command keeps the 8 minutes CI allows
def test_a_study_that_has_its_trials_returns_on_a_small_dev_shm_and_one_with_more_is_refused(
        tmp_path: Path) -> None:
    """The data set loads before the study opens (so that the workers start meanwhile):
    a study already done needs no data and returns as before, where one with trials
    left to run is refused and keeps what it had."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        _unavailable("a /dev/shm of its own needs root and unshare")
    space = tmp_path / "big.yaml"
    space.write_text(SPACE)
    done = subprocess.run([sys.executable, "-m", "explore.cli", "run", str(space), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    def small_shm(*more: str) -> subprocess.CompletedProcess[str]:
        script = (f"mount -t tmpfs -o size=64k tmpfs /dev/shm && exec {sys.executable} -m "
                  f"explore.cli run {space} --quiet {' '.join(more)}")
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               script], capture_output=True, text=True, timeout=300)

    again = small_shm()
    if again.returncode not in (0, 2) and "mount" in again.stderr:
        _unavailable(f"cannot mount a tmpfs in a namespace of its own: {again.stderr.strip()}")
    assert again.returncode == 0, again.stdout + again.stderr
    import optuna

    url = f"sqlite:///{tmp_path / 'big.db'}"
    attrs = optuna.load_study(study_name="big", storage=url).user_attrs
    more = small_shm("--trials", "4")
    out = " ".join((more.stdout + more.stderr).split())
    assert more.returncode == 2, out
    assert "has no room for the data set's" in out and "Traceback" not in out
    study = optuna.load_study(study_name="big", storage=url)
    assert len(study.trials) == 2 and all(t.state.is_finished() for t in study.trials)
    assert study.user_attrs == attrs  # nothing written by the refused run


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_data_set_that_cannot_load_refuses_a_study_with_trials_left_writing_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: str) -> None:
    """Without root: the data load fails as a full ``/dev/shm`` makes it fail.  A new
    study is refused with no file made; a study with its trials returns; one with
    trials left (a bigger total, the space changed on purpose) is refused unchanged."""
    import optuna

    import explore
    from explore import runner
    from explore.datasets import DataError

    url = f"sqlite:///{tmp_path / 's.db'}" if storage == "sqlite" else \
        f"journal:///{tmp_path / 's.log'}"
    space = {"name": "s", "dataset": "digits", "keep_models": 0,
             "budget": {"trials": 2, "rounds": 1, "memory": "300MB", "workers": 1},
             "sampler": {"name": "random", "seed": 0}, "pruner": "none",
             "model": {"depth": 1, "width": 8}, "training": {"batch_size": 32}}

    def no_room(bound: object) -> None:
        raise DataError("the shared-memory file system has no room for the data set")

    with monkeypatch.context() as m:
        m.setattr(runner, "load_shared", no_room)
        with pytest.raises(runner.RunRefused, match="has no room"):
            explore.run(space, storage=url)
    assert not list(tmp_path.iterdir())  # no study file, no lock
    explore.run(space, storage=url)  # the study gets its two trials
    monkeypatch.setattr(runner, "load_shared", no_room)
    assert len(explore.run(space, storage=url).trials) == 2  # done: needs no data
    attrs = optuna.load_study(study_name="s", storage=runner.storage_url(url)).user_attrs
    changed = {**space, "model": {"depth": 1, "width": 16}}
    with pytest.raises(runner.RunRefused, match="has no room"):
        explore.run(changed, storage=url, trials=4, space_changed=True)
    study = optuna.load_study(study_name="s", storage=runner.storage_url(url))
    assert len(study.trials) == 2 and study.user_attrs == attrs
