"""The best models of a study, kept: the final weights of the ``k`` best completed
trials (by the first objective) in Optuna's artifact store.

A worker writes a finished trial's weights to a staging file (:mod:`explore.weights`);
the study writer's thread hands each one here before it writes the trial.  A model
among the ``k`` best so far is uploaded with Optuna's public artifact API
(``optuna.artifacts.upload_artifact``, attached to the study) and its artifact id goes
into the trial's record (``explore.model``); one pushed out of the ``k`` best is
removed from the store.  The study's user attribute ``models`` lists what is kept
(``[{"trial", "value", "artifact"}]``, best first) and ``artifacts`` names the store's
directory, so ``explore export-model`` and :func:`explore.load_model` find them.

The default store is a directory next to a SQLite study or a journal file
(``quick.db`` or ``quick.log`` -> ``quick.artifacts/``), else ``explore-artifacts/`` in
the working directory.  Several drivers of one study each rank against the list as
stored when they rank (read again each time), so the list holds the best of all of
them.

>>> default_artifacts("sqlite:////data/runs/quick.db")
'/data/runs/quick.artifacts'
>>> default_artifacts("journal:////data/runs/quick.log")
'/data/runs/quick.artifacts'
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from explore.study import RECORD_ATTR

MODELS_ATTR = "models"  # study user attribute: the kept models, best first
ARTIFACTS_ATTR = "artifacts"  # study user attribute: the artifact store's directory


def default_artifacts(storage: str) -> str:
    """The artifact directory for a storage URL (see the module docstring)."""
    for prefix in ("sqlite:///", "journal:///"):
        if storage.startswith(prefix) and len(storage) > len(prefix) and \
                ":memory:" not in storage:
            return str(Path(storage[len(prefix):]).with_suffix(".artifacts"))
    return str(Path("explore-artifacts").resolve())


class ModelKeeper:
    """Keeps the ``k`` best models of ``study`` (a stored study) in ``directory``.
    ``minimize``: whether smaller values of the first objective are better."""

    def __init__(self, study: optuna.Study, directory: str | Path, k: int,
                 minimize: bool) -> None:
        self.study, self.k, self.minimize = study, k, minimize
        self.directory = Path(directory).resolve()
        self.staging = self.directory / ".staging"
        self.store: Any = None
        if k > 0:
            # here, not at import: optuna.artifacts imports boto3 and Google's storage
            # client where they are installed (14 MB of the scheduler's memory)
            from optuna.artifacts import FileSystemArtifactStore

            self.store = FileSystemArtifactStore(str(self.directory))
        self.kept: list[dict[str, Any]] = list(study.user_attrs.get(MODELS_ATTR, []))
        # Made when the first trial is placed, so that a run refused before then leaves
        # no directory behind.
        self.made = False
        self.uploaded: dict[str, Any] | None = None  # by keep(), ranked by written()

    def stage(self, number: int) -> str | None:
        """Where the worker writes trial ``number``'s weights (None: none are kept)."""
        if self.store is None:
            return None
        if not self.made:
            self.staging.mkdir(parents=True, exist_ok=True)
            self.made = True
        return str(self.staging / f"{os.getpid()}-trial-{number}.npz")

    def _ranks(self, value: float) -> bool:
        """Whether a model of ``value`` belongs among the ``k`` best."""
        if len(self.kept) < self.k:
            return True
        worst = self.kept[-1]["value"]
        return value < worst if self.minimize else value > worst

    def keeping(self, staged: str) -> _Keeping:
        """The study writer's work for a finished trial whose weights are ``staged``."""
        return _Keeping(self, staged)

    def keep(self, trial: FrozenTrial, staged: str | None) -> FrozenTrial:
        """Upload ``staged`` if ``trial`` (COMPLETE) is among the best so far and record
        its artifact id in the trial (:meth:`written` then ranks it, under the number
        the storage gave it); the staging file goes either way.  Returns the trial to
        write."""
        try:
            if self.store is None or staged is None or not os.path.exists(staged) or \
                    trial.state != TrialState.COMPLETE or trial.values is None:
                return trial
            value = float(trial.values[0])
            self.kept = self._stored()  # other drivers of the study keep models too
            if value != value or not self._ranks(value):  # NaN never ranks
                return trial
            if self.study.user_attrs.get(ARTIFACTS_ATTR) != str(self.directory):
                self.study.set_user_attr(ARTIFACTS_ATTR, str(self.directory))
            from optuna.artifacts import upload_artifact

            artifact = upload_artifact(artifact_store=self.store, file_path=staged,
                                       study_or_trial=self.study,
                                       mimetype="application/x-npz")
            record = {**trial.user_attrs.get(RECORD_ATTR, {}), "model": artifact}
            trial.user_attrs = {**trial.user_attrs, RECORD_ATTR: record}
            self.uploaded = {"trial": None, "value": value, "artifact": artifact}
            return trial
        finally:
            if staged is not None:
                Path(staged).unlink(missing_ok=True)

    def written(self, number: int) -> None:
        """The trial last given to :meth:`keep` is stored as ``number``: rank its
        model, if it was uploaded, and drop the one it pushes out of the ``k`` best."""
        entry, self.uploaded = self.uploaded, None
        if entry is None or self.store is None:
            return
        entry["trial"] = number
        self.kept = [m for m in self._stored() if m["artifact"] != entry["artifact"]]
        self.kept.append(entry)
        self.kept.sort(key=lambda m: m["value"], reverse=not self.minimize)
        for gone in self.kept[self.k:]:
            with contextlib.suppress(Exception):  # already gone: nothing to free
                self.store.remove(gone["artifact"])
        self.kept = self.kept[:self.k]
        self.study.set_user_attr(MODELS_ATTR, self.kept)

    def _stored(self) -> list[dict[str, Any]]:
        """The kept models as the study lists them now."""
        return list(self.study.user_attrs.get(MODELS_ATTR, []))

    def close(self) -> None:
        """Remove what a stopped run left staged (and the store's directory, if the run
        kept nothing in it)."""
        if self.staging.is_dir():
            for f in self.staging.glob(f"{os.getpid()}-*"):
                f.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # another run's files still staged
                self.staging.rmdir()
            with contextlib.suppress(OSError):  # models kept in it
                self.directory.rmdir()


class _Keeping:
    """:class:`ModelKeeper`'s part in writing one trial (``explore.study.Keep``)."""

    def __init__(self, keeper: ModelKeeper, staged: str) -> None:
        self.keeper, self.staged = keeper, staged

    def before(self, trial: FrozenTrial) -> FrozenTrial:
        return self.keeper.keep(trial, self.staged)

    def after(self, number: int) -> None:
        self.keeper.written(number)
