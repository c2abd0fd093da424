"""The best models kept by several drivers of one study (``explore.keeper``): each
ranks against the list as stored, so the list holds the best of all of them."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from explore.keeper import MODELS_ATTR, ModelKeeper, default_artifacts
from tests.explore.drivers import fill, small_disk


def _finished(study: optuna.Study, value: float) -> tuple[optuna.trial.FrozenTrial, int]:
    t = study.ask()
    study.tell(t, value)
    return study._storage.get_trial(t._trial_id), t.number


def test_two_drivers_keep_the_best_of_both(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    store = tmp_path / "s.artifacts"
    # both drivers start before either kept anything
    one = ModelKeeper(study, store, k=2, minimize=False)
    two = ModelKeeper(optuna.load_study(study_name="s", storage=storage), store, k=2,
                      minimize=False)
    for keeper, value in ((one, 0.5), (two, 0.7), (one, 0.6), (two, 0.55)):
        trial, number = _finished(study, value)
        staged = keeper.stage(number)  # where its worker would write the weights
        assert staged is not None
        np.savez(staged, w=np.zeros(3, np.float32))
        kept = keeper.keep(trial, staged)
        keeper.written(number)
        assert kept.state == TrialState.COMPLETE
    models = optuna.load_study(study_name="s", storage=storage).user_attrs[MODELS_ATTR]
    assert [(m["trial"], m["value"]) for m in models] == [(1, 0.7), (2, 0.6)]
    on_disk = {p.name for p in store.iterdir() if not p.name.startswith(".")}
    assert on_disk == {m["artifact"] for m in models}  # the pushed-out ones removed


def test_the_journal_keeps_its_models_next_to_its_file() -> None:
    assert default_artifacts("journal:////runs/q.log") == "/runs/q.artifacts"
    assert default_artifacts("postgresql+psycopg://me@db/x").endswith("explore-artifacts")


def test_a_driver_that_ends_leaves_the_others_staging_alone(tmp_path: Path) -> None:
    """Each driver stages in a folder of its own and removes only that: one that ends
    first (or is interrupted) does not take away the folder the other's workers are
    writing into (issue 32, item 2)."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    store = tmp_path / "s.artifacts"
    one = ModelKeeper(study, store, k=2, minimize=False)
    two = ModelKeeper(optuna.load_study(study_name="s", storage=storage), store, k=2,
                      minimize=False)
    first, second = one.stage(0), two.stage(1)
    assert first is not None and second is not None
    assert Path(first).parent != Path(second).parent
    one.close()  # ends before the other's worker has written anything
    np.savez(second, w=np.ones(3, np.float32))  # where the other's worker writes
    trial, number = _finished(study, 0.9)
    assert "model" in two.keep(trial, second).user_attrs["explore"]
    two.written(number)
    two.close()
    assert {p.name for p in store.iterdir()} == {
        m["artifact"] for m in optuna.load_study(study_name="s", storage=storage)
        .user_attrs[MODELS_ATTR]}  # no .staging left once both ended


def test_the_staging_of_a_killed_driver_is_swept_by_the_next(tmp_path: Path) -> None:
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    staging = tmp_path / "s.artifacts" / ".staging"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = staging / f"{socket.gethostname()}-{gone.stdout.strip()}-0badc0de"
    living = staging / f"{socket.gethostname()}-{os.getpid()}-0000beef"
    elsewhere = staging / f"another-host-{gone.stdout.strip()}-00000001"
    for folder in (dead, living, elsewhere):
        folder.mkdir(parents=True)
        (folder / "trial-3.npz.part").write_bytes(b"half a model")
    ModelKeeper(study, tmp_path / "s.artifacts", k=1, minimize=True)
    assert not dead.exists()
    assert living.exists() and elsewhere.exists()  # alive, or not ours to judge


def _a_model_on(store: Path, storage: str) -> tuple[ModelKeeper, optuna.Study, str]:
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    keeper = ModelKeeper(study, store, k=2, minimize=False)
    staged = keeper.stage(0)
    assert staged is not None
    np.savez(staged, w=np.ones(200_000, np.float32))  # 800 KB
    return keeper, study, staged


def test_a_model_that_cannot_be_written_leaves_the_result_and_no_partial_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The result counts more than its model (issue 32, item 7)."""
    from optuna.artifacts import FileSystemArtifactStore

    store = tmp_path / "s.artifacts"
    keeper, study, staged = _a_model_on(store, f"sqlite:///{tmp_path / 's.db'}")
    real = FileSystemArtifactStore.write

    def half_then_full(self: FileSystemArtifactStore, artifact_id: str, body: Any) -> None:
        with open(store / artifact_id, "wb") as f:
            f.write(body.read(1000))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(FileSystemArtifactStore, "write", half_then_full)
    trial, number = _finished(study, 0.9)
    kept = keeper.keep(trial, staged)
    keeper.written(number)
    record = kept.user_attrs["explore"]
    assert "model" not in record and "No space left" in record["model_error"]
    assert kept.values == [0.9]
    assert [p.name for p in store.iterdir()] == [".staging"]  # no partial model
    assert not Path(staged).exists()
    monkeypatch.setattr(FileSystemArtifactStore, "write", real)
    keeper.close()


def test_a_full_disk_under_the_model_store_keeps_the_result(tmp_path: Path) -> None:
    with small_disk(tmp_path, "1m") as disk:
        keeper, study, _ = _a_model_on(disk / "s.artifacts", f"sqlite:///{tmp_path / 's.db'}")
        # the worker's file is written where there is room; the store is what is full
        staged_on = tmp_path / "elsewhere"
        staged_on.mkdir()
        staged = str(staged_on / "trial-0.npz")
        np.savez(staged, w=np.ones(200_000, np.float32))
        fill(disk)
        trial, number = _finished(study, 0.8)
        kept = keeper.keep(trial, staged)
        keeper.written(number)
        assert "No space left" in kept.user_attrs["explore"]["model_error"]
        assert {p.name for p in (disk / "s.artifacts").iterdir()} == {".staging"}
        keeper.close()


def test_two_drivers_merging_at_once_leave_no_model_listed_nowhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both drivers read the list before either writes it: without the store's lock each
    writes a list lacking the other's model, and the model dropped stays in the store,
    listed nowhere.  The first to read waits (up to a second) for the other to read too;
    under the lock the other cannot, and reads the list the first wrote."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    store = tmp_path / "s.artifacts"
    one = ModelKeeper(study, store, k=1, minimize=False)
    two = ModelKeeper(optuna.load_study(study_name="s", storage=storage), store, k=1,
                      minimize=False)
    numbers = {}
    for keeper, value in ((one, 0.5), (two, 0.7)):
        trial, numbers[keeper] = _finished(study, value)
        staged = keeper.stage(numbers[keeper])
        assert staged is not None
        np.savez(staged, w=np.zeros(3, np.float32))
        keeper.keep(trial, staged)  # both uploaded, neither listed yet
    reads = threading.Barrier(2)
    stored = ModelKeeper._stored

    def slow_read(self: ModelKeeper) -> list[dict[str, Any]]:
        out = stored(self)
        with contextlib.suppress(threading.BrokenBarrierError):
            reads.wait(timeout=1.0)  # both read before either writes, if they can
        return out

    monkeypatch.setattr(ModelKeeper, "_stored", slow_read)
    threads = [threading.Thread(target=k.written, args=(numbers[k],)) for k in (one, two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    models = optuna.load_study(study_name="s", storage=storage).user_attrs[MODELS_ATTR]
    assert [(m["trial"], m["value"]) for m in models] == [(numbers[two], 0.7)]
    on_disk = {p.name for p in store.iterdir() if not p.name.startswith(".")}
    assert on_disk == {m["artifact"] for m in models}
