"""Three whole networks written once for both libraries (an MLP, a CNN with batch norm,
a small ResNet like the README's) against PyTorch with the same weights: the eval
forward, the cross-entropy loss and every parameter's gradient, the parameters and
running statistics after three SGD (momentum, weight decay) and three Adam steps;
the round trip engine -> state_dict -> PyTorch -> engine; exact memory and no
allocation in a step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import nn
from tests.engine.nn.harness import (
    OPTIMIZERS,
    assert_step_allocates_nothing,
    close,
    compile_checked,
    torch_state,
)

torch = pytest.importorskip("torch", reason="PyTorch (pip install torch==2.13.0) is the reference")


def mlp(L: Any, F: Any) -> Any:
    return L.Sequential(L.Linear(64, 32), L.ReLU(), L.Dropout(0.0), L.Linear(32, 16), L.Tanh(),
                        L.Linear(16, 10))


def cnn(L: Any, F: Any) -> Any:
    class CNN(L.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = L.Sequential(
                L.Conv2d(1, 6, 3, padding=1), L.BatchNorm2d(6), L.ReLU(), L.MaxPool2d(2),
                L.Conv2d(6, 8, 3, padding="same", bias=False), L.BatchNorm2d(8, momentum=0.2),
                L.ReLU(), L.AvgPool2d(2))
            self.classifier = L.Sequential(L.Flatten(), L.Linear(32, 16), L.BatchNorm1d(16),
                                           L.GELU(), L.Linear(16, 10))

        def forward(self, x: Any) -> Any:
            return self.classifier(self.features(x.reshape(-1, 1, 8, 8)))

    return CNN()


def resnet(L: Any, F: Any) -> Any:
    class Residual(L.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv1 = L.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = L.BatchNorm2d(c)
            self.conv2 = L.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = L.BatchNorm2d(c)

        def forward(self, x: Any) -> Any:
            h = F.relu(self.bn1(self.conv1(x)))
            return F.relu(x + self.bn2(self.conv2(h)))

    class Net(L.Module):
        def __init__(self, width: int, blocks: int) -> None:
            super().__init__()
            self.stem = L.Conv2d(1, width, 3, padding=1)
            self.blocks = L.Sequential(*[Residual(width) for _ in range(blocks)])
            self.head = L.Linear(width, 10)

        def forward(self, x: Any) -> Any:
            x = self.blocks(F.relu(self.stem(x.reshape(-1, 1, 8, 8))))
            return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))

    return Net(8, 2)


NETWORKS = {"mlp": mlp, "cnn": cnn, "resnet": resnet}
R = np.random.default_rng(0)
X = R.normal(size=(16, 64)).astype(np.float32)
Y = R.integers(0, 10, size=16).astype(np.int64)


def pair(name: str) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    tm = NETWORKS[name](torch.nn, torch.nn.functional)
    em = NETWORKS[name](nn, nn.functional)
    em.load_state_dict(torch_state(tm))
    return em, tm


def graph(em: nn.Module) -> Any:
    return nn.to_graph(em, inputs={"x": (0, 64)}, loss="cross_entropy",
                       metrics=["accuracy", "loss"])


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_network_trains_as_pytorch(name: str, opt_name: str) -> None:
    em, tm = pair(name)
    assert [k for k, _ in em.named_parameters()] == [k for k, _ in tm.named_parameters()]
    assert list(em.state_dict()) == [k for k in tm.state_dict()
                                     if not k.endswith("num_batches_tracked")]
    make_engine, make_torch = OPTIMIZERS[opt_name]
    _, vm = compile_checked(graph(em), 16, make_engine())
    tx, ty = torch.from_numpy(X), torch.from_numpy(Y)
    tm.eval()
    with torch.no_grad():
        out = tm(tx)
    vm.set("x", X)
    vm.set("y", Y)
    vm.forward("eval")
    close(vm.get("logits"), out.numpy(), what="eval forward")
    close(vm.get("eval_loss"), torch.nn.functional.cross_entropy(out, ty).item())
    close(vm.get("accuracy"), (out.argmax(1) == ty).float().mean().item())
    opt = make_torch(torch, list(tm.parameters()))
    tm.train()
    for step in range(3):
        vm.set("x", X)
        vm.set("y", Y)
        vm.forward("train")
        vm.apply_loss("train")
        vm.backward("train")
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tm(tx), ty)
        loss.backward()
        close(vm.get("loss"), loss.item(), what=f"loss at step {step}")
        for k, p in tm.named_parameters():
            close(vm.grad(k), p.grad.numpy(), what=f"gradient of {k} at step {step}")
        vm.optimize()
        opt.step()
        for k, v in tm.state_dict().items():  # parameters and running statistics
            if not k.endswith("num_batches_tracked"):
                close(vm.get(k), v.numpy(), what=f"{k} after {opt_name} step {step}")
    tm.eval()
    with torch.no_grad():
        out = tm(tx)
    vm.set("x", X)
    vm.forward("eval")
    close(vm.get("logits"), out.numpy(), what="eval forward after training")


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_round_trip_through_pytorch(name: str) -> None:
    """engine (its own init) -> state_dict -> PyTorch gives the engine's outputs; the
    engine trains, its weights go to PyTorch by vm.get and come back by load_state_dict,
    and all three agree."""
    nn.manual_seed(3)
    em = NETWORKS[name](nn, nn.functional)
    tm = NETWORKS[name](torch.nn, torch.nn.functional)
    missing, unexpected = tm.load_state_dict(
        {k: torch.from_numpy(v) for k, v in em.state_dict().items()}, strict=True)
    assert not missing and not unexpected  # num_batches_tracked is filled in by PyTorch
    from engine import SGD

    _, vm = compile_checked(graph(em), 16, SGD(lr=0.1, momentum=0.9))
    vm.set("x", X)
    vm.forward("eval")
    tm.eval()
    with torch.no_grad():
        close(vm.get("logits"), tm(torch.from_numpy(X)).numpy(), what="engine init in torch")
    for _ in range(3):
        vm.set("x", X)
        vm.set("y", Y)
        vm.train_step("train")
    trained = {k: vm.get(k) for k in em.state_dict()}
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in trained.items()})
    with torch.no_grad():
        want = tm(torch.from_numpy(X)).numpy()
    vm.set("x", X)
    vm.forward("eval")
    close(vm.get("logits"), want, what="trained engine weights in torch")
    back = NETWORKS[name](nn, nn.functional)
    back.load_state_dict(tm.state_dict())  # torch tensors, num_batches_tracked ignored
    _, vm2 = compile_checked(graph(back), 16)
    vm2.set("x", X)
    vm2.forward("eval")
    close(vm2.get("logits"), want, what="torch weights back in the engine")


@pytest.mark.parametrize("batch", [16, 128])  # the bound does not grow with the batch
@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_network_step_allocates_nothing(name: str, batch: int) -> None:
    from engine import Adam

    em = NETWORKS[name](nn, nn.functional)  # lazy: the VM draws the inits
    _, vm = compile_checked(graph(em), batch, Adam(lr=1e-3))
    rows = np.arange(batch) % len(X)
    vm.set("x", X[rows])
    vm.set("y", Y[rows])
    assert_step_allocates_nothing(vm)
