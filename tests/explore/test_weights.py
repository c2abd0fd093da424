"""Saved weights (explore.weights): a model's own parameters in its own shapes, whether
it ran alone or as one member of a stack whose shared-data layer interleaves the
models (``[in, K, out]``), and a file that appears whole or not at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import SGD, VM, compile_graph
from engine.compile.stack import member_params, stack_graphs, stack_optimizers
from engine.graph import Init
from engine.models import paper_mlp
from explore.weights import load_weights, save_weights


def test_a_stack_member_is_saved_as_the_model_alone(tmp_path: Path) -> None:
    inits = [Init.xavier_uniform(), Init.he_uniform(), Init.normal(0.0, 0.1)]
    graphs = [paper_mlp((12, 6, 3), init=i) for i in inits]
    prog = compile_graph(stack_graphs(graphs), batch_size=4,
                         optimizer=stack_optimizers([SGD(lr=0.1)] * 3))
    vm = VM(prog, seed=2)
    assert vm.get("w0").shape == (12, 3, 6)  # interleaved: the member is not contiguous
    for k in range(3):
        names = save_weights(vm, tmp_path / f"m{k}.npz", member=k)
        got = load_weights(tmp_path / f"m{k}.npz")
        want = member_params(vm, k)
        assert set(names) == set(got) == set(want)
        for name, value in want.items():
            assert got[name].shape == value.shape
            np.testing.assert_array_equal(got[name], value)
    alone = VM(compile_graph(graphs[0], batch_size=4, optimizer=SGD(lr=0.1)))
    for name, value in load_weights(tmp_path / "m0.npz").items():
        alone.assign(name, value)  # the file loads into the model trained alone
    np.testing.assert_array_equal(alone.get("w0"), member_params(vm, 0)["w0"])


def test_a_failed_save_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vm = VM(compile_graph(paper_mlp((4, 3, 2)), batch_size=2, optimizer=SGD(lr=0.1)))

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np.lib.format, "write_array_header_2_0", broken)
    with pytest.raises(OSError, match="disk full"):
        save_weights(vm, tmp_path / "w.npz")
    assert list(tmp_path.iterdir()) == []


def test_a_scalar_constant_keeps_its_shape(tmp_path: Path) -> None:
    """A model's 0-d constants (an attention's 1/sqrt(d), a GELU's coefficients) are
    saved 0-d, so the file loads back into the model it came from."""
    from engine import nn

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x: object) -> object:
            return self.lin(x * 0.5)

    prog = compile_graph(nn.to_graph(Scaled(), inputs={"x": (0, 3)}), batch_size=4,
                         optimizer=SGD(lr=0.1))
    vm = VM(prog, seed=0)
    scalars = [b.name for b in prog.buffers if b.kind == "param" and b.shape == ()]
    assert scalars
    save_weights(vm, tmp_path / "w.npz")
    got = load_weights(tmp_path / "w.npz")
    again = VM(prog, seed=1)
    for name, value in got.items():
        assert value.shape == vm.get(name).shape, name
        again.assign(name, value)
