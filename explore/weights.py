"""A trained model's parameters on disk: a ``.npz`` file (one array per parameter, by
its graph name) that ``numpy.load`` reads.

A worker writes the weights of a finished trial straight from its heap: each
parameter's bytes go to the file from the live view, so saving allocates no copy of
the model (on the CPU; a GPU's arrays come to the host one at a time).  The archive
is stored, not compressed: weights barely compress, and zlib would need buffers.

>>> import tempfile, numpy as np
>>> from engine import VM, Adam, compile_graph
>>> from engine.models import paper_mlp
>>> vm = VM(compile_graph(paper_mlp((4, 3, 2)), batch_size=8, optimizer=Adam()))
>>> with tempfile.TemporaryDirectory() as d:
...     names = save_weights(vm, f"{d}/w.npz")
...     w = load_weights(f"{d}/w.npz")
>>> sorted(w) == sorted(names), np.array_equal(w[names[0]], vm.get(names[0]))
(True, True)
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np


def parameter_names(program: Any) -> list[str]:
    """The names of a program's parameters (trainable or not: batch norm's running
    statistics are part of the model), in buffer order."""
    return [b.name for b in program.buffers if b.kind == "param"]


def save_weights(vm: Any, path: str | Path, member: int | None = None) -> list[str]:
    """Write every parameter of ``vm`` to ``path`` (a ``.npz``); returns their names.
    ``member``: of a stack (:mod:`engine.compile.stack`), model ``member``'s own
    parameters, in the shapes the model has alone (a file like any other).  The file
    appears whole or not at all (written beside it, then renamed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.part")
    names = parameter_names(vm.program)
    stacked = {vm.program.buffers[ps.buffer].name: ps.init for ps in vm.program.params
               if ps.init.method == "stacked"}
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
            for name in names:
                view = vm.view(name)
                if member is not None and name in stacked:
                    view = stacked[name].member(view, member)  # strided past the first axis
                arr = view if isinstance(view, np.ndarray) else vm.backend.to_host(view)
                # a heap view is contiguous (no copy) but for one member of a parameter
                # that interleaves its models: that member alone is copied
                # (np.require keeps a 0-d constant 0-d, which ascontiguousarray does not)
                arr = np.require(arr, requirements="C")
                with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array_header_2_0(
                        f, np.lib.format.header_data_from_array_1_0(arr))
                    f.write(arr.reshape(-1, order="A").data.cast("B"))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return names


def load_weights(path: str | Path) -> dict[str, np.ndarray]:
    """The parameters saved by :func:`save_weights`, by name."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
