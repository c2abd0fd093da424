"""A compiled program: plain, serialisable data.

It holds the buffers (zone, offset, generic shape), the instructions (op, buffer
indices, attributes), for each path the instruction ranges of its forward and
backward programs, the parameters with their init and regularization, the optimizer
spec, and the exact size of each of the four zones.

>>> from engine import CalcGraph, Init, Mode, compile_graph
>>> g = CalcGraph()
>>> x = g.placeholder("x", (0, 4)); w = g.parameter("w", (4, 2), init=Init.zeros())
>>> p = g.path("f", Mode.FORWARD_ONLY); y = p.MatMul(x, w)
>>> prog = compile_graph(g, batch_size=8)
>>> prog.zone_bytes["forward"], prog.total_bytes
(256, 256)
>>> Program.from_json(prog.to_json()) == prog
True
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from engine.alignment import align_up
from engine.errors import EngineError
from engine.graph import DType, Init, Regularization, TensorDesc
from engine.runtime.flops import ProgramFlops, program_flops
from engine.runtime.optim import Optimizer, optimizer_from_dict


# The two records a program holds one of per buffer and per instruction (tens of
# thousands in a large graph) have slots and are not frozen: a frozen dataclass costs
# four times as much to build, and half again the memory.  Nothing changes them after
# the compiler has built them; treat them, like the whole Program, as read-only.
@dataclass(slots=True)
class BufferSpec:
    name: str
    zone: str
    offset: int
    dtype: str
    shape: tuple[int, ...]  # generic: a leading 0 is the batch
    kind: str  # param, placeholder, generic, grad, seed
    shared: bool = False  # a temporary: its memory holds other buffers at other times

    @property
    def desc(self) -> TensorDesc:
        return TensorDesc(DType(self.dtype), self.shape)


@dataclass(slots=True)
class Instr:
    op: str
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    attrs: dict[str, Any]
    workspace: int  # bytes at the compiled batch, for this instruction
    param_sink: int | None = None  # index in Program.params whose gradient this writes
    # A tunable instruction: the variants an auto-tuner may run (its workspace holds
    # any of them) and its group ("": it chooses alone; see engine.autotune).
    variants: tuple[str, ...] = ()
    group: str = ""


@dataclass(frozen=True)
class PathCode:
    name: str
    mode: str
    forward: tuple[int, ...]  # instruction indices
    backward: tuple[int, ...]
    loss: int | None  # buffer index
    seed: int | None
    params: tuple[int, ...]  # indices in Program.params it computes gradients for


@dataclass(frozen=True)
class ParamSpec:
    buffer: int
    grad: int | None  # gradient buffer, None if no path learns it
    init: Init
    regularization: Regularization | None
    trainable: bool


@dataclass(frozen=True)
class Program:
    name: str
    device: str
    batch_size: int
    zone_bytes: dict[str, int]
    buffers: tuple[BufferSpec, ...]
    instrs: tuple[Instr, ...]
    paths: tuple[PathCode, ...]
    params: tuple[ParamSpec, ...]
    optimizer: Optimizer | None
    param_region: int  # bytes of the contiguous trainable-parameter region
    state_offsets: tuple[int, ...]
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # zone -> plan stats
    counts: dict[str, int] = field(default_factory=dict)  # nodes before/after optimisation

    @property
    def total_bytes(self) -> int:
        """Exactly what the heap allocates for this program."""
        return sum(self.zone_bytes.values())

    @cached_property
    def code_key(self) -> str:
        """What the VM's bindings depend on: everything but the optimizer's
        hyperparameters and the parameters' inits.  Programs with equal keys run on
        one VM (:meth:`VM.retarget`), which is how trials that differ only in learning
        rate or init method share bytecode when they switch."""
        d = self.to_dict()
        if self.optimizer is not None:
            d["optimizer"] = {"name": self.optimizer.name, "slots": self.optimizer.state_slots}
        for p in d["params"]:
            p["init"] = None
        return json.dumps(d, sort_keys=True, default=_jsonable)

    @cached_property
    def flops(self) -> ProgramFlops:
        """Its model FLOPs at the compiled batch, per path and per update
        (:mod:`engine.runtime.flops`), counted once."""
        return program_flops(self)

    @cached_property
    def state_bytes(self) -> int:
        """Bytes of the forward zone's prefix that holds every parameter: with the
        optimizer zone (and unconsumed gradients), what a paused model keeps."""
        ends = [b.offset + align_up(b.desc.nbytes()) for b in self.buffers
                if b.kind == "param"]
        return max(ends, default=0)

    def path_index(self, path: int | str) -> int:
        if isinstance(path, int):
            if not 0 <= path < len(self.paths):
                raise IndexError(f"no path {path}; the program has {len(self.paths)}")
            return path
        for i, p in enumerate(self.paths):
            if p.name == path:
                return i
        raise KeyError(f"no path named {path!r}; paths: {[p.name for p in self.paths]}")

    def plan_report(self) -> str:
        """Per zone: bytes without sharing, planned, the lower bound (the most bytes of
        the packed pieces busy at one instruction; an in-place op's result shares its
        input's piece, so no plan goes below it) and planned / lower bound."""
        rows = [f"{'zone':<10} {'no sharing':>14} {'planned':>14} {'lower bound':>14} "
                f"{'planned/bound':>14}"]
        total = dict.fromkeys(("no_sharing", "planned", "lower_bound"), 0)
        for z, st in [*self.memory.items(), ("total", total)]:
            if z != "total":
                for k in total:
                    total[k] += st[k]
            ratio = st["planned"] / st["lower_bound"] if st["lower_bound"] else 1.0
            rows.append(f"{z:<10} {st['no_sharing']:>14,} {st['planned']:>14,} "
                        f"{st['lower_bound']:>14,} {ratio:>14.3f}")
        return "\n".join(rows)

    @property
    def tunable(self) -> tuple[int, ...]:
        """Indices of the instructions an auto-tuner may choose variants for."""
        return tuple(k for k, i in enumerate(self.instrs) if i.variants)

    # -- serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["optimizer"] = self.optimizer.to_dict() if self.optimizer else None
        for i in d["instrs"]:  # untuned programs keep the format they always had
            if not i["variants"]:
                del i["variants"], i["group"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=_jsonable)

    @staticmethod
    def from_json(text: str) -> Program:
        d = json.loads(text)
        return Program(
            name=d["name"],
            device=d["device"],
            batch_size=d["batch_size"],
            zone_bytes=d["zone_bytes"],
            buffers=tuple(BufferSpec(**{**b, "shape": tuple(b["shape"])}) for b in d["buffers"]),
            instrs=tuple(
                Instr(i["op"], tuple(i["ins"]), tuple(i["outs"]), _attrs(i["attrs"]),
                      i["workspace"], i["param_sink"], tuple(i.get("variants", ())),
                      i.get("group", ""))
                for i in d["instrs"]
            ),
            paths=tuple(
                PathCode(p["name"], p["mode"], tuple(p["forward"]), tuple(p["backward"]),
                         p["loss"], p["seed"], tuple(p["params"]))
                for p in d["paths"]
            ),
            params=tuple(
                ParamSpec(p["buffer"], p["grad"], _init(p["init"]),
                          Regularization(**p["regularization"]) if p["regularization"] else None,
                          p["trainable"])
                for p in d["params"]
            ),
            optimizer=optimizer_from_dict(d["optimizer"]) if d["optimizer"] else None,
            param_region=d["param_region"],
            state_offsets=tuple(d["state_offsets"]),
            memory=d.get("memory", {}),
            counts=d.get("counts", {}),
        )


def _jsonable(o: Any) -> Any:
    if isinstance(o, tuple | set):
        return list(o)
    if isinstance(o, np.ndarray):  # an imported weight (Init.from_array)
        return o.tolist()
    raise TypeError(f"cannot serialise {type(o).__name__}")


def _attrs(d: dict[str, Any]) -> dict[str, Any]:
    # JSON turns tuples into lists; attributes are tuples in the IR.
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def _init(d: dict[str, Any]) -> Init:
    if d.get("array") is not None:  # written from Init.from_array: read back as one
        return Init.from_array(np.asarray(d["array"], dtype=np.float64))
    if d.get("values") is not None:
        d = {**d, "values": tuple(d["values"])}
    if d.get("members") is not None:
        d = {**d, "members": tuple(_init(m) for m in d["members"])}
    if "transposed" in d:  # written before stacks kept shared data's weights [in, K, out]
        d = dict(d)
        if d.pop("transposed"):
            raise EngineError("this program's stack stores a weight as [K, out, in], a "
                              "layout this version no longer reads: compile the stack again")
    return Init(**d)
