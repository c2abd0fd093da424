"""ONNX's backend node tests: every case of every operator the engine claims passes."""

from __future__ import annotations

import pytest

from engine.onnx_io.backend import CLAIMED, node_cases, run_case

CASES = [c for c in node_cases() if {n.op_type for n in c.model.graph.node} <= CLAIMED]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_node_case(case: object) -> None:
    outcome = run_case(case)
    if outcome.status == "skipped":  # an element type the engine does not have, say
        pytest.skip(outcome.reason)
    assert outcome.status == "passed", outcome.reason


def test_the_claimed_operators_have_cases() -> None:
    covered = {op for c in CASES for op in (n.op_type for n in c.model.graph.node)}
    assert len(CASES) > 100
    assert covered == CLAIMED - {"Dropout"} or covered == CLAIMED
