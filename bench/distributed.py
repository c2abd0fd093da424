"""The cost of cooperation: 1, 2 and 4 ``explore run`` drivers on one PostgreSQL study.

METHOD.  The quick space (``search_spaces/quick.yaml``: MLPs on 5,000 MNIST images, 3
rounds, TPE, the median pruner, 512MB and the 3 best models kept per driver) with
``--trials`` (96) as the study's total, on a PostgreSQL server of the bench's own (a
throwaway cluster, ``tests/pg_server.py``: no fsync, on 127.0.0.1) unless ``--storage``
names one.  One run starts n drivers (``explore run quick.yaml --storage URL --study
NAME --trials T --workers W --quiet``, each a fresh process, in a working folder of the
run's own) at the same instant on a new database (a new study name on a given storage),
its tables created beforehand (the schema race of drivers on an empty database is a
one-off, not a cost per trial), and waits for all to exit.

Two series of ``drivers x workers per driver``:

- ``total``: 4 workers in all (1x4, 2x2, 4x1): the same compute, split among more
  drivers, so what changes is the cooperation alone (4 workers on 2 cores is twice
  over-subscribed, the same in each);
- ``each``: one worker per driver (1x1, 2x1, 4x1): how an operator scales out by adding
  drivers; on 2 cores the second driver adds a core, the fourth adds nothing.

Every driver's workers get ``cores / workers in all`` BLAS threads (at least 1): a
driver divides the cores among its own workers only, and would not know of the others.

Measured per run: the wall time from the start of the drivers to the exit of the last
(start-up included); trials per minute (the trials that ended, counted, / wall minutes);
each driver's start-up (to its first trial's start); the busy rate (trials per minute
from the first trial's start to the last one's end); what the drivers spent in storage
calls (``explore.live.StorageTime``, which each driver stores in the study when it
closes), per trial: on the scheduler's thread (claims, the writes of an ask, refresh
reads, stale checks: the scheduler waits for these) and the writer's (reports, ends,
heartbeats: off the scheduler's path) apart, and the model keeper's uploads; storage
calls per trial; the share of the scheduler threads' time in storage calls; the CPU of
the drivers and their workers, and of the database server (own server only), as a
share of the machine's cores over the wall time.  Checked per run: every driver exited
0, the study has exactly its total of counted trials and none left RUNNING (an empty
WAITING one left by a race at the end is allowed, and counted).

Reported (``--json``: one JSON object): per layout, medians of ``--repeats`` (5)
repeats, with every repeat's trials per minute; the order of the layouts alternates
from one repeat to the next (forward, then backward), the two series interleaved.
``--quick``: a smoke run (1 repeat, 16 trials).

RESULTS (2 cores, shared, others' load under 2%; ``python bench/distributed.py --json``,
96 trials, medians of 5; trials/min, scheduler-thread storage ms per trial (of it CPU),
writer ms per trial, storage calls per trial):

    one worker per driver   1x1: 594/min, 26 ms (17), 16 ms, 18.4 calls
                            2x1: 838/min, 32 ms (20), 16 ms, 18.9 calls
                            4x1: 558/min, 92 ms (31), 29 ms, 20.3 calls
    4 workers in all        1x4: 661/min, 51 ms (23), 16 ms, 18.5 calls
                            2x2: 639/min, 105 ms (29), 26 ms, 19.5 calls
                            4x1: 544/min, 94 ms (32), 26 ms, 20.2 calls

What limits it: the two cores.  The machine was 99% busy with two drivers or more (the
PostgreSQL server 5% of it), so a second driver with its own worker adds the second
core's work (838 against 594 trials/min) and a fourth adds only contention.  The
storage's time per trial grows with drivers mostly as waiting for a core: the drivers'
own CPU in storage calls rises from 17 to 32 ms per trial while the wall time in them
rises from 26 to 92 ms.  A driver's start-up (1.5 s alone, 3.4 s when four start at
once) is a tenth to a third of a 10-second study.  Cooperation itself costs about two
more storage calls per trial (the re-read of claims) and stays bounded: reads are
incremental, and the writer's share is off the workers' path.

    python bench/distributed.py --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SPACE = os.path.join(ROOT, "search_spaces", "quick.yaml")
SERIES = {"total": [(1, 4), (2, 2), (4, 1)], "each": [(1, 1), (2, 1), (4, 1)]}
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
TIMEOUT = 900.0  # seconds one run may take


def layout_name(drivers: int, workers: int) -> str:
    return f"{drivers}x{workers}"


# -- the database server's CPU (own server only) ---------------------------------------
def _ticks(pid: int, children: bool) -> int:
    """utime + stime of ``pid`` (and of its children it reaped, with ``children``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    n = int(fields[11]) + int(fields[12])  # utime, stime
    return n + (int(fields[13]) + int(fields[14]) if children else 0)


def server_cpu(pg: Any) -> float | None:
    """CPU seconds the server has used so far: the postmaster, the backends it reaped,
    and those alive now."""
    if pg is None:
        return None
    try:
        main = int((pg.data / "postmaster.pid").read_text().split()[0])
        total = _ticks(main, children=True)
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    if ppid == main:
                        total += _ticks(int(d), children=False)
    except (OSError, ValueError, IndexError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy (``/proc/stat``: all but idle and
    iowait), whoever used them: the machine is shared."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


# -- one run ---------------------------------------------------------------------------
def new_storage(pg: Any, given: str | None, tag: str) -> tuple[str, str]:
    """(storage URL, study name) for a run: a new database on the bench's server, or a
    new study name on the given storage; the tables created before the drivers start."""
    import optuna

    from explore.storages import connect, release

    url = pg.new_database(f"bench_{tag}") if given is None else given
    opened = connect(url)  # Optuna creates its tables on opening
    release(opened)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return url, f"quick_{tag}"


def run_once(pg: Any, given: str | None, drivers: int, workers: int, trials: int,
             tag: str) -> dict[str, Any]:
    """n drivers at once on a new study; their figures and the study's checks."""
    url, study_name = new_storage(pg, given, tag)
    cores = os.cpu_count() or 1
    threads = str(max(1, cores // (drivers * workers)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **dict.fromkeys(THREAD_VARS, threads),
           "EXPLORE_TRACEBACK": "1",  # a driver's failure logged with its traceback
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH"))
                                         if p)}
    cmd = [sys.executable, "-m", "explore.cli", "run", SPACE, "--storage", url, "--study",
           study_name, "--trials", str(trials), "--workers", str(workers), "--quiet"]
    with tempfile.TemporaryDirectory(prefix="explore-bench-") as tmp:
        # A folder per driver, as on machines of their own: the models a driver keeps go
        # to ./explore-artifacts, and drivers sharing one lose trials when the first to
        # end removes its staging folder (explore/keeper.py, ModelKeeper.close).
        cwds = [Path(tmp, f"driver{i}") for i in range(drivers)]
        for cwd in cwds:
            cwd.mkdir()
        cpu0, db0, all0 = children_cpu(), server_cpu(pg), machine_cpu()
        start = datetime.now()
        t0 = time.perf_counter()
        procs = [subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for cwd in cwds]
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, TIMEOUT - (time.perf_counter() - t0)))
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            outs.append((p.returncode, out))
        wall = time.perf_counter() - t0
        cpu, db1, busy = children_cpu() - cpu0, server_cpu(pg), machine_cpu() - all0
    failed = [(code, out[-2000:]) for code, out in outs if code != 0]
    if failed:
        raise RuntimeError(f"{layout_name(drivers, workers)}: a driver failed: {failed}")
    return {"wall_s": wall, "cpu_s": cpu, "machine_cpu_s": busy,
            "db_cpu_s": None if db0 is None or db1 is None else db1 - db0,
            **study_figures(url, study_name, trials, start, drivers)}


def study_figures(url: str, study_name: str, total: int, start: datetime, drivers: int
                  ) -> dict[str, Any]:
    """What the study holds after a run: its checks, the drivers' start-ups and the
    busy window, and the drivers' storage figures."""
    import optuna
    from optuna.trial import TrialState

    from explore.live import counted, storage_times
    from explore.storages import connect, release

    opened = connect(url, write=False)
    try:
        study = optuna.load_study(study_name=study_name, storage=opened)
        ts = study.get_trials(deepcopy=False)
        times = storage_times(study)
    finally:
        release(opened)
    done = [t for t in ts if counted(t)]
    states = [t.state for t in ts]
    first: dict[str, datetime] = {}
    for t in ts:
        driver = t.user_attrs.get("explore", {}).get("driver")
        if driver and t.datetime_start is not None:
            first[driver] = min(first.get(driver, t.datetime_start), t.datetime_start)
    starts = [t.datetime_start for t in done if t.datetime_start is not None]
    ends = [t.datetime_complete for t in done if t.datetime_complete is not None]
    busy = (max(ends) - min(starts)).total_seconds() if starts and ends else None

    def total_of(key: str) -> float:
        return float(sum(v.get(key, 0) for v in times.values()))

    return {
        "counted": len(done), "running": states.count(TrialState.RUNNING),
        "failed": states.count(TrialState.FAIL), "pruned": states.count(TrialState.PRUNED),
        "waiting": states.count(TrialState.WAITING),
        "ok": len(done) == total and TrialState.RUNNING not in states,
        "drivers_with_trials": len(first), "drivers_with_figures": len(times),
        "startup_s": sorted((s - start).total_seconds() for s in first.values()),
        "busy_s": busy,
        "scheduler_storage_s": total_of("scheduler_seconds"),
        "writer_storage_s": total_of("writer_seconds"),
        "keep_s": total_of("keep_seconds"),
        "storage_calls": int(total_of("scheduler_calls") + total_of("writer_calls")),
        "scheduler_calls": int(total_of("scheduler_calls")),
    }


def derive(r: dict[str, Any], drivers: int) -> dict[str, Any]:
    """Per-trial and per-minute figures of one run."""
    n, wall, cores = r["counted"], r["wall_s"], os.cpu_count() or 1
    out = {
        "trials_per_min": n / wall * 60,
        "busy_trials_per_min": n / r["busy_s"] * 60 if r["busy_s"] else None,
        "scheduler_storage_ms_per_trial": r["scheduler_storage_s"] / n * 1e3,
        "writer_storage_ms_per_trial": r["writer_storage_s"] / n * 1e3,
        "keep_ms_per_trial": r["keep_s"] / n * 1e3,
        "storage_calls_per_trial": r["storage_calls"] / n,
        "scheduler_calls_per_trial": r["scheduler_calls"] / n,
        # of the drivers' scheduler threads' time (each the whole wall at most)
        "scheduler_storage_share": r["scheduler_storage_s"] / (drivers * wall),
        "cpu_share": r["cpu_s"] / (wall * cores),
        "db_cpu_share": r["db_cpu_s"] / (wall * cores) if r["db_cpu_s"] is not None else None,
        # everything the machine ran, and what others ran (the machine is shared)
        "machine_cpu_share": r["machine_cpu_s"] / (wall * cores),
        "others_cpu_share": max(0.0, r["machine_cpu_s"] - r["cpu_s"] - (r["db_cpu_s"] or 0))
        / (wall * cores),
        "startup_s_max": max(r["startup_s"]) if r["startup_s"] else None,
        "startup_s_min": min(r["startup_s"]) if r["startup_s"] else None,
    }
    return {**r, **out}


# -- the bench -------------------------------------------------------------------------
def median(runs: list[dict[str, Any]], key: str, digits: int = 2) -> Any:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(values), digits) if values else None


def summary(runs: list[dict[str, Any]], drivers: int, workers: int) -> dict[str, Any]:
    keys = {"trials_per_min": 1, "busy_trials_per_min": 1, "wall_s": 2,
            "scheduler_storage_ms_per_trial": 2, "writer_storage_ms_per_trial": 2,
            "keep_ms_per_trial": 2, "storage_calls_per_trial": 1,
            "scheduler_calls_per_trial": 1, "scheduler_storage_share": 4, "cpu_share": 3,
            "db_cpu_share": 3, "machine_cpu_share": 3, "others_cpu_share": 3,
            "startup_s_min": 2,
            "startup_s_max": 2}
    return {"drivers": drivers, "workers_per_driver": workers,
            **{k: median(runs, k, d) for k, d in keys.items()},
            "trials_per_min_all": [round(r["trials_per_min"], 1) for r in runs],
            "all_ok": all(r["ok"] for r in runs),
            "waiting_left": [r["waiting"] for r in runs],
            "failed": [r["failed"] for r in runs], "pruned": [r["pruned"] for r in runs],
            "drivers_with_trials": [r["drivers_with_trials"] for r in runs],
            "drivers_with_figures": [r["drivers_with_figures"] for r in runs]}


def bench(given: str | None, trials: int, repeats: int, series: list[str]
          ) -> dict[str, Any]:
    from tests.pg_server import PgServer

    layouts = [(name, d, w) for name in series for d, w in SERIES[name]]
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {k: [] for k in layouts}
    pg = PgServer().start() if given is None else None
    try:
        for i in range(repeats):
            by_series = [[k for k in layouts if k[0] == name] for name in series]
            if i % 2:  # alternate the order: forward, then backward
                by_series = [list(reversed(ks)) for ks in by_series]
            order = [k for group in zip(*by_series, strict=True) for k in group]
            for name, d, w in order:
                tag = f"{i}_{name}_{d}x{w}_{uuid.uuid4().hex[:6]}"
                runs[(name, d, w)].append(derive(run_once(pg, given, d, w, trials, tag), d))
    finally:
        if pg is not None:
            pg.stop()
    out: dict[str, Any] = {name: {} for name in series}
    for (name, d, w), rs in runs.items():
        out[name][layout_name(d, w)] = summary(rs, d, w)
    return {**out, "trials": trials, "repeats": repeats, "cores": os.cpu_count(),
            "storage": "own PostgreSQL server (tests/pg_server.py)" if given is None
            else "given", "space": os.path.relpath(SPACE, ROOT),
            "all_ok": all(r["ok"] for rs in runs.values() for r in rs)}


def table(result: dict[str, Any]) -> str:
    cols = [("trials/min", "trials_per_min"), ("busy/min", "busy_trials_per_min"),
            ("wall s", "wall_s"), ("start-up s", "startup_s_max"),
            ("sched ms/trial", "scheduler_storage_ms_per_trial"),
            ("writer ms/trial", "writer_storage_ms_per_trial"),
            ("keep ms/trial", "keep_ms_per_trial"), ("calls/trial", "storage_calls_per_trial"),
            ("cpu", "cpu_share"), ("db cpu", "db_cpu_share"),
            ("others' cpu", "others_cpu_share"), ("ok", "all_ok")]
    lines = [f"{result['trials']} trials of {result['space']} on {result['storage']}, "
             f"{result['cores']} cores, medians of {result['repeats']}",
             "  ".join(["series  layout"] + [f"{c:>{max(len(c), 6)}}" for c, _ in cols])]
    for name in SERIES:
        for layout, s in result.get(name, {}).items():
            cells = [f"{s[k]!s:>{max(len(c), 6)}}" for c, k in cols]
            lines.append("  ".join([f"{name:<6}  {layout:<6}", *cells]))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--trials", type=int, default=96, help="the study's total")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--series", default="total,each",
                    help="which series of layouts: total (4 workers in all), each (one "
                         "worker per driver), or both (the default)")
    ap.add_argument("--storage", default=None,
                    help="a PostgreSQL URL to use (a new study per run) instead of a "
                         "throwaway server of the bench's own")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1 repeat, 16 trials")
    args = ap.parse_args()
    series = [s for s in args.series.split(",") if s]
    unknown = [s for s in series if s not in SERIES]
    if unknown:
        ap.error(f"--series {','.join(unknown)}: no such series; available: "
                 f"{', '.join(SERIES)}")
    trials, repeats = (16, 1) if args.quick else (args.trials, args.repeats)
    result = bench(args.storage, trials, repeats, series)
    print(json.dumps(result) if args.json else table(result))
    if not result["all_ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
