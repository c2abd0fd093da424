"""A search from start to end, shared by ``explore run`` and :func:`explore.run`.

:func:`prepare` reads the space (a file, or a dict of the YAML's structure), applies
the caller's overrides and binds the space to its data set and model builder
(:func:`explore.binding.bind`: the data set is read and checked, the builder imported,
once): everything that can be wrong with the input is found here, before a study is
written (:class:`RunRefused`).  :func:`execute` opens the study (creating it, or
resuming it), loads the data into the run's shared memory, starts the scheduler and
records the run; a budget that cannot hold the run is refused with the study it
created deleted again, so nothing is left half-written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import StorageInternalError
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from engine.runtime import backends
from explore import metrics
from explore.attrs import BUILDER_DIR_ATTR, CHANGES_ATTR, DATA_ATTR, RUNS_ATTR, SPACE_ATTR
from explore.binding import BoundSpace, bind
from explore.datasets import BaseDataset, DataError
from explore.datasets.table import from_python
from explore.families.builder import spec_of
from explore.folders import directory_problem
from explore.keeper import ModelKeeper, default_artifacts
from explore.live import counted
from explore.optuna_adapter import storage_of
from explore.scheduler import Scheduler, SchedulerError
from explore.scheduler.admission import Refused, admit
from explore.scheduler.prestart import Prestarted, prestart
from explore.scheduler.shared_arrays import SharedArrays
from explore.scheduler.shared_data import load_shared
from explore.space import Space, check_study_name, load_space, parse_size, parse_space
from explore.space_change import changes
from explore.space_rules import MAX_SEED
from explore.storages import StorageError, explain, release, scheme, sqlite_file
from explore.storages import check as check_storage
from explore.storages._journal import journal_path
from explore.study import default_storage, load_stored, name_objectives, open_study, storage_url
from explore.yamlio import SourceError, SpaceError, key_of


class RunRefused(ValueError):
    """The run cannot start (bad data, a budget too small, ...): nothing was written.
    ``errors`` holds a space's errors with file, line and key where there were some;
    the message lists them too (a notebook shows only the message)."""

    def __init__(self, message: str, errors: list[SourceError] | None = None) -> None:
        self.errors = errors or []
        said = [str(e) for e in self.errors if str(e) not in message]
        super().__init__("\n".join([message, *said]))


@dataclass
class Prepared:
    """A run ready to start: the space bound to its data set, where its study lives."""

    bound: BoundSpace
    storage: str
    study_name: str
    source: Path | None  # the space's file, if it came from one
    # the user says a space that differs from the study's is meant (explore.space_change)
    space_changed: bool = False
    smallest: int | None = None  # the smallest candidate's heap (scheduler.admission)

    @property
    def space(self) -> Space:
        return self.bound.space


def prepare(space: str | Path | Mapping[str, Any] | Any, *, data: Any = None,
            target: str | None = None, storage: str | None = None,
            study: str | None = None, trials: int | None = None, workers: int | None = None,
            memory: int | str | None = None, device: str | None = None,
            devices: list[int] | None = None, timeout: float | None = None,
            kernels: str | None = None, builder: Any = None,
            space_changed: bool = False) -> Prepared:
    """Read and check everything a run needs; raises :class:`RunRefused`.
    ``trials``, ``workers``, ``memory``, ``device``, ``devices``, ``timeout`` and
    ``kernels`` override the space's budget.  ``space_changed``: a space that differs from the one
    the study was searched with is meant (:mod:`explore.space_change`)."""

    _check_argument_types(space, storage, study, target, space_changed)
    if isinstance(target, int) and not isinstance(target, bool):
        target = str(target)  # a frame's columns are matched by name, as text
    source: Path | None = None
    options: dict[str, Any] = {}
    try:
        if isinstance(space, Space):
            sp = space
        elif isinstance(space, Mapping):
            raw = dict(space)
            section = raw.get("dataset")
            if data is not None and isinstance(section, Mapping):
                # the section's table options apply to the data given; its source is
                # replaced by it (and need not be there)
                options = {k: v for k, v in section.items() if k in TABLE_OPTIONS}
                seed = options.get("seed")
                if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                         or not 0 <= seed <= MAX_SEED):
                    raise RunRefused(f"dataset.seed: {seed!r} is not an integer in "
                                     f"[0, {MAX_SEED}]")
                raw["dataset"] = None
            sp = parse_space(raw)
        else:
            source = Path(space)
            sp = load_space(source)
            if data is not None and sp.dataset is not None:
                options = _table_options(sp)
    except SpaceError as e:
        raise RunRefused(f"{len(e.errors)} error(s) in the search space", e.errors) from None
    except (OSError, ValueError) as e:
        raise RunRefused(str(e)) from None
    if sp.name is None:
        sp = sp.model_copy(update={"name": "explore"})
    try:
        size = parse_size(memory) if memory is not None else None
    except ValueError as e:
        raise RunRefused(f"memory: {e}") from None
    overrides = {k: v for k, v in {"trials": trials, "workers": workers, "memory": size,
                                   "device": device, "devices": devices,
                                   "timeout": timeout, "kernels": kernels}.items()
                 if v is not None}
    try:  # validated as the file's own values are (caps, the machine's memory)
        budget = type(sp.budget).model_validate({**sp.budget.model_dump(), **overrides})
    except ValidationError as e:
        whole = "memory" if "memory" in overrides else "budget"  # the machine check's
        raise RunRefused("; ".join(f"--{'.'.join(map(str, err['loc'])) or whole}: "
                                   f"{err['msg'].removeprefix('Value error, ')}"
                                   for err in e.errors())) from None
    sp = sp.model_copy(update={"budget": budget})
    if storage is not None and not storage.strip():
        raise RunRefused("storage is empty: give an Optuna storage URL")
    if study is not None and not study.strip():
        raise RunRefused("study is empty: give a study name")
    if study is not None:
        try:
            check_study_name(study)
        except ValueError as e:
            raise RunRefused(f"study: {e}") from None
    try:
        if isinstance(data, BaseDataset):
            if target is not None:
                raise DataError(f"target={target!r} names a column of a DataFrame; a "
                                f"data set ({type(data).__name__}) knows its own target")
            given: BaseDataset | None = data
        else:
            given = from_python(data, target=target, **options) if data is not None else None
        bound = bind(sp, given, builder)
    except SpaceError as e:
        raise RunRefused(f"{len(e.errors)} error(s) in the search space", e.errors) from None
    except (DataError, TypeError) as e:
        raise RunRefused(str(e)) from None
    check_objectives(sp, bound.data)
    try:
        smallest = admit(bound)
    except Refused as e:
        raise refused_at(sp, str(e), e.key) from None
    if budget.device == "gpu":
        check_gpus(budget)
    url = storage or (default_storage(source) if source is not None
                      else default_storage(Path.cwd() / f"{sp.name}.yaml"))
    try:
        check_storage(url, write=True)  # connects to no server: execute() does
    except StorageError as e:
        raise RunRefused(str(e)) from None
    if sp.keep_models > 0 and not sp.artifacts:  # a space's own folder: checked when read

        problem = directory_problem(default_artifacts(url))
        if problem is not None:
            raise RunRefused(f"keep_models: {problem} (the default folder for the kept "
                             "models); set artifacts: to a writable folder or keep_models: "
                             "0")
    return Prepared(bound, url, study or sp.name or "explore", source, space_changed,
                    smallest)


TABLE_OPTIONS = ("features", "categorical", "valid", "test", "scale", "task", "seed",
                 "missing", "impute")


def _table_options(space: Any) -> dict[str, Any]:
    """The dataset section's table options, for data given from Python."""
    d = space.dataset
    return {k: getattr(d, k) for k in TABLE_OPTIONS if getattr(d, k, None)}


def _check_argument_types(space: Any, storage: Any, study: Any, target: Any,
                          space_changed: Any) -> None:
    """The arguments of a run from Python are of the types it takes (RunRefused naming
    the argument otherwise, not an AttributeError from deep inside)."""
    if not isinstance(space, Space | Mapping | str | os.PathLike):
        raise RunRefused(f"space: a file's path, a dict or a Space, not "
                         f"{type(space).__name__}")
    if storage is not None and not isinstance(storage, str | os.PathLike |
                                              optuna.storages.BaseStorage):
        raise RunRefused(f"storage: a URL or a SQLite file's path, not "
                         f"{type(storage).__name__}")
    if study is not None and not isinstance(study, str):
        raise RunRefused(f"study: a name (a string), not {type(study).__name__}")
    if target is not None and (isinstance(target, bool) or
                               not isinstance(target, str | int)):
        raise RunRefused(f"target: one column's name, not {type(target).__name__}")
    if not isinstance(space_changed, bool):
        raise RunRefused(f"space_changed: true or false, not {space_changed!r}")


def refused_at(space: Any, message: str, key: tuple[str | int, ...]) -> RunRefused:
    """A refusal of the space's ``key``, found once the space met its data: ``message``
    (which starts with the key), and as an error at that key's line of the space's file
    where it came from one."""
    if not key:
        return RunRefused(message)
    detail = message.removeprefix(f"{key_of(key)}: ")
    return RunRefused(message, space.error_at(key, detail).errors)


def check_objectives(space: Any, ds: Any) -> None:
    """Every objective must be measurable on the data set (RunRefused otherwise)."""

    task = getattr(ds, "task", "classification")
    classes = int(getattr(ds, "classes", 0) or 0)
    for i, o in enumerate(space.objectives):
        m = metrics.get(o.metric)
        if not m.applies(task, classes):
            can = ", ".join(n for n, x in metrics.METRICS.items() if x.applies(task, classes))
            key = ("objectives", i, "metric")
            raise refused_at(space, f"{key_of(key)}: {o.metric!r} does not apply to this "
                             f"data set ({task}" + (f", {classes} classes" if classes else "")
                             + f"); objectives that do: {can}", key)


def data_record(ds: Any) -> dict[str, Any]:
    """What a model of the study takes and gives, stored with the study so that its
    models can be rebuilt, exported and used without the data: task, features,
    classes, image shape, sequence shape (only a sequence data set's record has one),
    pixel scale, target scale, the preprocessing and what ``dataset.missing`` did."""
    pre = getattr(ds, "preprocess", None)
    scale = getattr(ds, "target_scale", None)
    image = getattr(ds, "image", None)
    seq = getattr(ds, "sequence", None)
    return {"task": getattr(ds, "task", "classification"), "features": int(ds.features),
            "classes": int(getattr(ds, "classes", 0) or 0),
            "image": list(image) if image else None,
            **({"sequence": dataclasses.asdict(seq)} if seq is not None else {}),
            "pixel_scale": getattr(ds, "pixel_scale", None),
            "target_scale": list(scale) if scale else None,
            "preprocess": pre.to_dict() if pre is not None else None,
            "missing": r.to_dict() if (r := getattr(ds, "missing_report", None)) else None}


def execute(prep: Prepared, progress: Callable[[Any], None] | None = None,
            main: int | None = None, baseline: int = 0
            ) -> tuple[optuna.Study, dict[str, Any] | None]:
    """Run the prepared search; returns the study and the record of this run (None
    when the study already had its trials).  Raises :class:`RunRefused` (nothing
    written) when the budget cannot hold the run.  ``baseline``: this process's memory
    before the run began, not charged to it (a notebook calling :func:`explore.run`)."""
    try:
        data = load_shared(prep.bound)
    except DataError as e:
        # A study that already has its trials needs no data: it returns as it did
        # before the data came to load first; any other is refused with nothing written
        if not _has_its_trials(prep):
            raise RunRefused(str(e)) from None
        return _open_and_search(prep, None, None, progress, main, baseline, str(e))
    started = None
    try:
        # The workers the budget surely holds start while the study opens (a worker's
        # start overlaps the driver's); those the run does not take are told to exit.
        started = prestart(prep.space.budget, prep.smallest or 0, data.nbytes)
        return _open_and_search(prep, data, started, progress, main, baseline)
    finally:
        try:
            if started is not None:
                started.close()
        finally:  # even if a second Ctrl-C ends the wait for them
            data.close()  # (the run's scheduler has freed it already, if one ran)


def _has_its_trials(prep: Prepared) -> bool:
    """Whether the study already has its total of trials, read without writing a byte:
    from a SQLite or journal file that exists (False for any other storage, where
    opening may create a file or a schema, and for a study not found)."""
    url = prep.storage
    path = sqlite_file(url) if scheme(url) == "sqlite" else \
        journal_path(url) if scheme(url) == "journal" else None
    if path is None or not path.is_file():
        return False
    try:
        opened = storage_url(url)
        study = load_stored(opened, prep.study_name)
    except Exception:  # unreadable, or no such study: not known to be done
        return False
    try:
        done = sum(counted(t) for t in study.get_trials(deepcopy=False))
    finally:
        release(opened)
    return done >= prep.space.budget.trials


def _open_and_search(prep: Prepared, data: SharedArrays | None, started: Prestarted | None,
                     progress: Callable[[Any], None] | None, main: int | None,
                     baseline: int, no_data: str = ""
                     ) -> tuple[optuna.Study, dict[str, Any] | None]:
    """:func:`execute` once its data set is loaded and its workers are starting (or,
    ``data`` None, once loading it failed as ``no_data`` says)."""
    space = prep.space
    db = sqlite_file(prep.storage)
    db_existed = db is not None and db.exists()
    try:
        study = open_study(space, prep.storage, prep.study_name)
    except (StorageError, ValueError) as e:  # a storage that cannot be opened, or
        # a study of the same name that optimises something else
        raise RunRefused(str(e)) from None
    except (SQLAlchemyError, StorageInternalError, OSError) as e:  # a corrupt file, a
        # name the database cannot hold, a server gone: said as such
        raise RunRefused(f"cannot open study {prep.study_name!r} in {prep.storage}: "
                         f"{explain(e)}") from None
    new_study = not study.get_trials(deepcopy=False) and RUNS_ATTR not in study.user_attrs

    def refuse(message: str) -> RunRefused:
        """``message``, leaving nothing behind: a study this run created and ran no
        trial of is deleted again (with its SQLite file, if it made that too)."""
        if new_study and not study.get_trials(deepcopy=False):
            with contextlib.suppress(Exception):
                optuna.delete_study(study_name=study.study_name, storage=prep.storage)
            if db is not None and not db_existed:
                for f in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
                    f.unlink(missing_ok=True)
        return RunRefused(message)

    try:
        return _search(prep, study, data, refuse, progress, main, baseline, started,
                       no_data)
    except RunRefused:  # the caller may go on (a notebook): no connection kept to a
        release(storage_of(study))  # file it did not use (SQLite's -wal and -shm)
        raise


def _search(prep: Prepared, study: optuna.Study, data: SharedArrays | None,
            refuse: Callable[[str], RunRefused],
            progress: Callable[[Any], None] | None, main: int | None, baseline: int,
            started: Prestarted | None = None, no_data: str = ""
            ) -> tuple[optuna.Study, dict[str, Any] | None]:
    """:func:`execute` once the study is open: ``refuse`` makes the error that leaves
    nothing behind."""
    space = prep.space
    budget = space.budget
    if data is None and \
            sum(counted(t) for t in study.get_trials(deepcopy=False)) < budget.trials:
        raise refuse(no_data)  # (trials were queued again since it was read)
    check_space_change(study, prep.bound, prep.space_changed)
    name_objectives(study, space)  # after a meant change of metric, its new name

    # The study's total is shared with any other drivers (explore.live): nothing to do
    # once that many trials ended; trials a dead driver left running are failed and
    # queued again by the scheduler.
    if sum(counted(t) for t in study.get_trials(deepcopy=False)) >= budget.trials:
        return study, None
    assert data is not None  # (refused above)
    keeper = None
    if space.keep_models > 0:
        keeper = ModelKeeper(study, space.artifacts or default_artifacts(prep.storage),
                             space.keep_models, space.objectives[0].dir == "minimize")
    try:
        sched = Scheduler(prep.bound, study, data, workers=budget.workers, memory=budget.memory,
                          device=budget.device, devices=budget.ordinals, progress=progress,
                          main=main, keeper=keeper, baseline=baseline,
                          smallest=prep.smallest,
                          switch_dir=space.artifacts or default_artifacts(prep.storage),
                          prestarted=started)
    except BaseException:
        data.close()
        raise
    try:
        study.set_user_attr(DATA_ATTR, data_record(prep.bound.data))
        study.set_user_attr(SPACE_ATTR, space_record(prep.bound))
        if space.model._base is not None:
            study.set_user_attr(BUILDER_DIR_ATTR, str(space.model._base))
        stats = sched.run(budget.trials)
    except SchedulerError as e:
        raise refuse(str(e)) from None
    except BaseException:  # Ctrl-C before the run began: nothing of it left behind
        sched.stop()  # (the run stops itself; again is harmless)
        raise
    run = record_run(study, stats, driver=sched.live.driver, timed_out=sched.timed_out)
    if space.refit:
        from explore.refit import (  # noqa: PLC0415 (a refusal's start-up: onnx, boto3)
            refit_after_run,
        )

        refit_after_run(study, prep.bound.data, prep.bound.builder,
                        space.artifacts or default_artifacts(prep.storage))
    return study, run


def check_gpus(budget: Any) -> None:
    """Each GPU the budget names is on this machine and holds its ``memory``; raises
    :class:`RunRefused`.  Ordinals are CUDA's, counted within ``CUDA_VISIBLE_DEVICES``
    where that is set."""

    if not backends.gpu_available():
        raise RunRefused("--device gpu: no CUDA device with cupy on this machine")
    count = backends.gpu_count()
    missing = [d for d in budget.ordinals if d >= count]
    if missing:
        raise RunRefused(f"--devices: device {missing[0]} is not on this machine, which "
                         f"has {count} CUDA device{'s' * (count != 1)} "
                         f"(0 to {count - 1})")
    for d in budget.ordinals:
        have = backends.gpu_memory_bytes(d)
        if budget.memory > have:
            raise RunRefused(f"budget.memory: {budget.memory:,} bytes is more than GPU "
                             f"{d} has ({have:,} bytes)")


def check_space_change(study: optuna.Study, bound: BoundSpace, meant: bool) -> None:
    """Refuse a space that differs from the one ``study`` was searched with (raises
    :class:`RunRefused` listing the changes), unless the change is ``meant`` and one
    study can hold both; a meant change is recorded in the study."""


    old = study.user_attrs.get(SPACE_ATTR)
    if not isinstance(old, dict):
        return
    found = changes(old, space_record(bound))
    if not found:
        return
    listed = [f"  {c}" for c in found]
    name = study.study_name
    bad = [c for c in found if not c.compatible]
    if bad:
        raise RunRefused(
            f"study {name!r} was searched with another space, and these changes cannot "
            "share one study (Optuna keeps one set of choices, one kind and one scale per "
            "parameter):\n" + "\n".join(f"  {c}" for c in bad) +
            "\nsearch the new space under another --study name")
    if not meant:
        raise RunRefused(
            f"study {name!r} was searched with another space; what changed:\n" +
            "\n".join(listed) + "\nto search the changed space in the same study (the "
            "change is recorded in it), run again with --space-changed; or give another "
            "--study name")
    study.set_user_attr(CHANGES_ATTR, [
        *study.user_attrs.get(CHANGES_ATTR, []),
        {"at": datetime.now().isoformat(timespec="seconds"),
         "changes": [str(c) for c in found]}])


def space_record(bound: BoundSpace) -> dict[str, Any]:
    """The space as stored with its study; a builder given as a function is recorded by
    its importable name, where it has one."""
    out: dict[str, Any] = bound.space.model_dump(mode="json")
    if bound.builder is not None and bound.space.model.builder is None:
        out["model"]["builder"] = spec_of(bound.builder)
    return out


def record_run(study: optuna.Study, stats: Any, driver: str | None = None,
               timed_out: bool = False) -> dict[str, Any]:
    """Append the run's record (:meth:`RunStats.record_dict`) to the study's ``runs``,
    with the ``driver`` that ran it (the name its trials' records carry: which trials
    were this run's, :func:`explore.failures.run_trials`) and whether it ended at the
    budget's timeout short of its trials (``timed_out``)."""
    run: dict[str, Any] = {**stats.record_dict(), "driver": driver, "timed_out": timed_out}
    study.set_user_attr(RUNS_ATTR, [*study.user_attrs.get(RUNS_ATTR, []), run])
    return run
