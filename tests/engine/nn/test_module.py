"""The module system: registration by attribute, names, train/eval, lazy parameters and
their PyTorch-default inits, state dicts, and how to_graph carries parameters (values as
``Init.from_array``, lazy ones as their init for the VM's seed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import VM, Init, Kind, Mode, compile_graph, nn
from engine.nn import NNError


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: Any) -> Any:
        return nn.functional.relu(self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(), nn.Dropout(0.5))
        self.heads = nn.ModuleList([nn.Linear(4, 3), nn.Linear(4, 3)])
        self.scale = nn.Parameter(np.ones(3, np.float32))

    def forward(self, x: Any) -> Any:
        h = nn.functional.global_avg_pool(self.blocks(x.reshape(-1, 2, 3, 3))).flatten(1)
        return (self.heads[0](h) + self.heads[1](h)) * self.scale


STATE = ["scale", "blocks.0.conv.weight", "blocks.0.bn.weight", "blocks.0.bn.bias",
         "blocks.0.bn.running_mean", "blocks.0.bn.running_var", "heads.0.weight", "heads.0.bias",
         "heads.1.weight", "heads.1.bias"]


def test_names_follow_pytorch() -> None:
    net = Net()
    assert list(net.state_dict()) == STATE
    assert [k for k, _ in net.named_parameters()] == [k for k in STATE if "running" not in k]
    assert [k for k, _ in net.named_buffers()] == ["blocks.0.bn.running_mean",
                                                   "blocks.0.bn.running_var"]
    assert [k for k, _ in net.named_modules()] == [
        "", "blocks", "blocks.0", "blocks.0.conv", "blocks.0.bn", "blocks.1", "heads", "heads.0",
        "heads.1"]
    assert [type(m).__name__ for m in net.children()] == ["Sequential", "ModuleList"]
    assert len(list(net.parameters())) == 8
    assert all(not b.requires_grad for b in net.buffers())


def test_train_and_eval_reach_every_module() -> None:
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net and not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())


def test_state_dict_is_lazy_and_seeded() -> None:
    nn.manual_seed(5)
    a = Net()
    assert not any(p.has_value for _, p in a._state_items() if p.init.method != "values")
    sa = a.state_dict()
    nn.manual_seed(5)
    sb = Net().state_dict()
    assert all(np.array_equal(sa[k], sb[k]) for k in STATE)
    assert all(v.dtype == np.float32 for v in sa.values())
    assert np.array_equal(a.state_dict()["heads.0.weight"], sa["heads.0.weight"])  # kept
    sa["heads.0.weight"][:] = 7  # a copy
    assert not np.array_equal(a.state_dict()["heads.0.weight"], sa["heads.0.weight"])


def test_pytorch_default_inits() -> None:
    nn.manual_seed(0)
    lin, conv = nn.Linear(400, 300), nn.Conv2d(8, 12, (3, 5), groups=2)
    emb, ln, bn = nn.Embedding(500, 64), nn.LayerNorm(7), nn.BatchNorm1d(5)
    for w, fan_in in ((lin.weight, 400), (lin.bias, 400), (conv.weight, 4 * 15),
                      (conv.bias, 4 * 15)):
        bound = 1 / np.sqrt(fan_in)
        v = w.value
        assert np.abs(v).max() <= bound and np.abs(v).max() > 0.95 * bound
        if v.size > 500:
            assert abs(v.std() - bound / np.sqrt(3)) < 0.05 * bound  # uniform's std
    assert conv.weight.shape == (12, 4, 3, 5) and lin.weight.shape == (300, 400)
    e = emb.weight.value
    assert abs(e.mean()) < 0.02 and abs(e.std() - 1) < 0.02
    assert ln.weight.value.tolist() == [1.0] * 7 and ln.bias.value.tolist() == [0.0] * 7
    sd = bn.state_dict()
    assert [sd[k].tolist() for k in ("weight", "bias", "running_mean", "running_var")] == \
        [[1.0] * 5, [0.0] * 5, [0.0] * 5, [1.0] * 5]


def test_load_state_dict_checks_keys_and_shapes() -> None:
    net = Net()
    sd = Net().state_dict()
    sd["blocks.0.bn.num_batches_tracked"] = np.array(3)  # PyTorch's counter: ignored
    assert net.load_state_dict(sd) == ([], [])
    assert all(np.array_equal(v, sd[k]) for k, v in net.state_dict().items())
    with pytest.raises(NNError, match=r"missing keys \['scale'\], unexpected keys \['extra'\]"):
        net.load_state_dict({**{k: v for k, v in sd.items() if k != "scale"}, "extra": 1})
    keys = net.load_state_dict({"scale": np.zeros(3)}, strict=False)
    assert "heads.0.weight" in keys.missing_keys and net.scale.value.tolist() == [0, 0, 0]
    with pytest.raises(NNError, match=r"heads.0.weight: \(3, 5\) for \(3, 4\)"):
        net.load_state_dict({**sd, "heads.0.weight": np.zeros((3, 5))})


def test_assignment_sets_values_or_replaces_parameters() -> None:
    net = Net()
    net.heads[0].bias = np.array([1, 2, 3])  # an array: the parameter's values
    assert net.heads[0].bias.value.tolist() == [1.0, 2.0, 3.0]
    net.heads[1].weight = nn.Parameter(np.full((3, 4), 0.5))
    assert net.state_dict()["heads.1.weight"].tolist() == [[0.5] * 4] * 3
    with pytest.raises(NNError, match="cannot take values of shape"):
        net.heads[0].bias = np.zeros(4)
    with pytest.raises(NNError, match=r"must call super\(\)\.__init__\(\)"):
        class Bad(nn.Module):
            def __init__(self) -> None:
                self.fc = nn.Linear(2, 2)

        Bad()


def test_to_graph_carries_values_and_inits() -> None:
    """A parameter with values enters the graph as them; a lazy one as its init, which
    the VM draws from its own seed; buffers are frozen parameters; names are the
    state-dict names, so vm.get/assign move weights by PyTorch's names."""
    net = Net()
    w = net.heads[0].weight.value  # drawn now
    g = nn.to_graph(net, inputs={"x": (0, 18)}, metrics=["accuracy"])
    assert [p.name for p in g.paths] == ["train", "eval"]
    assert [p.mode for p in g.paths] == [Mode.BACKWARD_ENABLED, Mode.FORWARD_ONLY]
    params = {k: v for k, v in g.variables.items() if v.kind == Kind.PARAMETER and "." in k}
    assert sorted(params) == sorted(k for k in STATE if "." in k)
    assert g.variables["heads.0.weight"].init == Init.from_array(w)
    assert g.variables["heads.1.weight"].init == net.heads[1].weight.init  # lazy: the init
    assert not g.variables["blocks.0.bn.running_var"].trainable
    assert g.outputs == ["loss", "logits", "accuracy"]
    assert g.variables["y"].desc.dtype.value == "int64"
    vm = VM(compile_graph(g, batch_size=4), seed=1)
    assert np.array_equal(vm.get("heads.0.weight"), w)
    drawn = vm.get("heads.1.weight")
    assert np.abs(drawn).max() <= 0.5 and drawn.std() > 0  # U(-1/2, 1/2), from the VM
    vm.assign("heads.1.weight", np.zeros((3, 4), np.float32))
    assert not vm.get("heads.1.weight").any()
    assert net.training  # restored after tracing


def test_dropout_and_batch_norm_differ_between_paths() -> None:
    g = nn.to_graph(Net(), inputs={"x": (0, 18)})
    train, ev = ([n for n in p.nodes if n.op in ("Dropout", "BatchNormalization")]
                 for p in g.paths)
    assert [n.op for n in train] == ["BatchNormalization", "Dropout"]
    assert train[0].attrs["training_mode"] == 1 and train[0].attrs["running_update"] == 1
    assert train[0].attrs["momentum"] == pytest.approx(0.9) and train[0].attrs["unbiased"] == 1
    assert [n.op for n in ev] == ["BatchNormalization"] and ev[0].attrs["training_mode"] == 0
    assert ev[0].attrs["running_update"] == 0


def test_shared_parameters_are_one_variable() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)
            self.b.weight = self.a.weight

        def forward(self, x: Any) -> Any:
            return self.b(self.a(x))

    m = Tied()
    assert [k for k, _ in m.named_parameters()] == ["a.weight", "a.bias", "b.bias"]
    g = nn.to_graph(m, inputs={"x": (0, 3)}, loss="mse", target_shape=(0, 3))
    assert "b.weight" not in g.variables
    gemms = [n for n in g.paths[1].nodes if n.op == "Gemm"]
    assert [n.inputs[1] for n in gemms] == ["a.weight", "a.weight"]


def test_loss_none_gives_an_eval_path_alone() -> None:
    g = nn.to_graph(nn.Sequential(nn.Linear(3, 2), nn.Softmax(dim=1)), inputs={"x": (0, 3)},
                    loss=None, name="infer")
    assert g.name == "infer" and [p.name for p in g.paths] == ["eval"]
    assert g.outputs == ["logits"]


def test_binary_metrics_on_one_logit() -> None:
    """With bce a [b, 1] logit meets a float target; accuracy, class counts and the
    positive score read the two-class scores (0, z)."""
    g = nn.to_graph(nn.Linear(3, 1), inputs={"x": (0, 3)}, loss="bce",
                    metrics=["accuracy", "class_counts", "positive_score", "loss"])
    vm = VM(compile_graph(g, batch_size=4))
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    y = np.array([1, 0, 1, 0], np.float32)
    vm.set("x", x)
    vm.set("y", y)
    vm.forward("eval")
    z = x @ vm.get("weight").T[:, 0] + vm.get("bias")[0]
    np.testing.assert_allclose(vm.get("positive_score"), 1 / (1 + np.exp(-z)), rtol=1e-5)
    assert vm.get("accuracy") == pytest.approx(((z > 0) == (y > 0)).mean())
    bce = np.mean(np.logaddexp(0, z) - z * y)
    assert float(vm.get("eval_loss")) == pytest.approx(bce, rel=1e-5)
