"""ONNX's backend node tests: every case of every operator the engine claims passes.

One test per ONNX case module (mostly one per operator), whose cases are made when it
runs: making all 1,884 (ONNX computes each case's expected outputs, about 10 s) at
collection cost every test process that long before any test began."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from engine.onnx_io.backend import CLAIMED, case_modules, module_cases, run_case


def claimed(module: str) -> list[object]:
    """``module``'s cases whose every operator the engine claims."""
    return [c for c in module_cases(module)
            if {n.op_type for n in c.model.graph.node} <= CLAIMED]  # type: ignore[attr-defined]


@pytest.mark.parametrize("module", case_modules())
def test_onnx_node_cases(module: str) -> None:
    cases = claimed(module)
    if not cases:
        pytest.skip("none of its cases uses the claimed operators alone")
    outcomes = [run_case(c) for c in cases]
    failed = [f"{o.name}: {o.reason}" for o in outcomes if o.status == "failed"]
    assert not failed, "\n".join(failed)
    if all(o.status == "skipped" for o in outcomes):  # element types the engine lacks
        why = Counter(o.reason.split(":")[0] for o in outcomes)
        pytest.skip(f"its {len(outcomes)} cases: " +
                    "; ".join(f"{reason} ({n})" for reason, n in why.most_common()))


def test_the_claimed_operators_have_cases() -> None:
    cases = [c for m in case_modules() for c in claimed(m)]
    covered = {n.op_type for c in cases for n in c.model.graph.node}  # type: ignore[attr-defined]
    assert len(cases) > 100
    assert covered == CLAIMED - {"Dropout"} or covered == CLAIMED


def test_a_failing_case_fails_its_module() -> None:
    """A case whose output is off is reported by name, not passed over."""
    case = claimed("relu")[0]
    inputs, expected = case.data_sets[0]  # type: ignore[attr-defined]
    off = replace(case, data_sets=[(inputs, [e + 1 for e in expected])])  # type: ignore[type-var]
    outcome = run_case(off)
    assert outcome.status == "failed" and "max abs error" in outcome.reason
