"""The best models of a study, kept: the final weights of the ``k`` best completed
trials (by the first objective) in Optuna's artifact store.

A worker writes a finished trial's weights to a staging file (:mod:`explore.weights`);
the study writer's thread hands each one here before it writes the trial.  A model
among the ``k`` best so far is uploaded with Optuna's public artifact API
(``optuna.artifacts.upload_artifact``, attached to the study) and its artifact id goes
into the trial's record (``explore.model``); one pushed out of the ``k`` best is
removed from the store.  The study's user attribute ``models`` lists what is kept
(``[{"trial", "value", "artifact"}]``, best first) and ``artifacts`` names the store's
directory, so ``explore export-model`` and :func:`explore.load_model` find them.  A
study's refit model (:mod:`explore.refit`) is kept beside them by :func:`keep_refit`,
one per study, recorded in its user attribute ``refit``.

Each driver stages its workers' files in a folder of its own
(``<store>/.staging/<host>-<pid>/``), which it alone removes when it ends: several
drivers share the store, and one that ends must not take away the folder another's
workers are writing into.

The default store is a directory next to a SQLite study or a journal file
(``quick.db`` or ``quick.log`` -> ``quick.artifacts/``), else ``explore-artifacts/`` in
the working directory.  Several drivers of one study each rank against the list as
stored when they rank (read again each time), so the list holds the best of all of
them; the list's read, merge and write happen under a lock on the store's directory
(``flock``), since two drivers merging at once would each write the list without the
other's model, and the one dropped would stay in the store, listed nowhere.

>>> default_artifacts("sqlite:////data/runs/quick.db")
'/data/runs/quick.artifacts'
>>> default_artifacts("journal:///data/runs/quick.log")  # (the journal's own reading)
'/data/runs/quick.artifacts'
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from explore.attrs import ARTIFACTS_ATTR, MODELS_ATTR, RECORD_ATTR, REFIT_ATTR
from explore.procmem import alive
from explore.storages._journal import journal_path


def default_artifacts(storage: str) -> str:
    """The artifact directory for a storage URL (see the module docstring), absolute:
    a relative file is found from the current folder now, as the storage opens it."""
    if storage.startswith("journal:"):
        path = journal_path(storage)
        if str(path) not in ("", "."):
            return str(path.resolve().with_suffix(".artifacts"))
    prefix = "sqlite:///"
    if storage.startswith(prefix) and len(storage) > len(prefix) and \
            ":memory:" not in storage:
        return str(Path(storage[len(prefix):].split("?", 1)[0]).resolve()
                   .with_suffix(".artifacts"))
    return str(Path("explore-artifacts").resolve())


def sweep_stale_staging(staging: Path) -> list[Path]:
    """Remove the staging folders of drivers on this host that are gone (killed: none
    of their own cleanup ran); the folders removed.  Another host's are left alone:
    whether its driver lives cannot be told from here."""
    host = socket.gethostname()
    gone = []
    with contextlib.suppress(OSError):
        for folder in staging.iterdir():
            owner, _, rest = folder.name.rpartition("-")[0].rpartition("-")
            pid = int(rest) if rest.isdigit() else 0
            if owner != host or pid <= 0 or alive(pid):
                continue
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder)
    return gone


class ModelKeeper:
    """Keeps the ``k`` best models of ``study`` (a stored study) in ``directory``.
    ``minimize``: whether smaller values of the first objective are better."""

    def __init__(self, study: optuna.Study, directory: str | Path, k: int,
                 minimize: bool) -> None:
        self.study, self.k, self.minimize = study, k, minimize
        self.directory = Path(directory).resolve()
        # host and pid: whose it is, and whether its driver lives; the token: one
        # process may hold several keepers (a notebook's runs)
        self.staging = self.directory / ".staging" / \
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.store: Any = None
        if k > 0:
            self.store = _artifacts().FileSystemArtifactStore(str(self.directory))
            sweep_stale_staging(self.directory / ".staging")
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
            for _ in range(3):  # another driver may remove the empty parents meanwhile
                with contextlib.suppress(FileNotFoundError):
                    self.staging.mkdir(parents=True, exist_ok=True)
                    break
            self.made = True
        return str(self.staging / f"trial-{number}.npz")

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
            tracked = _Tracked(self.store)
            try:
                artifact = _artifacts().upload_artifact(
                    artifact_store=tracked, file_path=staged, study_or_trial=self.study,
                    mimetype="application/x-npz")
            except OSError as e:
                # The result counts more than its model: the trial is written without
                # one (its record says why), and no partial file stays in the store.
                if tracked.written is not None:
                    with contextlib.suppress(Exception):
                        self.store.remove(tracked.written)
                record = {**trial.user_attrs.get(RECORD_ATTR, {}),
                          "model_error": f"its model could not be kept: {e}"}
                trial.user_attrs = {**trial.user_attrs, RECORD_ATTR: record}
                return trial
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
        with locked(self.directory):
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
        """Remove this driver's staging folder and what a stopped run left in it; then
        the shared ``.staging`` and the store's directory where nothing is left in them
        (another driver's staging folder, or kept models, keep them)."""
        if self.staging.is_dir():
            for f in self.staging.iterdir():
                f.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.staging.rmdir()
        for folder in (self.staging.parent, self.directory):
            with contextlib.suppress(OSError):  # not empty: another's, or models kept
                folder.rmdir()


def keep_refit(study: optuna.Study, directory: str | Path, weights: str | Path,
               record: dict[str, Any]) -> dict[str, Any]:
    """Store the file ``weights`` (a ``.npz`` of :mod:`explore.weights`) as the refit
    model of ``study`` in the artifact store at ``directory`` (made if missing), and
    ``record`` with its artifact id (``artifact``) and the store (``artifacts``) as the
    study's user attribute :data:`REFIT_ATTR`; the refit model stored before is removed.
    Returns the record as stored.  Raises OSError when the store cannot be written;
    the study then keeps the refit model it had."""
    folder = Path(directory).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    store = _artifacts().FileSystemArtifactStore(str(folder))
    tracked = _Tracked(store)
    with locked(folder):  # two refits at once: one ends as the study's, none orphaned
        old = study.user_attrs.get(REFIT_ATTR)
        try:
            artifact = _artifacts().upload_artifact(
                artifact_store=tracked, file_path=str(weights), study_or_trial=study,
                mimetype="application/x-npz")
        except OSError:
            if tracked.written is not None:
                with contextlib.suppress(Exception):
                    store.remove(tracked.written)
            raise
        stored = {**record, "artifact": artifact, "artifacts": str(folder)}
        study.set_user_attr(REFIT_ATTR, stored)
        if isinstance(old, dict) and isinstance(old.get("artifact"), str):
            with contextlib.suppress(Exception):  # its store gone: nothing to free
                _artifacts().FileSystemArtifactStore(str(old.get("artifacts") or folder)
                                                     ).remove(old["artifact"])
    return stored


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory`` held by this block: the drivers sharing a
    store (on one host, or on hosts mounting it where the file system passes ``flock``
    on, as NFSv4 does) take turns."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _artifacts() -> Any:
    """``optuna.artifacts``, imported once models are kept, not with this module: it
    imports boto3 and Google's storage client where they are installed (11 to 14 MB of
    the scheduler's memory, which the budget counts)."""
    from optuna import artifacts  # noqa: PLC0415 (scheduler memory: only with keep_models)

    return artifacts


class _Tracked:
    """An artifact store that remembers the id it was last asked to write, so that a
    write that fails half way can be removed."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.written: str | None = None

    def write(self, artifact_id: str, content_body: Any) -> None:
        self.written = artifact_id
        self.store.write(artifact_id, content_body)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class _Keeping:
    """:class:`ModelKeeper`'s part in writing one trial (``explore.study.Keep``)."""

    def __init__(self, keeper: ModelKeeper, staged: str) -> None:
        self.keeper, self.staged = keeper, staged

    def before(self, trial: FrozenTrial) -> FrozenTrial:
        return self.keeper.keep(trial, self.staged)

    def after(self, number: int) -> None:
        self.keeper.written(number)
