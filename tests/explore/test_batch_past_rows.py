"""A batch size larger than the training rows: the program is compiled for the rows
there are (one mini-batch an epoch, as a larger batch would train), not for rows that
never come, so a trial holds no bytes it never uses."""

from __future__ import annotations

from explore.binding import bind
from explore.candidate import compile_candidate, train_rows
from explore.sampling import fixed
from explore.space import parse_space


def space(batch: int | str, train: int | None = 100) -> dict:
    dataset = {"name": "digits", **({"train": train} if train is not None else {})}
    return {"dataset": dataset, "budget": {"trials": 1, "rounds": 1, "memory": "256MB"},
            "training": {"batch_size": batch, "eval_batch_size": 64}}


def test_a_batch_past_the_rows_is_compiled_for_the_rows() -> None:
    bound = bind(parse_space(space(512)))
    c = compile_candidate(bound, fixed(bound.space), 1 << 30)
    assert train_rows(bound) == 100
    assert c.train_batch == 100 and c.program.batch_size == 100
    from engine import compile_graph
    from explore.candidate import graph_of
    from explore.optimizers import build_optimizer

    params = fixed(bound.space)
    at_512 = compile_graph(graph_of(bound, params), batch_size=512,
                           optimizer=build_optimizer(params))
    assert c.program.total_bytes < at_512.total_bytes


def test_the_split_bounds_it_without_a_head_and_auto_too() -> None:
    bound = bind(parse_space(space(4096, train=None)))
    assert compile_candidate(bound, fixed(bound.space), 1 << 30).train_batch == 1078
    auto = bind(parse_space({**space("auto"), "training": {"batch_size": "auto",
                                                           "auto_max_batch": 4096}}))
    assert compile_candidate(auto, fixed(auto.space), 1 << 30).train_batch == 100


def test_a_batch_within_the_rows_is_kept() -> None:
    bound = bind(parse_space(space(32)))
    c = compile_candidate(bound, fixed(bound.space), 1 << 30)
    assert c.train_batch == 32 and c.program.batch_size == 64  # validation's chunk
