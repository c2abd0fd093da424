"""The study side of many drivers at scale: what each trial costs in storage calls and
bytes when 10 to 100 drivers share one study (:mod:`explore.live.simulation`, the
deterministic simulation, at a fixed scale and without mishaps but deaths).

METHOD.  ``--drivers`` (10, 30 and 100 by default), each holding up to ``--in-flight``
(10) trials at once (100 drivers: 1,000 workers' worth of trials in flight), on a study
of ``--trials`` (1,000, the same at every scale, so that the growth with the drivers
shows; ``--trials 0``: ``--trials-per-driver`` times the drivers, e.g. 3,000 for 100),
a random sampler over a continuous space (duplicates aside), ``grace`` 60 s, every
driver on a host of its own (a dead one is found by its silence, not by its pid), the
clock moving 0.05 to 3 s at a time.
``--deaths`` (3) drivers die at evenly spaced steps; no stalls and no failed storage
calls.  Every driver is a real :class:`explore.live.LiveStudy` on a virtual clock with
its writes inline, all on Optuna's in-memory storage, each through a counting wrapper
(:class:`explore.live.simulation.DriverStorage`).  The invariants are checked every
100 steps and at the end (the study has its total, nothing running or queued).

Measured per scale, per counted trial: storage calls by kind (all drivers together);
bytes read and written, as the pickled size of what each call returns or is given
(``read``: every ``get_all_trials`` returns the whole study, as the in-memory and
journal storages do; ``read_cached``: what Optuna's cached storage in front of a
database reads again, the trials unfinished at a driver's last read and the newer
ones); claims that lost a race (given back to the queue or given up); and, per death,
the virtual seconds from the death to the first of the dead driver's trials failed as
stale.  Also the real seconds the simulation took (one core), which grow with the
drivers times the trials: each driver's refresh reads and walks the whole study, and
mirrors every other driver's trial into its own working copy.

Run: ``python bench/study_scale.py --json`` (about 2 minutes of one core: 40, 48 and 85 s
real on a shared 2-core machine); one scale:
``--drivers 100 --trials 3000`` (about 4 minutes: the cost grows with the square of the
study's trials).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from typing import Any

from explore.live.simulation import EPOCH, Simulation, quiet


def one_scale(drivers: int, in_flight: int, total: int, deaths: int,
              seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    with quiet():
        sim = Simulation(seed, drivers=drivers, total=total, capacity=in_flight,
                         sampler="random", wide=True, grace=60.0, mishaps=0.0,
                         one_host=False, moves=(0.05, 0.5, 1.0, 3.0), measure=True,
                         check_every=100, max_steps=200 * total)
    made = time.perf_counter() - t0
    expected = 8 * total  # about the steps of a run (7 to 9 per trial)
    sim.deaths_at = {expected * (k + 1) // (deaths + 2) for k in range(deaths)}
    with quiet():
        result = sim.run()
    wall = time.perf_counter() - t0
    calls: Counter[str] = Counter()
    for c in result.calls.values():
        calls.update(c)
    n = result.counted
    detect = sorted(result.detect)
    return {
        "drivers": drivers, "in_flight_per_driver": in_flight, "total": total,
        "trials_created": sum(result.states.values()), "states": result.states,
        "steps": result.steps, "virtual_seconds": round(sim.now - EPOCH, 1),
        "calls_per_trial": round(sum(calls.values()) / n, 2),
        "calls_per_trial_by_kind": {k: round(v / n, 2) for k, v in calls.most_common()},
        "bytes_read_per_trial": round(result.bytes["read"] / n),
        "bytes_read_cached_per_trial": round(result.bytes["read_cached"] / n),
        "bytes_written_per_trial": round(result.bytes["written"] / n),
        "claim_conflicts": result.conflicts,
        "claim_conflicts_per_trial": round(sum(result.conflicts.values()) / n, 4),
        "deaths": result.died, "next_run_needed": result.next_run,
        "detect_seconds": [round(x, 1) for x in detect],
        "detect_seconds_median": round(statistics.median(detect), 1) if detect else None,
        "real_seconds": round(wall, 1), "real_seconds_setup": round(made, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--drivers", default="10,30,100",
                    help="drivers per scale, comma-separated (default 10,30,100)")
    ap.add_argument("--in-flight", type=int, default=10, help="trials a driver holds at once")
    ap.add_argument("--trials-per-driver", type=int, default=30,
                    help="the study's total divided by the drivers")
    ap.add_argument("--trials", type=int, default=1000,
                    help="the study's total, the same at every scale (default 1,000; 0: "
                    "--trials-per-driver times the drivers)")
    ap.add_argument("--deaths", type=int, default=3, help="drivers that die in each scale")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    scales = []
    for d in (int(x) for x in args.drivers.split(",")):
        total = args.trials or args.trials_per_driver * d
        scales.append(one_scale(d, args.in_flight, total, args.deaths, args.seed))
        if not args.json:
            s = scales[-1]
            print(f"{d:4d} drivers, {s['total']:5d} trials: {s['calls_per_trial']:7.1f} "
                  f"calls/trial, {s['bytes_read_per_trial']:>10,} B read/trial "
                  f"({s['bytes_read_cached_per_trial']:,} cached), "
                  f"detect {s['detect_seconds']} s, {s['real_seconds']} s real", flush=True)
    out = {"bench": "study_scale", "seed": args.seed, "scales": scales,
           "growth": "bytes read per trial grow with drivers x trials: every refresh of "
                     "every driver reads the whole study (get_all_trials)"}
    if args.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
