"""One study, many drivers, and faults: ``explore run`` processes started together on
one storage cooperate on its total; a driver killed mid-run has its trials failed as
stale and re-queued by the others; the only driver killed, or stopped with Ctrl-C,
leaves no process behind and the next run completes the study; a full disk stops the
run at its first failed write with everything before it kept.

Each storage the issue names is covered: SQLite (one host), Optuna's journal file (one
host, no server) and a real PostgreSQL server the suite starts (``tests/pg_server.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from explore.attrs import REQUEUED_FROM
from explore.live import counted
from explore.live.names import final_record, owes_repeat
from tests.conftest import _unavailable
from tests.explore.drivers import (
    check_study,
    descendants,
    fill,
    finish,
    finish_watching,
    grid_space,
    pids_alive,
    running_trials,
    runs_again,
    shared_files,
    signal_once_said,
    small_disk,
    start,
    stop_between_writes,
    stopped_by,
    trials,
)


def _journal(tmp_path: Path) -> str:
    return f"journal:///{tmp_path / 'grid.log'}"


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'grid.db'}"


def _slow(*values: str) -> object:
    """A case of CI's slow step, which runs every case (PostgreSQL's server starts once
    per session).  The README's command (which deselects ``slow``, and must end within 8
    minutes on CI's two cores) keeps one case, of the storage where it takes least, of
    the faults that take under about 8 s (kill -9 of the only driver, of a driver beside
    others, of a worker; Ctrl-C twice; the disk and the model store full) and of drivers
    taking distinct points; the longer cases (two drivers at once, Ctrl-C once, SIGTERM,
    the file deleted, the disk remounted read-only) are the slow step's."""
    return pytest.param(*values, marks=pytest.mark.slow)


def _storage(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return (_sqlite if kind == "sqlite" else _journal)(tmp_path)


@pytest.mark.parametrize("kind", [_slow("sqlite"), _slow("journal")])
def test_two_drivers_share_a_study_on_one_host(tmp_path: Path, kind: str) -> None:
    """Started at the same instant on a new file: the schema is created once, the grid
    of 30 is run once, point by point, between them."""
    storage = (_sqlite if kind == "sqlite" else _journal)(tmp_path)
    # 80 rounds: trials long enough (about 4 s in all) that a driver starting a moment
    # later still finds points to take (at 20 rounds one driver sometimes ran all 30
    # before the other had asked for one)
    space = grid_space(tmp_path, 30, rounds=80)
    results = finish([start(space, storage), start(space, storage)])
    assert all(code == 0 for code, _ in results), results
    ts = check_study(storage, 30)
    drivers = {t.user_attrs["explore"]["driver"] for t in ts if counted(t)}
    assert len(drivers) == 2  # both took part
    assert all(t.user_attrs["explore"]["pid"] and t.user_attrs["explore"]["host"]
               for t in ts if counted(t))


@pytest.mark.parametrize("kind", [_slow("sqlite"), _slow("journal")])
def test_a_driver_stopped_first_leaves_the_others_kept_models_alone(tmp_path: Path,
                                                                    kind: str) -> None:
    """Two drivers keeping models in one store; one is stopped with Ctrl-C in the middle
    of the run: the other goes on and finishes the study, none of its trials failed
    (a driver ending removed the staging folder the other's workers wrote into)."""
    storage = (_sqlite if kind == "sqlite" else _journal)(tmp_path)
    space = grid_space(tmp_path, 30, rounds=40, keep=5)
    first, other = start(space, storage), start(space, storage)
    running_trials(storage, 2)
    time.sleep(0.5)
    os.killpg(first.pid, signal.SIGINT)
    (code, out), (other_code, other_out) = finish([first, other])
    assert code == 130, out
    assert other_code == 0, other_out
    ts = check_study(storage, 30)
    # no failure that counts: the stopped driver's trials failed as interrupted and
    # ran again (a queued repeat whose grid point ran meanwhile gives way, uncounted)
    failed = [t.user_attrs["explore"]["fail_reason"] for t in ts
              if t.state == TrialState.FAIL and counted(t)]
    assert not failed, failed
    store = tmp_path / "grid.artifacts"
    assert not (store / ".staging").exists()  # both ended: nothing staged is left
    assert 1 <= len([p for p in store.iterdir()]) <= 5


SEEDED = """\
name: grid
dataset: {{name: digits, train: 300, valid: 100}}
budget: {{trials: {trials}, rounds: 2, memory: 300MB, workers: 1}}
sampler: {{name: {sampler}, seed: 0}}
pruner: none
keep_models: 0
model: {{depth: 1, width: {{int: [8, 64]}}, activation: relu}}
training: {{optimizer: adam, lr: {{float: [0.0001, 0.1], log: true}}, batch_size: 32}}
"""


@pytest.mark.parametrize("kind,sampler", [_slow("sqlite", "tpe"), ("journal", "random")])
def test_drivers_and_a_resumed_run_draw_distinct_points(tmp_path: Path, kind: str,
                                                        sampler: str) -> None:
    """Three drivers started together on a new study with one sampler seed, then a run
    that resumes it for more trials: no two trials hold the same parameters (each
    trial's randomness is the seed's and its own number's, issue 32, item 1)."""
    storage = (_sqlite if kind == "sqlite" else _journal)(tmp_path)
    space = tmp_path / "seeded.yaml"
    space.write_text(SEEDED.format(trials=12, sampler=sampler))
    results = finish([start(space, storage) for _ in range(3)])
    assert all(code == 0 for code, _ in results), results
    ts = check_study(storage, 12)
    assert len({tuple(sorted(t.params.items())) for t in ts if counted(t)}) == 12
    space.write_text(SEEDED.format(trials=18, sampler=sampler))
    (code, out), = finish([start(space, storage)])
    assert code == 0, out
    ts = check_study(storage, 18)
    assert len({tuple(sorted(t.params.items())) for t in ts if counted(t)}) == 18


@pytest.mark.slow
def test_four_drivers_two_workers_each_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    """The issue's case: four drivers, two workers each, 200 short trials."""
    space = grid_space(tmp_path, 200, workers=2, memory="400MB")
    results = finish([start(space, postgres_url) for _ in range(4)], timeout=900)
    assert all(code == 0 for code, _ in results), results
    ts = check_study(postgres_url, 200)
    assert len({t.user_attrs["explore"]["driver"] for t in ts if counted(t)}) == 4


@pytest.mark.parametrize("kind", [_slow("sqlite"), "journal", _slow("postgres")])
def test_a_driver_killed_mid_run_is_taken_over(tmp_path: Path, kind: str,
                                               request: pytest.FixtureRequest) -> None:
    """``kill -9`` of a driver holding trials, then two drivers on the study: they fail
    its trials as stale (its process is gone from this host) and run each again under
    its own number, finish the study exactly, without a traceback; no worker of the
    killed driver outlives it, and its shared data file (which ``kill -9`` leaves) is
    swept by the drivers that start after it."""
    storage = _storage(kind, tmp_path, request)
    # 30 rounds: a run of 8-round trials can end between two looks for a running one
    space = grid_space(tmp_path, 16, rounds=30, grace=3)
    victim = start(space, storage)
    running_trials(storage, 1, driver=victim)
    family = descendants(victim.pid)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    others = [start(space, storage), start(space, storage)]
    results = finish(others)
    assert all(code == 0 for code, _ in results), results
    assert not [out for _, out in results if "Traceback" in out], results
    ts = check_study(storage, 16)
    stale = [t for t in ts if t.state == TrialState.FAIL
             and t.user_attrs["explore"]["fail_reason"].startswith("stale:")]
    assert stale and all(t.user_attrs["explore"]["retried"] for t in stale)
    repeats = {t.user_attrs["explore"].get("requeued_from") for t in ts if counted(t)}
    assert {t.number for t in stale} <= repeats  # each ran again, under its own number
    # swept when a run makes its own file (shared_arrays.sweep_stale): each of the two
    # did, after the kill (under -n 2 another test's run may have been first)
    assert not shared_files(victim.pid)
    assert not pids_alive(family, wait=0.5), "a worker outlived its driver"


@pytest.mark.parametrize("kind", [_slow("sqlite"), _slow("journal"), _slow("postgres")])
def test_a_driver_stalled_past_the_grace_then_resumed(tmp_path: Path, kind: str,
                                                      request: pytest.FixtureRequest) -> None:
    """SIGSTOP of a driver and its workers (a suspended laptop, a paused VM) past the
    grace while another driver works: the other fails its trials as stale and runs them
    again; resumed (SIGCONT), the stalled driver's late writes take nothing back, and
    the study ends exact: its total, no grid point counted twice, nothing running.  On
    PostgreSQL a driver stopped inside a transaction has its session ended by the server
    after a minute: it stops on waking, saying so, and the next run goes on."""
    storage = _storage(kind, tmp_path, request)
    # 30 rounds: under load a run of 8-round trials could end before it was seen running
    space = grid_space(tmp_path, 16, rounds=30, grace=3)
    stalled = start(space, storage)
    running_trials(storage, 1, driver=stalled)
    if kind == "sqlite":
        db = tmp_path / "grid.db"
        stop_between_writes(stalled, [db, Path(f"{db}-shm")])
    else:
        os.killpg(stalled.pid, signal.SIGSTOP)
    try:
        other = start(space, storage)
        deadline = time.time() + 120
        while not [t for t in trials(storage) if t.state == TrialState.FAIL and
                   str(final_record(t).get("fail_reason", "")).startswith("stale:")]:
            assert time.time() < deadline, "no trial of the stalled driver turned stale"
            assert other.poll() is None, other.communicate()[0]
            time.sleep(0.2)
    finally:
        os.killpg(stalled.pid, signal.SIGCONT)
    results = finish([stalled, other])
    assert not [out for _, out in results if "Traceback" in out], results
    (stalled_code, stalled_out), (other_code, other_out) = results
    assert other_code == 0, other_out
    if kind == "postgres" and stalled_code == 1:
        # Stopped inside a write, it held row locks the other driver's writes waited
        # on, until the server ended its session (idle in a transaction for a minute,
        # POSTGRES_OPTIONS; its transaction rolled back). Woken, it finds its connection
        # gone and stops as a driver whose server went away does; running it again goes
        # on with the study, as the message says.
        assert "the database server went away" in stalled_out and \
            "run the same command to go on" in stalled_out, stalled_out
        runs_again(space, storage, 16)
    else:
        assert stalled_code == 0, stalled_out
    ts = check_study(storage, 16)
    stale = [t for t in ts if str(final_record(t).get("fail_reason", "")).startswith("stale:")]
    # each stale trial has exactly one repeat queued; whether that repeat counts is the
    # total's business (check_study): a claim stopped before its parameters were written
    # holds no grid point, and its repeat, an empty slot, gives way once the grid is run
    repeats = Counter(t.user_attrs.get(REQUEUED_FROM) for t in ts)
    assert stale and all(repeats[t.number] == 1 for t in stale if owes_repeat(t)), [
        (t.number, t.state.name, t.params, final_record(t).get("fail_reason"),
         t.user_attrs.get(REQUEUED_FROM), counted(t)) for t in ts]
    assert all(owes_repeat(t) for t in stale if REQUEUED_FROM not in t.user_attrs)


# How a driver is stopped: Ctrl-C (the terminal signals the whole group), Ctrl-C twice
# about 50 ms apart (the second ends it at once, without its cleanup), Ctrl-C again
# once it says it was interrupted (its cleanup done, the handlers of the run gone: the
# second ends it at once all the same), SIGTERM to the whole group (systemd, SLURM) and
# SIGHUP to the driver alone (a closed terminal).
SIGNALLED = {"interrupt": (signal.SIGINT, True, 130), "twice": (signal.SIGINT, True, 130),
             "again": (signal.SIGINT, True, 130), "terminate": (signal.SIGTERM, True, 143),
             "hangup": (signal.SIGHUP, False, 129)}


@pytest.mark.parametrize("how,kind", [
    _slow("kill", "sqlite"), _slow("kill", "journal"), _slow("kill", "postgres"),
    _slow("interrupt", "sqlite"), _slow("interrupt", "journal"), _slow("interrupt", "postgres"),
    # over 8 s each on SQLite too (the fast check of both is the test after this one)
    _slow("twice", "sqlite"), _slow("twice", "journal"), _slow("twice", "postgres"),
    _slow("again", "sqlite"), _slow("again", "journal"), _slow("again", "postgres")])
def test_the_only_driver_stopped_then_run_again(tmp_path: Path, how: str, kind: str,
                                                request: pytest.FixtureRequest) -> None:
    """``kill -9``, Ctrl-C or Ctrl-C twice of the only driver: no process is left,
    nothing finished is lost, Ctrl-C exits 130 and queues its trials again, Ctrl-C twice
    exits 130 at once but removes its shared data first (and 130 too when the second
    comes while the first is reported: not click's "Aborted!" and 1), and the next run
    completes the study exactly, without a traceback, leaving nothing behind either."""
    _stop_then_run_again(tmp_path, how, _storage(kind, tmp_path, request))


@pytest.mark.parametrize("how,kind", [
    _slow("terminate", "sqlite"), _slow("terminate", "journal"), _slow("terminate", "postgres"),
    _slow("hangup", "sqlite"), _slow("hangup", "journal"), _slow("hangup", "postgres")])
def test_sigterm_and_sighup_stop_a_run_as_ctrl_c_does(tmp_path: Path, how: str, kind: str,
                                                      request: pytest.FixtureRequest) -> None:
    """A job scheduler's SIGTERM (to every process of the job) or a closed terminal's
    SIGHUP: the trials in hand are queued again, the exit status is 128 + the signal,
    the summary is printed, no worker is left, and the next run completes the study."""
    _stop_then_run_again(tmp_path, how, _storage(kind, tmp_path, request))


def _stop_then_run_again(tmp_path: Path, how: str, storage: str) -> None:
    # long enough (about 4 s of trials after the first two are seen running) that the
    # signal meets the run going on, however late a loaded machine lets the test look:
    # with 30 rounds the run sometimes ended first (exit 0)
    space = grid_space(tmp_path, 10, rounds=120, workers=2, memory="400MB")
    driver = start(space, storage)
    running_trials(storage, 2, driver=driver)
    family = descendants(driver.pid)
    assert family
    assert shared_files(driver.pid) or not os.path.isdir("/dev/shm")
    if how == "kill":
        os.kill(driver.pid, signal.SIGKILL)
    else:
        signum, group, _ = SIGNALLED[how]
        send = os.killpg if group else os.kill
        send(driver.pid, signum)
        if how == "twice":
            time.sleep(0.05)
            send(driver.pid, signum)
    said = signal_once_said(driver, "interrupted: the trials in hand", signal.SIGINT) \
        if how == "again" else ""
    out = said + driver.communicate(timeout=60)[0]
    assert not pids_alive(family, wait=0.5), "a worker outlived its driver"
    # kill -9 leaves the file; any run on the machine may sweep it from then on (under
    # -n 2 another test's driver sometimes did before this line), so only a stopped
    # driver's absence is asserted here, and the killed one's after the next run
    assert how == "kill" or not shared_files(driver.pid)
    before = [t for t in trials(storage) if t.state.is_finished()]
    if how != "kill":
        status = SIGNALLED[how][2]
        # A second signal that lands once Python is shutting down (its exit status
        # chosen, the report done) meets the default action, which Python puts back as
        # it ends: the process is killed by it, which a shell reports as the same 128+n.
        allowed = {status, 128 - status} if how in ("twice", "again") else {status}
        assert driver.returncode in allowed, out
        assert "Traceback" not in out, out
    if how not in ("kill", "twice"):  # stopped with its cleanup: the summary says so
        assert "interrupted" in out
        assert not any(t.state == TrialState.RUNNING for t in trials(storage))
        failed = [t for t in trials(storage) if t.state == TrialState.FAIL]
        assert failed and all(t.user_attrs["explore"]["fail_reason"] == "interrupted"
                              for t in failed)
        assert any(t.state == TrialState.WAITING for t in trials(storage))  # queued again
    if how not in ("kill", "twice", "again"):  # its report whole (Ctrl-C again cut it)
        # what the message says is kept: the trials that count, not the interrupted
        reported = re.search(r"kept: (\d+) finished trials?\b", out)  # 1 trial, 2 trials
        assert reported, out
        assert int(reported.group(1)) == sum(counted(t) for t in trials(storage))
    next_run = start(space, storage)
    code, again, rerun = finish_watching(next_run)
    assert code == 0 and "Traceback" not in again, again
    assert not shared_files(driver.pid)  # the next run swept it
    ts = check_study(storage, 10)
    kept = {t.number: t.state for t in ts}
    assert all(kept[t.number] == t.state for t in before)  # nothing finished was lost
    assert not pids_alive(rerun, wait=0.5), "a worker outlived the next run"
    assert not shared_files(next_run.pid)


@pytest.mark.parametrize("when", ["50ms", "while-reported"])
def test_a_second_ctrl_c_ends_at_once_and_leaves_no_shared_data(tmp_path: Path,
                                                                when: str) -> None:
    """Ctrl-C twice, 50 ms apart or the second while the driver reports the first: it
    ends at once with 130 (not click's "Aborted!" and 1), without a traceback, its
    shared data set removed first; no worker outlives it.  (On each storage, with the
    study completed by the next run: ``test_the_only_driver_stopped_then_run_again``,
    in CI's slow step.)"""
    storage = _sqlite(tmp_path)
    # rounds enough that the run still goes on once two trials are seen placed: at 30,
    # its workers started ahead, the ten trials ended in under 2 s on a loaded machine,
    # once before the test's reads of the study saw two at a time
    driver = start(grid_space(tmp_path, 10, rounds=120, workers=2, memory="400MB"), storage)
    running_trials(storage, 2, driver=driver)
    family = descendants(driver.pid)
    assert shared_files(driver.pid) or not os.path.isdir("/dev/shm")
    os.killpg(driver.pid, signal.SIGINT)
    if when == "50ms":
        time.sleep(0.05)
        os.killpg(driver.pid, signal.SIGINT)
        said = ""
    else:
        said = signal_once_said(driver, "interrupted: the trials in hand", signal.SIGINT)
    out = said + driver.communicate(timeout=60)[0]
    assert driver.returncode == 130 and "Traceback" not in out, out
    assert not pids_alive(family, wait=0.5), "a worker outlived its driver"
    assert not shared_files(driver.pid)


@pytest.mark.parametrize("kind", ["sqlite", _slow("journal"), _slow("postgres")])
def test_a_killed_worker_is_requeued_under_the_right_number(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    """``kill -9`` of a worker: its trial fails as died and runs again under its own
    number, the run goes on with a new worker and ends 0; the summary names the death,
    and once the run ends no process of it is left, nor its shared data file."""
    storage = _storage(kind, tmp_path, request)
    # rounds enough that the run outlasts the look for its worker on a loaded machine
    space = grid_space(tmp_path, 6, rounds=120, workers=1)
    driver = start(space, storage)
    running_trials(storage, 1, driver=driver)
    family = descendants(driver.pid)
    workers = [p for p in family if _is_worker(p)]
    assert workers, (family, driver.poll())
    os.kill(workers[0], signal.SIGKILL)
    code, out, later = finish_watching(driver)  # the replacement worker among them
    assert code == 0, out
    assert "Traceback" not in out, out
    ts = check_study(storage, 6)
    died = [t for t in ts if t.state == TrialState.FAIL]
    assert died and all("died" in t.user_attrs["explore"]["fail_reason"] for t in died)
    # the run's summary (which --quiet prints too, wrapped to the terminal's width), as
    # explore.scheduler.loop words it: the trials the worker held (a paused one too)
    assert f"worker 0 (pid {workers[0]}) died with exit code -9: its {len(died)} trials " \
        "failed and were queued again, and a new worker took its place" in " ".join(
            out.split()), out
    for t in died:  # the record names the trial that failed, as the storage numbers it
        repeat = [r for r in ts if r.user_attrs["explore"].get("requeued_from") == t.number]
        assert len(repeat) == 1 and repeat[0].params == t.params
    assert not pids_alive(family + later, wait=0.5), "a process of the run outlived it"
    assert not shared_files(driver.pid)


def _is_worker(pid: int) -> bool:
    """A worker: a child of the driver named as one, or running multiprocessing's spawn
    main (the resource tracker runs its own module); one gone meanwhile is not."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "explore-worker" in cmd or "spawn_main" in cmd


def test_a_full_disk_stops_the_run_at_the_first_failed_write(tmp_path: Path) -> None:
    with small_disk(tmp_path, "2m") as disk:
        storage = f"sqlite:///{disk / 'grid.db'}"
        space = grid_space(tmp_path, 40, rounds=2)
        driver = start(space, storage)
        running_trials(storage, 1)
        time.sleep(1.0)
        filler = fill(disk)  # the disk fills up while the run goes on
        code, out = finish([driver], timeout=120)[0]
        assert code == 1, out
        assert "Traceback" not in out
        assert "the study's storage failed: the disk that holds the study's storage is " \
            "full" in out, out
        filler.unlink()  # readable again: every trial written before is there
        written = [t for t in trials(storage) if t.state.is_finished()]
        assert len(written) < 40


@pytest.mark.parametrize("kind", [_slow("sqlite"), _slow("journal")])
def test_the_study_file_deleted_mid_run(tmp_path: Path, kind: str,
                                        request: pytest.FixtureRequest) -> None:
    """The study's file deleted under a running driver (an operator's ``rm``): it stops
    at its next call, exit 1, naming the file and that it was deleted, rather than go on
    writing where no one reads; no process and no shared file is left, nor a SQLite log
    that a new database at that path would replay; the next run starts the study anew
    there and completes it exactly."""
    storage = _storage(kind, tmp_path, request)
    path = tmp_path / ("grid.db" if kind == "sqlite" else "grid.log")
    space = grid_space(tmp_path, 12, rounds=120, workers=2, memory="400MB")
    driver, out = stopped_by(space, storage, path.unlink, frozen=True)  # lands mid-run
    assert f"{path} was deleted while the run went on" in out, out
    assert not shared_files(driver.pid)
    assert not list(tmp_path.glob("grid.db-*")), list(tmp_path.iterdir())
    runs_again(space, storage, 12)


@pytest.mark.slow
def test_the_database_dropped_mid_run(tmp_path: Path, postgres: Any, postgres_url: str
                                      ) -> None:
    """The study's PostgreSQL database dropped under a running driver (its connections
    ended): it stops, exit 1, saying the server ended its connection, no traceback, no
    process left; a run while the database is missing is told it does not exist and to
    create it; once created again, a run completes the study anew."""
    space = grid_space(tmp_path, 12, rounds=40, workers=2, memory="400MB")
    _, out = stopped_by(space, postgres_url, lambda: postgres.drop_database(postgres_url),
                        frozen=True)
    assert "does not exist" in out or "went away" in out, out
    (code, missing), = finish([start(space, postgres_url)], timeout=120)
    assert code in (1, 2) and "Traceback" not in missing, missing
    assert "does not exist" in missing and "createdb" in missing, missing
    postgres.new_database(postgres_url.rsplit("/", 1)[1])
    runs_again(space, postgres_url, 12)


def test_the_model_stores_disk_full_mid_run(tmp_path: Path) -> None:
    """The disk of the model store (``artifacts``) has room for fewer models than the run
    keeps: once it is full, each trial's result is still written and counts, those whose
    model could not be kept say why (``model_error``), no partial model or staging file
    is left, and the run ends as usual (exit 0, the study exact).  The room is set
    before the run, not filled during it, so that how fast the trials run does not
    decide what the test sees."""
    with small_disk(tmp_path, "4m") as disk:
        storage = _sqlite(tmp_path)
        space = grid_space(tmp_path, 12, rounds=2, keep=3)
        space.write_text(space.read_text() + f"artifacts: {disk}\n")
        reserve = disk / "reserve"
        reserve.write_bytes(b"\0" * 8 * 1024)  # two pages: the 3 models kept take 3 or more
        filler = fill(disk)
        reserve.unlink()
        (code, out), = finish([start(space, storage)], timeout=300)
        assert code == 0, out
        assert "Traceback" not in out, out
        ts = check_study(storage, 12)
        assert all(t.state == TrialState.COMPLETE and t.values for t in ts), \
            [(t.number, t.state, t.values, t.user_attrs["explore"].get("fail_reason")) for t in ts]
        errors = [t.user_attrs["explore"].get("model_error") for t in ts]
        assert any(e and "No space left" in e for e in errors), errors
        left = {p.name for p in disk.rglob("*") if p.is_file()} - {filler.name}
        assert not [n for n in left if n.endswith((".part", ".npz"))], left


@pytest.mark.slow
def test_the_disk_remounted_read_only_mid_run(tmp_path: Path) -> None:
    """The journal's file system remounted read-only under a running driver: it stops at
    its first failed write, exit 1, saying the storage cannot be written and why, no
    traceback, no process left; once writable again, the next run completes the study
    exactly.  (A file system with a file open for writing, as SQLite keeps its database,
    cannot be remounted read-only but by the kernel itself, after an I/O error; SQLite's
    "readonly database" then is explained as test_errors shows.)"""
    with small_disk(tmp_path, "20m") as disk:
        storage = _journal(disk)
        space = grid_space(tmp_path, 12, rounds=120, workers=2, memory="400MB")
        _, out = stopped_by(space, storage, lambda: subprocess.run(
            ["mount", "-o", "remount,ro", str(disk)], check=True), frozen=True, closed=disk)
        assert "cannot be written" in out and "read-only" in out, out
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        runs_again(space, storage, 12)


@pytest.mark.slow
def test_the_database_servers_disk_full_mid_run(tmp_path: Path) -> None:
    """The disk under a PostgreSQL server fills up mid-run: the driver stops, exit 1,
    saying the disk is full (or, where the server itself stopped on it, that the server
    went away), no traceback, no process left; with room made (and the server started
    again if it stopped), the next run completes the study exactly."""
    from tests.pg_server import PgServer, PostgresUnavailable

    base = Path(tempfile.mkdtemp(prefix="explore-pg-disk-"))  # the server's user
    base.chmod(0o755)  # reaches it, as not the tests' own temporary folders
    try:
        with small_disk(base, "160m") as disk:
            try:
                server = PgServer().start(disk / "pg")
            except PostgresUnavailable as e:
                _unavailable(str(e))
            try:
                storage = server.new_database("full")
                space = grid_space(tmp_path, 12, rounds=40, workers=2, memory="400MB")
                # frozen while the disk fills: with its workers started ahead the run
                # once ended before the fault landed
                _, out = stopped_by(space, storage, lambda: fill(disk), frozen=True)
                assert "disk that holds the study's storage is full" in out or \
                    "went away" in out, out
                (disk / "filler").unlink()
                if not server.answers():
                    server.resume()
                runs_again(space, storage, 12)
            finally:
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_the_database_server_stopped_mid_run_then_started_again(tmp_path: Path) -> None:
    """A PostgreSQL server that goes away mid-run (stopped at once, as a crash would):
    the driver stops with exit 1 and says the server went away, leaves no process
    behind; once the server is back, the next run completes the study exactly."""
    from tests.pg_server import PgServer, PostgresUnavailable

    try:
        server = PgServer().start()
    except PostgresUnavailable as e:  # as the session's server fixture: CI must have one
        _unavailable(str(e))
    try:
        storage = server.new_database("gone")
        space = grid_space(tmp_path, 12, rounds=40, workers=2, memory="400MB")
        # frozen: a short study could otherwise end before the server has stopped
        _, out = stopped_by(space, storage, server.pause, frozen=True)
        assert "the database server went away" in out, out
        server.resume()
        runs_again(space, storage, 12)
    finally:
        server.stop()
