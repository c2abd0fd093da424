"""An independent check of a compiled program's memory plan, from the bytecode alone:
re-derive every buffer's lifetime from the instruction order and verify that two
buffers in the same bytes are never live at once, except an in-place output taking
over an input that dies at that instruction, and a view (``OpDef.view``: a reshape)
planned in its input's bytes, which holds the same values while both live."""

from __future__ import annotations

from engine.ops import get_op
from engine.runtime.program import Program


def schedule(prog: Program) -> list[int]:
    """Instruction indices in the order a path runs them: forward, then backward."""
    return [k for p in prog.paths for k in (*p.forward, *p.backward)]


def lifetimes(prog: Program) -> dict[int, tuple[int, int]]:
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for t, k in enumerate(schedule(prog)):
        ins = prog.instrs[k]
        for j in ins.ins:
            if j in first:
                last[j] = t
        for j in ins.outs:
            first.setdefault(j, t)
            last[j] = max(last.get(j, t), t)
    return {j: (first[j], last[j]) for j in first}


def view_groups(prog: Program) -> list[int]:
    """Per buffer, the buffer whose bytes it shows: itself, or for the output of a view
    planned at its input's zone and offset, its input's (transitively)."""
    root = list(range(len(prog.buffers)))
    for k in schedule(prog):
        instr = prog.instrs[k]
        if not get_op(instr.op).view:
            continue
        x, y = prog.buffers[instr.ins[0]], prog.buffers[instr.outs[0]]
        if (x.zone, x.offset) == (y.zone, y.offset):
            assert x.desc.nbytes(prog.batch_size) == y.desc.nbytes(prog.batch_size), \
                f"view {y.name} of {x.name} planned in its bytes with another size"
            root[instr.outs[0]] = root[instr.ins[0]]
    return root


def _check_updates(prog: Program, group: list[int], live: dict[int, tuple[int, int]]) -> None:
    """An input an instruction updates (``OpDef.writes``: running statistics) is shown
    by no view that is read after it."""
    members: dict[int, list[int]] = {}
    for j, root in enumerate(group):
        if root != j:
            members.setdefault(root, []).append(j)
    for t, k in enumerate(schedule(prog)):
        instr = prog.instrs[k]
        for w in get_op(instr.op).writes:
            j = instr.ins[w]
            for m in (group[j], *members.get(group[j], ())):
                if m != j and m in live and live[m][0] <= t < live[m][1]:
                    raise AssertionError(f"{instr.op} updates {prog.buffers[j].name} while "
                                         f"{prog.buffers[m].name}, in its bytes, is live")


def assert_no_clobber(prog: Program) -> int:
    """Fail on any pair of buffers that share bytes while both are live; return the
    number of sharing pairs checked."""
    live = lifetimes(prog)
    order = schedule(prog)
    group = view_groups(prog)
    _check_updates(prog, group, live)
    b = prog.batch_size
    spans = sorted((buf.zone, buf.offset, buf.offset + buf.desc.nbytes(b), j)
                   for j, buf in enumerate(prog.buffers) if buf.desc.nbytes(b))
    pairs = 0
    for a, (zone, _lo, hi, i) in enumerate(spans):
        for zone2, lo2, _hi2, j in spans[a + 1:]:
            if zone2 != zone or lo2 >= hi:
                break
            pairs += 1
            if group[i] == group[j]:
                continue  # a view and what it views: the same values
            bi, bj = prog.buffers[i], prog.buffers[j]
            assert bi.shared and bj.shared, f"{bi.name} and {bj.name} overlap in {zone}"
            (si, ei), (sj, ej) = live[i], live[j]
            if ei < sj or ej < si:
                continue
            # In place: the later buffer is output 0 of the instruction where the
            # earlier one is last read, at the same offset.
            early, late, t = (i, j, sj) if si < sj else (j, i, si)
            instr = prog.instrs[order[t]]
            assert t == live[early][1] and instr.outs[0] == late and early in instr.ins \
                and prog.buffers[early].offset == prog.buffers[late].offset, \
                f"{bi.name} {live[i]} and {bj.name} {live[j]} are live at once in {zone}"
    return pairs
