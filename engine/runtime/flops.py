"""A program's model FLOPs: each instruction's by its op's rule, per path, and the
optimizer's update, at the program's compiled batch.

The op table says what each op counts (:mod:`engine.ops._base`: a multiply-add is 2
FLOPs, the model's arithmetic whatever a kernel does); this module adds up a
:class:`~engine.runtime.program.Program`'s instructions, resolving its generic buffer
shapes (a leading 0 is the batch) at ``prog.batch_size``, and counts the update, which
is not an instruction (the VM runs it in :meth:`~engine.runtime.vm.VM.optimize`), from
the learned parameters' element counts.  ``Program.flops`` computes it once per program.

What one training step of a path costs is :meth:`ProgramFlops.train_step`; what one
row of an evaluation path costs, :meth:`ProgramFlops.per_row` (its forward divided by
the batch).  A path's forward counts its own instructions only: a path that reads
another path's values (the paper MLP's ``eval`` reads ``train``'s logits) does not
count the work that made them.  A program compiled at another batch has its own counts.

>>> from engine import Adam, compile_graph
>>> from engine.models import paper_mlp
>>> f = compile_graph(paper_mlp(), batch_size=64, optimizer=Adam()).flops
>>> f.forward["train"] > 2 * 64 * 784 * 64, f.backward["train"] > f.forward["train"]
(True, True)
>>> f.train_step("train") == f.forward["train"] + f.backward["train"] + f.update
True
>>> ProgramFlops.from_dict(f.to_dict()) == f
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import EngineError
from engine.graph import DType, TensorDesc
from engine.ops import OP_TABLE
from engine.runtime.optim import SGD, Adagrad, Adam, Optimizer, PerModelLR, RMSProp

if TYPE_CHECKING:
    from engine.runtime.program import Instr, Program

_DTYPES = {d.value: d for d in DType}  # DType(name) costs microseconds per call

REGULARIZATION_FLOPS = {"l2": 2, "l1": 3}
"""Per parameter element, folded into the gradient before the update: ``g += c·p``,
``g += c·sign(p)``."""


@dataclass(frozen=True)
class ProgramFlops:
    """A program's FLOPs at its compiled batch (:func:`program_flops`).  Plain data: the
    dict of :meth:`to_dict` is JSON and :meth:`from_dict` reads it back.

    ``forward`` and ``backward``: per path name, its forward and backward programs (a
    forward-only path's backward is 0); ``updates``: per path name, the optimizer step
    after a backward of that path (its learned parameters; 0 without an optimizer or
    a backward); ``update``: one step over every learned parameter."""

    batch_size: int
    paths: tuple[str, ...]
    forward: dict[str, int] = field(hash=False)
    backward: dict[str, int] = field(hash=False)
    updates: dict[str, int] = field(hash=False)
    update: int = 0

    def path_name(self, path: int | str) -> str:
        """The name of ``path`` (an index or a name); an unknown one is a clear error."""
        if isinstance(path, int) and not isinstance(path, bool):
            if not 0 <= path < len(self.paths):
                raise IndexError(f"no path {path}; the program has {len(self.paths)}")
            return self.paths[path]
        if path not in self.forward:
            raise KeyError(f"no path named {path!r}; paths: {list(self.paths)}")
        return str(path)

    def train_step(self, path: int | str = 0) -> int:
        """One training step of ``path`` at the compiled batch: its forward, its backward
        and the optimizer's update of the parameters it learns."""
        name = self.path_name(path)
        return self.forward[name] + self.backward[name] + self.updates[name]

    def per_row(self, path: int | str = 0) -> float:
        """``path``'s forward per row of the batch (an evaluation path's cost per row)."""
        return self.forward[self.path_name(path)] / self.batch_size

    def to_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "paths": list(self.paths),
                "forward": dict(self.forward), "backward": dict(self.backward),
                "updates": dict(self.updates), "update": self.update}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ProgramFlops:
        return ProgramFlops(int(d["batch_size"]), tuple(d["paths"]),
                            {k: int(v) for k, v in d["forward"].items()},
                            {k: int(v) for k, v in d["backward"].items()},
                            {k: int(v) for k, v in d["updates"].items()}, int(d["update"]))


def update_flops_per_element(opt: Optimizer) -> int:
    """FLOPs per parameter element of one update, counted from the optimizer's kernel
    (:mod:`engine.runtime.optim`, the numpy form; the fused one computes the same).

    >>> update_flops_per_element(Adam()), update_flops_per_element(SGD(momentum=0.9))
    (10, 4)
    """
    if isinstance(opt, PerModelLR):  # the rates are an array instead of a scalar
        return update_flops_per_element(opt.base)
    if isinstance(opt, SGD):
        # p -= lr·g (2); momentum: buf = mu·buf + g (2) then p -= lr·buf (2); Nesterov
        # also p -= lr·g (2) before p -= mu·lr·buf; weight decay: g += wd·p (2)
        n = 6 if opt.momentum and opt.nesterov else 4 if opt.momentum else 2
        return n + (2 if opt.weight_decay else 0)
    if isinstance(opt, Adam):
        # m = b1·m + g (2), v = b2·v + g·g (3), sqrt(v) + eps (2), m / that (1), times the
        # step size (1), p -= it (1); weight decay: decoupled (AdamW) p *= 1 - lr·wd (1),
        # else g += wd·p (2)
        return 10 + ((1 if opt.decoupled else 2) if opt.weight_decay else 0)
    if isinstance(opt, RMSProp):
        # sq = alpha·sq + g·g (3), sqrt(sq) + eps (2), g / that (1), times the rate (1),
        # p -= it (1); momentum: buf = mu·buf + that (2)
        return 8 + (2 if opt.momentum else 0)
    if isinstance(opt, Adagrad):
        # acc += g·g (2), sqrt(acc) + eps (2), g / that (1), times lr (1), p -= it (1)
        return 7
    raise EngineError(f"no FLOP count for the optimizer {opt.name}: add it to "
                      f"engine.runtime.flops.update_flops_per_element")


def program_flops(prog: Program) -> ProgramFlops:
    """``prog``'s FLOPs at its compiled batch: each instruction's by its op's FLOP rule
    (:mod:`engine.ops._base`), summed per path, and the optimizer's update."""
    batch = prog.batch_size
    # Buffers share few shapes: one descriptor per shape, as building a frozen dataclass
    # costs about as much as counting an instruction.
    shared: dict[tuple[str, tuple[int, ...]], TensorDesc] = {}
    descs = []
    for b in prog.buffers:
        d = shared.get((b.dtype, b.shape))
        if d is None:
            shape = (batch, *b.shape[1:]) if b.shape and b.shape[0] == 0 else b.shape
            d = shared[(b.dtype, b.shape)] = TensorDesc(_DTYPES[b.dtype], shape)
        descs.append(d)
    per_instr = [_instr_flops(k, ins, descs) for k, ins in enumerate(prog.instrs)]
    learned = {i: _update_flops(prog, i) for i, ps in enumerate(prog.params)
               if ps.grad is not None}
    names = tuple(p.name for p in prog.paths)
    forward = {p.name: sum(per_instr[k] for k in p.forward) for p in prog.paths}
    backward = {p.name: sum(per_instr[k] for k in p.backward) for p in prog.paths}
    updates = {p.name: sum(learned.get(i, 0) for i in p.params) if p.seed is not None else 0
               for p in prog.paths}
    return ProgramFlops(batch, names, forward, backward, updates, sum(learned.values()))


def _instr_flops(k: int, instr: Instr, descs: list[TensorDesc]) -> int:
    op = OP_TABLE.get(instr.op)
    if op is None:
        raise EngineError(f"instruction {k} ({instr.op}): no such op in the op table")
    if op.flops is None:
        raise EngineError(f"instruction {k} ({instr.op}): the op declares no FLOP rule")
    ins, outs = [descs[j] for j in instr.ins], [descs[j] for j in instr.outs]
    try:  # the compiler stores every attribute; a program made otherwise may not
        return int(op.flops(ins, outs, instr.attrs))
    except KeyError:
        pass
    try:
        return int(op.flops(ins, outs, op.with_defaults(instr.attrs)))
    except Exception as e:
        raise EngineError(f"instruction {k} ({instr.op}): its FLOP rule failed: {e}") from e


def _update_flops(prog: Program, i: int) -> int:
    """Parameter ``i``'s update: its regularization and the optimizer, per element."""
    ps = prog.params[i]
    per = update_flops_per_element(prog.optimizer) if prog.optimizer is not None else 0
    if prog.optimizer is not None and ps.regularization is not None:
        per += REGULARIZATION_FLOPS.get(ps.regularization.kind, 0)
    return per * prog.buffers[ps.buffer].desc.numel()
