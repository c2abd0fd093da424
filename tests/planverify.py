"""An independent check of a compiled program's memory plan, from the bytecode alone:
re-derive every buffer's lifetime from the instruction order and verify that two
buffers in the same bytes are never live at once (except an in-place output taking
over an input that dies at that instruction)."""

from __future__ import annotations

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


def assert_no_clobber(prog: Program) -> int:
    """Fail on any pair of buffers that share bytes while both are live; return the
    number of sharing pairs checked."""
    live = lifetimes(prog)
    order = schedule(prog)
    b = prog.batch_size
    spans = sorted((buf.zone, buf.offset, buf.offset + buf.desc.nbytes(b), j)
                   for j, buf in enumerate(prog.buffers) if buf.desc.nbytes(b))
    pairs = 0
    for a, (zone, _lo, hi, i) in enumerate(spans):
        for zone2, lo2, _hi2, j in spans[a + 1:]:
            if zone2 != zone or lo2 >= hi:
                break
            pairs += 1
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
