"""The scheduler <-> worker messages: every kind survives the pipe (pickled), equal
and of the same class, and none can be changed once made."""

from __future__ import annotations

import dataclasses
import pickle
from multiprocessing import Pipe
from typing import Any, get_args

import pytest

from explore.binding import bind
from explore.candidate import compile_candidate
from explore.sampling import fixed
from explore.scheduler import protocol
from explore.scheduler.shared_arrays import ArraySpec
from explore.space import parse_space

EXAMPLES: list[Any] = [
    protocol.Attach({"x_train": ArraySpec("/dev/shm/explore-data-1-x", 0, (64, 8), "float32")}),
    protocol.OpenArena(1 << 20, "/tmp/switched"), protocol.Continue(3), protocol.Pause(3),
    protocol.Stop(3), protocol.SwitchOut(3), protocol.SwitchedOut(3, 4_096, 0.01, 25_000),
    protocol.Exit(), protocol.Ready(25_000_000, 1234), protocol.ArenaOpened(),
    protocol.Report(3, 1, {"accuracy": 0.5, "eval_loss": 1.0, "loss": 1.2}, 1.0),
    protocol.Done(3, {"accuracy": 0.9, "eval_loss": 0.3, "loss": 0.2}, 10, 2, 1.5, 1.0, 2.5),
    protocol.TrialFailed(3, "ValueError: no"), protocol.Regrouped(-2),
]


def test_every_kind_has_an_example() -> None:
    kinds = set(get_args(protocol.ToWorker)) | set(get_args(protocol.FromWorker))
    with_programs = {protocol.Start, protocol.Regroup, protocol.SwitchIn}
    assert kinds - with_programs == {type(m) for m in EXAMPLES}


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_crosses_a_pipe_unchanged(msg: Any) -> None:
    ours, theirs = Pipe()
    ours.send(msg)
    got = theirs.recv()
    assert type(got) is type(msg) and got == msg
    fields = dataclasses.fields(msg)
    if fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(got, fields[0].name, None)


def test_start_carries_the_compiled_program() -> None:
    space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
                                                         "memory": "64MB"},
                         "training": {"batch_size": 8}})
    cand = compile_candidate(bind(space), fixed(space), 8_000_000)
    msg = protocol.Start(0, cand.program, 64, 7, 3, cand.train_batch, True)
    got = pickle.loads(pickle.dumps(msg))
    assert (got.number, got.offset, got.seed, got.rounds, got.gated) == (0, 64, 7, 3, True)
    assert got.program.total_bytes == cand.program.total_bytes
    assert got.program.batch_size == cand.program.batch_size


def test_a_stack_starts_and_regroups_with_its_programs() -> None:
    space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
                                                         "memory": "64MB"},
                         "training": {"batch_size": 8}})
    cand = compile_candidate(bind(space), fixed(space), 8_000_000)
    start = protocol.Start(-2, cand.program, 64, 7, 3, 8, False, members=(4, 5),
                           member_save_to=("a.npz", None))
    got = pickle.loads(pickle.dumps(start))
    assert (got.members, got.member_save_to) == ((4, 5), ("a.npz", None))
    regroup = protocol.Regroup(-2, (protocol.Part(5, cand.program, 4096, (5,), paused=True),))
    back = pickle.loads(pickle.dumps(regroup))
    assert back.parts[0].members == (5,) and back.parts[0].paused
    assert back.parts[0].program.total_bytes == cand.program.total_bytes


def test_a_switch_in_carries_the_program_its_state_was_written_from() -> None:
    space = parse_space({"dataset": "digits", "budget": {"trials": 1, "rounds": 1,
                                                         "memory": "64MB"},
                         "training": {"batch_size": 8}})
    cand = compile_candidate(bind(space), fixed(space), 8_000_000)
    got = pickle.loads(pickle.dumps(protocol.SwitchIn(5, cand.program, 8192)))
    assert (got.number, got.offset) == (5, 8192)
    assert got.program.zone_bytes == cand.program.zone_bytes
    assert protocol.state_file("/run/switched", 5) == "/run/switched/trial-5.state"
