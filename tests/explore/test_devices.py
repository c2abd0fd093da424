"""Several devices per machine (``--devices`` / ``budget.devices``): each device gets
its own budget and workers, a trial runs on one of them, and the run's record says
which.  On the CPU the devices are simulated (the same scheduler code, the budget the
sum of theirs), so the logic is tested here; the GPU path runs where a GPU is lent."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import optuna
import pytest

from engine.alignment import align_down
from explore.binding import bind
from explore.datasets import load_digits
from explore.runner import RunRefused, check_gpus, prepare
from explore.scheduler import Scheduler
from explore.scheduler.admission import headroom
from explore.scheduler.processes import one_gpu
from explore.space import Budget, SpaceError, load_space, machine_memory
from explore.study import open_study
from tests.explore.cli_run import IN_TEST, explore_run, explore_run_here

SPACE = """\
name: devs
dataset: {{name: digits, train: 300, valid: 100}}
budget: {{trials: {trials}, rounds: {rounds}, memory: {memory}, workers: {workers},
          devices: {devices}}}
sampler: random
pruner: none
keep_models: 0
model:
  depth: 1
  width: {{int: [8, 32]}}
  activation: relu
training:
  optimizer: adam
  lr: 0.01
  batch_size: 32
"""


def write(tmp_path: Path, trials: int = 8, rounds: int = 2, memory: str = "250MB",
          workers: int = 1, devices: str = "[0, 1]") -> Path:
    f = tmp_path / "devs.yaml"
    f.write_text(SPACE.format(trials=trials, rounds=rounds, memory=memory, workers=workers,
                              devices=devices))
    return f


def test_each_device_gets_its_budget_and_workers_and_a_trial_runs_on_one(
        tmp_path: Path) -> None:
    f = write(tmp_path, trials=10, workers=2, memory="200MB", devices="[0, 3]")
    space = load_space(f)
    study = open_study(space, f"sqlite:///{tmp_path / 'devs.db'}")
    sched = Scheduler(bind(space), study, load_digits(), workers=2, memory=space.budget.memory,
                      device="cpu", devices=space.budget.ordinals, main=IN_TEST)
    arenas: dict[int, list[tuple[int, int]]] = {}

    def watch(stats: object) -> None:  # the workers as they were while trials ran
        for w in sched.workers.values():
            arenas.setdefault(w.device, [])
            if (w.index, w.arena) not in arenas[w.device]:
                arenas[w.device].append((w.index, w.arena))

    sched.progress = watch
    stats = sched.run(10)
    per = space.budget.memory
    assert stats.budget == 2 * per and stats.devices == [0, 3]
    assert sorted(arenas) == [0, 3] and all(len(v) == 2 for v in arenas.values())
    share = -(-(stats.main + stats.tracker + stats.data) // 2)
    overhead = dict(zip(range(4), stats.overheads, strict=True))
    for _, ws in arenas.items():
        # each device's workers and arenas, its share of the host's bytes and its
        # headroom fit its own budget, the arenas as large as that leaves
        used = share + headroom(per) + sum(overhead[i] + a for i, a in ws)
        assert used <= per
        assert all(a == align_down((per - share - headroom(per) -
                                    sum(overhead[i] for i, _ in ws)) // 2) for _, a in ws)
    ts = [t for t in optuna.load_study(study_name="devs", storage=study._storage).trials
          if t.state.is_finished()]
    assert len(ts) == 10 and all(t.state.name == "COMPLETE" for t in ts)
    placed = {t.user_attrs["explore"]["device_index"] for t in ts}
    assert placed == {0, 3}  # both devices ran trials
    for t in ts:  # the worker a trial ran in is on the device its record names
        w = t.user_attrs["explore"]["worker"]
        assert (0, 3)[w % 2] == t.user_attrs["explore"]["device_index"]
    assert stats.peak <= stats.budget
    assert stats.measured_peak == 0 or stats.measured_peak <= stats.budget


def test_a_worker_that_dies_is_replaced_on_its_own_device(tmp_path: Path) -> None:
    f = write(tmp_path, trials=4, rounds=20, workers=1)
    space = load_space(f)
    study = open_study(space, f"sqlite:///{tmp_path / 'devs.db'}")
    killed: list[tuple[int, int]] = []

    def kill_once(stats: object) -> None:
        busy = [w for w in sched.workers.values() if w.residents and w.device == 1]
        if not killed and busy:
            killed.append((busy[0].index, busy[0].arena))
            os.kill(busy[0].pid, signal.SIGKILL)

    sched = Scheduler(bind(space), study, load_digits(), workers=1, memory=space.budget.memory,
                      device="cpu", devices=[0, 1], main=IN_TEST, progress=kill_once)
    sched.run(4)
    assert killed
    index, arena = killed[0]
    replacement = sched.workers[index]
    assert replacement.device == 1 and 0 < replacement.arena <= arena
    assert sum(w.device == 1 for w in sched.workers.values()) == 1


def test_explore_run_with_devices_records_them(tmp_path: Path) -> None:
    f = write(tmp_path, trials=4, devices="null")
    r = explore_run(f, "--devices", "0,1", "--memory", "220MB")
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="devs", storage=f"sqlite:///{tmp_path / 'devs.db'}")
    run = study.user_attrs["runs"][-1]
    assert run["devices"] == [0, 1] and run["budget"] == 2 * 220_000_000
    assert run["workers"] == 2
    assert {t.user_attrs["explore"]["device_index"] for t in study.trials} == {0, 1}


@pytest.mark.parametrize(("value", "message"), [
    ("0,x", "not a list of device numbers"),
    ("0,,1", "not a list of device numbers"),
    ("-1", "not a list of device numbers"),
    ("0,0", "device 0 is listed twice"),
    ("2000", "less than or equal to 1023"),
])
def test_bad_devices_on_the_command_line_are_refused(tmp_path: Path, value: str,
                                                     message: str) -> None:
    f = write(tmp_path, devices="null")
    r = explore_run_here(f, "--devices", value)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "devs.db").exists()  # nothing written


@pytest.mark.parametrize(("devices", "message"), [
    ("[0, 0]", "listed twice"),
    ("[]", "at least 1"),
    ("[0, '1']", "valid integer"),
    ("[0, true]", "valid integer"),
    ("1", "valid list"),
])
def test_bad_devices_in_a_space_name_their_line(tmp_path: Path, devices: str,
                                                message: str) -> None:
    f = write(tmp_path, devices=devices)
    with pytest.raises(SpaceError) as e:
        load_space(f)
    text = str(e.value)
    assert message in text and "devs.yaml:4: budget.devices" in text, text


def test_simulated_devices_share_the_machines_memory() -> None:
    have = machine_memory()
    assert have
    each = have * 6 // 10
    Budget(trials=1, rounds=1, memory=each)  # one device: fits
    with pytest.raises(ValueError, match=f"2 devices of {each:,}"):
        Budget(trials=1, rounds=1, memory=each, devices=[0, 1])


def test_gpu_ordinals_are_checked_against_the_machine(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    import engine.runtime.backends as backends

    monkeypatch.setattr(backends, "gpu_available", lambda: True)
    monkeypatch.setattr(backends, "gpu_count", lambda: 2)
    monkeypatch.setattr(backends, "gpu_memory_bytes",
                        lambda d=0: {0: 80_000_000_000, 1: 40_000_000_000}[d])
    ok = Budget(trials=1, rounds=1, device="gpu", memory="30GB", devices=[0, 1])
    check_gpus(ok)
    with pytest.raises(RunRefused, match="device 2 is not on this machine, which has 2"):
        check_gpus(ok.model_copy(update={"devices": [0, 2]}))
    with pytest.raises(RunRefused, match="more than GPU 1 has"):
        check_gpus(ok.model_copy(update={"memory": 50_000_000_000}))
    monkeypatch.setattr(backends, "gpu_available", lambda: False)
    with pytest.raises(RunRefused, match="no CUDA device"):
        check_gpus(ok)


def test_a_gpu_worker_sees_only_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with one_gpu("gpu", 1):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # ordinals count within these
    with one_gpu("gpu", 1):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"
    with one_gpu("cpu", 1):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"


def test_the_budget_override_validates_devices(tmp_path: Path) -> None:
    f = write(tmp_path, devices="null")
    assert prepare(f, devices=[1, 0]).space.budget.ordinals == [1, 0]
    with pytest.raises(RunRefused, match="listed twice"):
        prepare(f, devices=[1, 1])


@pytest.mark.gpu
def test_gpu_devices_each_run_trials(tmp_path: Path) -> None:
    from engine.runtime.backends import gpu_available, gpu_count

    if not gpu_available():
        pytest.skip("no CUDA device with cupy on this machine")
    ordinals = list(range(min(2, gpu_count())))
    f = write(tmp_path, trials=4, memory="2GB", devices=str(ordinals))
    text = f.read_text().replace("memory: 2GB", "memory: 2GB, device: gpu")
    f.write_text(text)
    r = explore_run(f)
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="devs", storage=f"sqlite:///{tmp_path / 'devs.db'}")
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    assert {t.user_attrs["explore"]["device_index"] for t in study.trials} == set(ordinals)
