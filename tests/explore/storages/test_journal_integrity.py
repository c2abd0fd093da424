"""A journal never holds a partial record that a later append extends (issue 32, item
3): one left by a write that did not finish is cut off when the journal is opened or
appended to, and a failed append cuts the file back to where it began.  After either,
Optuna's own reader (no explore code) loads the whole study.

A whole line that is no record (garbage, zero bytes, a record cut short, JSON that is no
Optuna operation), wherever it is, stops every read and append at it, naming its line
and byte, and leaves the file as it was: ``explore run``, ``show`` and ``export`` say
so (exit 2 when the journal is opened, exit 1 when met by a run that is going on)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.storages.journal._storage import JournalOperation

from explore.storages import explain, open_storage
from explore.storages._journal import (
    OP_FIELDS,
    CorruptJournal,
    PartialRecordWarning,
    cut_partial_record,
    record_problem,
)
from tests.explore.cli_run import explore_here, explore_run
from tests.explore.drivers import (
    descendants,
    fill,
    finish,
    grid_space,
    pids_alive,
    running_trials,
    small_disk,
    start,
)
from tests.explore.test_explore_run import write


def plain_load(path: Path) -> optuna.Study:
    """The study as Optuna alone reads it."""
    return optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(
        str(path))))


def study_with_trials(path: Path, n: int) -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(f"journal://{path}"))
    for i in range(n):
        study.add_trial(optuna.trial.create_trial(params={"x": float(i)},
                                                  distributions={"x": optuna.distributions
                                                                 .FloatDistribution(0, 100)},
                                                  value=float(i)))


def test_a_partial_last_record_is_cut_off_on_open_and_the_study_stays_readable(
        tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    study_with_trials(path, 3)
    whole = path.stat().st_size
    partial = b'{"op_code":4,"worker_id":"x","study_id":0,"datetime_st'
    with open(path, "ab") as f:  # what a write cut short by a full disk leaves
        f.write(partial)
    with pytest.warns(PartialRecordWarning, match=rf"\({len(partial)} bytes"):
        storage = open_storage(f"journal://{path}")
    assert path.stat().st_size == whole
    study = optuna.load_study(study_name="s", storage=storage)
    study.add_trial(optuna.trial.create_trial(
        params={"x": 50.0}, distributions={"x": optuna.distributions.FloatDistribution(0, 100)},
        value=50.0))
    assert [t.value for t in plain_load(path).trials] == [0.0, 1.0, 2.0, 50.0]


def test_cutting_keeps_every_whole_record(tmp_path: Path) -> None:
    path = tmp_path / "j"
    path.write_bytes(b"a\n" + b"b" * 70_000 + b"\n" + b"c" * 100_000)  # past one block
    assert cut_partial_record(path) == 100_000
    assert path.read_bytes() == b"a\n" + b"b" * 70_000 + b"\n"
    assert cut_partial_record(path) == 0
    path.write_bytes(b"no newline at all")
    assert cut_partial_record(path) == 17 and path.read_bytes() == b""
    assert cut_partial_record(tmp_path / "missing") == 0


def test_a_failed_append_leaves_the_file_as_it_was(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.log"
    study_with_trials(path, 2)
    before = path.read_bytes()
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])  # a short write...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    study = optuna.load_study(study_name="s", storage=open_storage(f"journal://{path}"))
    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        study.set_user_attr("note", "x" * 1000)
    monkeypatch.undo()
    assert path.read_bytes() == before
    study.set_user_attr("note", "written")  # the next append is whole
    assert plain_load(path).user_attrs == {"note": "written"}


def test_a_journal_on_a_full_disk_stays_readable(tmp_path: Path) -> None:
    """A real full disk: appends fail with ENOSPC until room is made, and the file never
    holds a partial record (Optuna's reader loads it after every failure)."""
    with small_disk(tmp_path, "256k") as disk:
        path = disk / "s.log"
        study_with_trials(path, 1)
        study = optuna.load_study(study_name="s", storage=open_storage(f"journal://{path}"))
        filler = fill(disk)
        before = path.read_bytes()
        for i in range(3):
            with pytest.raises(OSError) as e:
                study.set_user_attr(f"k{i}", "v" * 20_000)
            assert e.value.errno == errno.ENOSPC
            assert path.read_bytes() == before  # cut back: no partial record
        filler.unlink()
        study.set_user_attr("k", "v" * 20_000)
        assert plain_load(path).user_attrs == {"k": "v" * 20_000}


# -- a corrupt record in the middle ------------------------------------------------------

def _record(**fields: object) -> bytes:
    return json.dumps(fields).encode() + b"\n"


# How each corruption changes the whole records (at least 6), with what the error says;
# the bad line is the 4th, where the 4th record began.
CORRUPTIONS: dict[str, tuple[Callable[[list[bytes]], list[bytes]], str]] = {
    "garbage": (lambda r: [*r[:3], b"not a record at all\n", *r[3:]],
                "not a JSON record"),
    "cut short, joined to the next": (lambda r: [*r[:3], r[3][:25] + r[4], *r[5:]],
                                      "not a JSON record"),
    "cut short, its newline kept": (lambda r: [*r[:3], r[3][:25] + b"\n", *r[4:]],
                                    "not a JSON record"),
    "zero-filled": (lambda r: [*r[:3], b"\0" * (len(r[3]) + len(r[4])) + r[5], *r[6:]],
                    "zero bytes, as a crash leaves"),
    "empty line": (lambda r: [*r[:3], b"\n", *r[3:]], "an empty line"),
    "not text": (lambda r: [*r[:3], b"\xff\xfe{}\n", *r[3:]], "not text (UTF-8)"),
    "binary": (lambda r: [*r[:3], b"\xff\x00abc\n", *r[3:]], "binary bytes, 1 of them zero"),
    "JSON, no record": (lambda r: [*r[:3], _record(hello=1), *r[3:]], "has no op_code"),
    "JSON, a list": (lambda r: [*r[:3], b"[1, 2]\n", *r[3:]], "has no op_code"),
    "no operation": (lambda r: [*r[:3], _record(op_code=99, worker_id="w"), *r[3:]],
                     "op_code 99 is no Optuna journal operation"),
    "a field missing": (lambda r: [*r[:3], _record(op_code=4, worker_id="w"), *r[3:]],
                        "operation 4 without its 'study_id'"),
    "a field of another type": (
        lambda r: [*r[:3], _record(op_code=8, worker_id="w", trial_id="0",
                                   user_attr={"a": 1}), *r[3:]],
        "operation 8 whose 'trial_id' is a str"),
    "two attributes in one": (
        lambda r: [*r[:3], _record(op_code=2, worker_id="w", study_id=0,
                                   user_attr={"a": 1, "b": 2}), *r[3:]],
        "'user_attr' is not one attribute"),
}


def corrupt(path: Path, how: str) -> tuple[bytes, int, str]:
    """Corrupt the journal at ``path`` the way named: its bytes now, the bad line's
    byte offset, and what the error says of it."""
    records = path.read_bytes().splitlines(keepends=True)
    change, said = CORRUPTIONS[how]
    data = b"".join(change(records))
    path.write_bytes(data)
    return data, sum(map(len, records[:3])), said


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_a_corrupt_record_in_the_middle_is_named_and_the_file_left_as_it_was(
        tmp_path: Path, how: str) -> None:
    path = tmp_path / "s.log"
    study_with_trials(path, 6)
    data, offset, said = corrupt(path, how)
    with pytest.raises(CorruptJournal) as e:
        open_storage(f"journal://{path}")
    assert (e.value.line, e.value.offset) == (4, offset)
    message = str(e.value)
    assert f"journal {path} is corrupt at line 4 (byte {offset:,}): " in message, message
    assert said in message and "restore the file from a copy" in message, message
    assert f"keep the 3 records before it (head -n 3 {path} > new.log" in message, message
    assert path.read_bytes() == data


def test_a_corrupt_journal_that_also_ends_in_a_partial_record_is_not_cut(
        tmp_path: Path) -> None:
    """The cut of a partial last record waits for a journal that can be read: a failed
    open changes nothing."""
    path = tmp_path / "s.log"
    study_with_trials(path, 6)
    data, _, _ = corrupt(path, "garbage")
    path.write_bytes(data + b'{"op_code":4,"worker_id":"x","stu')
    with pytest.raises(CorruptJournal, match="at line 4"):
        open_storage(f"journal://{path}")
    assert path.read_bytes() == data + b'{"op_code":4,"worker_id":"x","stu'


def test_a_bad_whole_last_line_is_an_error_not_skipped(tmp_path: Path) -> None:
    """Optuna's reader skips a bad last line, and the next append buries it in the
    middle, where it makes the study unreadable: refused at once instead."""
    path = tmp_path / "s.log"
    study_with_trials(path, 2)
    lines = len(path.read_bytes().splitlines())
    with open(path, "ab") as f:
        f.write(b"garbage\n")
    assert len(plain_load(path).trials) == 2  # what Optuna alone makes of it
    with pytest.raises(CorruptJournal, match=f"at line {lines + 1} "):
        open_storage(f"journal://{path}")


def test_a_corrupt_record_another_process_writes_stops_reads_and_appends(
        tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    study_with_trials(path, 2)
    study = optuna.load_study(study_name="s", storage=open_storage(f"journal://{path}"))
    lines = len(path.read_bytes().splitlines())
    with open(path, "ab") as f:  # another process, after this one's last read
        f.write(b"\0" * 100 + b"\n")
    before = path.read_bytes()
    with pytest.raises(CorruptJournal, match=f"at line {lines + 1} ") as e:
        study.set_user_attr("note", "x")  # refused before it appends
    assert path.read_bytes() == before
    assert explain(e.value) == str(e.value)  # what a run's failed call says
    with pytest.raises(CorruptJournal):
        study.get_trials()


def test_every_journal_operation_has_its_fields_and_every_record_optuna_writes_passes(
        tmp_path: Path) -> None:
    """The table of fields is Optuna's list of operations, and a study that writes every
    one of them (all but DISCARD_TRIALS, which only Rustuna writes) reads back."""
    assert set(OP_FIELDS) == {int(op) for op in JournalOperation}
    path = tmp_path / "s.log"
    storage = open_storage(f"journal://{path}")
    assert isinstance(storage, optuna.storages.BaseStorage)
    study = optuna.create_study(study_name="s", storage=storage,
                                directions=["minimize", "maximize"])
    study_id = storage.get_study_id_from_name("s")
    study.set_user_attr("u", [1, 2])
    storage.set_study_system_attr(study_id, "s", {"a": None})
    study.enqueue_trial({"x": 1.0})
    study.add_trial(optuna.trial.create_trial(
        params={"x": 2.0, "c": "b"}, values=[1.0, 2.0],
        distributions={"x": optuna.distributions.FloatDistribution(0, 10),
                       "c": optuna.distributions.CategoricalDistribution(["a", "b"])},
        intermediate_values={0: 0.5}, user_attrs={"k": "v"}))
    for _ in range(2):
        trial = study.ask()
        trial.suggest_float("x", 0, 10)
        trial.suggest_categorical("c", ["a", "b"])
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        # NaN, which Optuna writes though JSON has none (a multi-objective trial takes
        # no report(): the storage's call)
        storage.set_trial_intermediate_value(trial_id, 0, float("nan"))
        trial.set_user_attr("k", 1)
        storage.set_trial_system_attr(trial_id, "k", 2)
        study.tell(trial, [1.0, 2.0])
    trial = study.ask()
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    optuna.create_study(study_name="other", storage=storage)
    optuna.delete_study(study_name="other", storage=storage)
    codes = set()
    for line in path.read_bytes().splitlines(keepends=True):
        log, problem = record_problem(line)
        assert log is not None, (problem, line)
        codes.add(log["op_code"])
    assert codes == set(OP_FIELDS) - {JournalOperation.DISCARD_TRIALS}
    again = optuna.load_study(study_name="s", storage=open_storage(f"journal://{path}"))
    assert len(again.trials) == 4  # the queued one, added, asked and failed


def test_run_show_and_export_name_a_corrupt_journal_and_write_nothing(
        tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    study_with_trials(path, 6)
    data, offset, _ = corrupt(path, "zero-filled")
    storage = f"journal://{path}"
    space = write(tmp_path, trials=2)
    out = explore_run(space, "--storage", storage, "--study", "s")
    said = [(out.exit_code, out.output)]
    for command in (["show"], ["export", "--output", str(tmp_path / "t.csv")]):
        got = explore_here(*command, "--storage", storage, "--study", "s")
        said.append((got.returncode, got.stdout + got.stderr))
    for code, text in said:
        assert code == 2, text
        assert f"journal {path} is corrupt at line 4 (byte {offset:,}): " in text, text
        assert "zero bytes" in text and "Traceback" not in text, text
    assert path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.log", "tiny.yaml"]


def test_a_corrupt_record_met_by_a_run_going_on_stops_it_with_exit_1(
        tmp_path: Path) -> None:
    """Another process writes a bad line while a driver runs: the driver's next read or
    write stops it (exit 1, the line named, no process left) and appends nothing after
    it."""
    path = tmp_path / "grid.log"
    storage = f"journal://{path}"
    # the run stops at the bad line, so a long one costs nothing: with 40 rounds it
    # sometimes ended first (exit 0) on a loaded machine
    space = grid_space(tmp_path, 12, rounds=400, workers=2, memory="400MB")
    driver = start(space, storage)
    running_trials(storage, 2, driver=driver)
    family = descendants(driver.pid)
    lock = JournalFileOpenLock(str(path))
    lock.acquire()  # as a writer would: never in the middle of the driver's append
    try:
        with open(path, "ab") as f:
            f.write(b"garbage from elsewhere\n")
        line = len(path.read_bytes().splitlines())
    finally:
        lock.release()
    (code, out), = finish([driver], timeout=120)
    assert code == 1, out
    assert f"journal {path} is corrupt at line {line} " in out and "Traceback" not in out, out
    assert path.read_bytes().endswith(b"\ngarbage from elsewhere\n")
    assert not pids_alive(family, wait=2), "a worker outlived its driver"


def test_a_lock_taken_over_while_held_is_not_released_under_its_new_holder(
        tmp_path: Path) -> None:
    """A writer stopped inside an append past the grace has its lock taken over (removed
    and made again by another): resumed, it leaves the new holder's lock file alone and
    warns, instead of failing its run on a missing file or freeing the other's lock."""
    from explore.storages._journal import LockTakenOverWarning, OwnOpenLock

    path = str(tmp_path / "s.log")
    stalled, other = OwnOpenLock(path, grace_period=3), OwnOpenLock(path, grace_period=3)
    assert stalled.acquire()
    assert other.acquire()  # after the grace (3 s), Optuna's way: by release() inside
    with pytest.warns(LockTakenOverWarning, match="taken over by another writer"):
        stalled.release()
    assert os.path.exists(f"{path}.lock")  # still the other's
    other.release()
    assert not os.path.exists(f"{path}.lock")
    assert stalled.acquire()  # and the lock works on as before
    stalled.release()


def test_the_command_says_explores_warnings_as_lines() -> None:
    """explore's own warnings (a lock taken over, a partial record cut) reach the user
    of the command as "warning: ..." lines, not as Python's file, line and source."""
    import explore.storages._journal as journal
    from explore.cli import _said

    said = _said(UserWarning("the lock was taken over"), UserWarning, journal.__file__, 9)
    assert said == "warning: the lock was taken over\n"
    other = _said(UserWarning("x"), UserWarning, optuna.__file__, 9)
    assert other.startswith(optuna.__file__) and "UserWarning: x" in other
