"""One round of a resident: train, validate when due, fail what diverged, keep the
weights of what ended, and report (each member's, for a stack)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

from engine.runtime.train import refresh_statistics, train_epoch
from explore.scheduler.protocol import Done, Report, TrialFailed
from explore.scheduler.worker.residents import ArenaHost, Resident
from explore.scheduler.worker.validation import diverged
from explore.weights import save_weights


def run_round(h: ArenaHost, res: Resident, stopped: Callable[[], bool]) -> None:
    """One round of ``res``, then its report (each member's, for a stack).  ``stopped``
    is asked every few mini-batches: True ends the round early (its trial was pruned)."""
    arrays, spent, conn = h.arrays, h.spent, h.conn
    xv, yv = arrays["x_valid"], arrays["y_valid"]
    try:
        t0 = time.perf_counter()
        loss = train_epoch(res.vm, arrays["x_train"], arrays["y_train"], res.rng,
                           batch=res.batch, stop=stopped, loss=res.losses)
        t1 = time.perf_counter()
        if loss is None:
            spent["lost"] += t1 - t0
            return
        spent["train"] += t1 - t0
        res.round += 1
        live = [m for m in res.members if m in res.live]
        losses = {m: loss if res.index(m) is None else loss[res.index(m)] for m in live}
        bad = {m: diverged(losses[m], "training", res.round) for m in live}
        measured: dict[int, dict[str, float]] = {m: {} for m in live}
        validated = res.round % res.validate_every == 0 or res.round >= res.rounds
        if validated and not all(bad.values()):
            if res.refresh:  # batch norms' statistics of the weights now
                refresh_statistics(res.vm, arrays["x_train"], arrays["y_train"], res.refresh,
                                   batch=res.batch, turn=res.round)
            if res.stacked:
                every = res.validation.measure_members(res.vm, xv, yv, len(res.members))
                measured = {m: every[res.members.index(m)] for m in live}
            else:
                measured = {live[0]: res.validation.measure(res.vm, xv, yv)}
        t2 = time.perf_counter()
        spent["valid"] += t2 - t1
        res.valid_s += t2 - t1
        for m in live:  # a NaN or infinite loss never recovers: the trial fails now
            why = bad[m] or diverged(measured[m].get("loss", 0.0), "validation",
                                     res.round)
            if why:
                conn.send(TrialFailed(m, why))
                res.word(m, None)
        res.busy_s += time.perf_counter() - t0
        live = [m for m in live if m in res.live]
        saved, unsaved = set(), {}
        if res.round >= res.rounds:
            for m in live:
                if res.save_to.get(m):
                    try:
                        save_weights(res.vm, res.save_to[m], member=res.index(m))  # type: ignore[arg-type]
                    except OSError as e:  # the model store full or read-only: the
                        unsaved[m] = f"its model could not be kept: {e}"  # result stands
                    else:
                        saved.add(m)
    except Exception:
        for m in [m for m in res.members if m in res.live]:
            conn.send(TrialFailed(m, traceback.format_exc(limit=3)))
        h.drop(res.number)
        return
    for m in live:
        measured[m]["train_loss"] = float(losses[m])
        measured[m]["train_seconds"] = res.busy_s
        measured[m]["valid_seconds"] = res.valid_s
    if res.round >= res.rounds or not live:
        h.drop(res.number)  # first: the memory is given back before the scheduler counts it so
        now = h.overhead_now()  # once for the stack: reading PSS walks every mapping
        for m in live:
            conn.send(Done(m, measured[m], res.round, res.switches, res.busy_s,
                           res.started, time.time(), now, m in saved,
                           unsaved.get(m, ""), dict(spent)))
        return
    # Ungated, the next round starts at once, before the pruner's answer: that answer
    # stops it within STOP_EVERY mini-batches if it is "prune".
    res.runnable = not res.gated
    if res.gated:
        res.waiting = set(live)
    now = h.overhead_now()
    for m in live:
        conn.send(Report(m, res.round, measured[m], res.started, now, dict(spent),
                         validated))
