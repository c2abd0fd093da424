"""``explore run``: search a space, with a live progress table, and say where the
results went.  Ctrl-C, SIGTERM and SIGHUP stop it with the study kept."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from typing import Any, NoReturn

import click
import optuna
from rich.live import Live
from rich.table import Table

from explore.attrs import MODELS_ATTR, REFIT_ATTR
from explore.cli import console
from explore.cli.common import byte_size, lasting_storage, not_empty
from explore.cli.console import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, fail
from explore.cli.summary import last_run, print_summary, small_mb
from explore.scheduler.errors import STOP_SIGNALS, Stopped, raise_stopped


def _ordinals(value: str | None) -> list[int] | None:
    """``--devices 0,1``: the device numbers, each once (the budget checks the rest)."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() and p.isascii() for p in parts):
        fail(f"--devices: {value!r} is not a list of device numbers such as 0,1")
    return [int(p) for p in parts]


@click.command()
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--storage", callback=lasting_storage,
              help="an Optuna storage URL (default: SQLite next to the file)")
@click.option("--study", "study_name", callback=not_empty,
              help="the study name (default: the space's name)")
@click.option("--trials", type=click.IntRange(min=1, max=1_000_000),
              help="trials in all (budget.trials)")
@click.option("--workers", type=click.IntRange(min=1, max=256), help="worker processes")
@click.option("--memory", help="memory budget, e.g. 512MB or 4GiB (budget.memory)")
@click.option("--device", type=click.Choice(["cpu", "gpu"]), help="where trials run")
@click.option("--devices", metavar="0,1,...",
              help="several devices of this machine, each with --memory and --workers of "
                   "its own (budget.devices; simulated on the CPU)")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True, max=365 * 86_400),
              metavar="SECONDS",
              help="start no trial after this many seconds from the run's start; the "
                   "trials in hand finish, and running again goes on (budget.timeout)")
@click.option("--kernels", type=click.Choice(["auto", "numpy", "compiled"]),
              help="the workers' kernels: numpy's, or numba's compiled ones (faster, about "
                   "100 MB more a worker); auto compiles from 500 MB a worker "
                   "(budget.kernels)")
@click.option("--quiet", is_flag=True, help="no live progress display")
@click.option("--space-changed", is_flag=True,
              help="the space differs from the one the study was searched with, and that "
                   "is meant (the change is recorded in the study)")
def run(space_file: str, storage: str | None, study_name: str | None, trials: int | None,
        workers: int | None, memory: str | None, device: str | None, devices: str | None,
        timeout: float | None, kernels: str | None, quiet: bool,
        space_changed: bool) -> None:
    """Search SPACE_FILE: sample, size, pack and train trials; resume if run again.

    \b
    Exit status:
      0    the run ended: the study has its trials, or the timeout passed
      1    every trial the run ran failed (the summary says why), or the
           study's storage failed (what was written before is kept)
      2    bad input: nothing was run or written
      130  Ctrl-C (143: SIGTERM, 129: SIGHUP); the trials in hand run again
           next time
    """
    # the runner loads pandas, the engine and the rest, which --help does not need
    from explore.live import WriteFailed  # noqa: PLC0415 (--help start-up)
    from explore.runner import RunRefused, execute, prepare  # noqa: PLC0415 (--help start-up)

    # SIGTERM and SIGHUP (a job scheduler, a closed terminal) stop a run as Ctrl-C does:
    # the scheduler acts on them between steps, and before it runs they raise here.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_stopped)
    prep = None
    try:
        prep = prepare(space_file, storage=storage, study=study_name, trials=trials,
                       workers=workers, memory=byte_size(memory, "--memory"), device=device,
                       devices=_ordinals(devices), timeout=timeout, kernels=kernels,
                       space_changed=space_changed)
        report = getattr(prep.bound.data, "missing_report", None)
        if report is not None and (report.dropped or report.imputed):
            console.out.print(f"data: {report}", highlight=False)
        budget = prep.space.budget
        display = _Display(budget.memory * len(budget.ordinals), budget.trials, 0, quiet)
        with display:
            study, run_record = execute(prep, progress=display.update)
    except RunRefused as e:
        _refused(e)
    except KeyboardInterrupt as e:
        _end_at_once_on_another()
        by = f" by {e.name}" if isinstance(e, Stopped) and e.signum != signal.SIGINT else ""
        _stopped(prep, f"interrupted{by}: the trials in hand were failed as 'interrupted' "
                 "and queued again; run the same command to go on",
                 e.exit_status if isinstance(e, Stopped) else EXIT_INTERRUPTED)
    except WriteFailed as e:
        _stopped(prep, f"the study's storage failed: {e}; the run stopped at the first "
                 "failed call", EXIT_FAILED)
    if run_record is None:
        done = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
        console.out.print(f"study {study.study_name!r} already has {done} finished trials "
                          f"(budget {budget.trials}); raise --trials to run more")
        print_summary(study, last_run(study))
        _next_steps(study, prep)
        return
    print_summary(study, run_record)
    _next_steps(study, prep)
    _fail_if_every_trial_failed(study, run_record)


def _fail_if_every_trial_failed(study: Any, run_record: dict[str, Any]) -> None:
    """Exit with status 1 when every trial the run ran failed: a run that trained
    nothing, from a broken builder or a budget no candidate fits, is not a success."""
    from explore.failures import run_failed  # noqa: PLC0415 (--help start-up; loaded by now)

    groups = run_failed(study, run_record)
    if groups:
        n = sum(len(g.numbers) for g in groups if not g.retried)
        console.err.print(f"[red]every trial of this run failed ({n} trial{'s' * (n != 1)}; "
                          "why is listed above)[/]", highlight=False)
        sys.exit(EXIT_FAILED)


def _end_at_once_on_another() -> None:
    """Once a run is stopped, another Ctrl-C, SIGTERM or SIGHUP ends the process at once
    with 128 + its number, as a second one does while the run cleans up (the scheduler
    has put the previous handlers back by now; through those it raised in the middle
    of the report, and click's own handling turned it into "Aborted!" and exit 1)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda n, _frame: os._exit(128 + n))


def _stopped(prep: Any, message: str, code: int) -> NoReturn:
    """A run that stopped early: what happened, what the study kept, and the exit
    status (128 + the signal after Ctrl-C, SIGTERM or SIGHUP: 130, 143, 129; 1 after a
    failed write)."""
    console.err.print(f"[red]{message}[/]", highlight=False)
    if prep is not None:
        with contextlib.suppress(Exception):  # the storage itself may be what failed
            from explore.live import counted  # noqa: PLC0415 (--help start-up; loaded by now)
            from explore.study import storage_url  # noqa: PLC0415 (--help start-up; loaded by now)

            study = optuna.load_study(study_name=prep.study_name,
                                      storage=storage_url(prep.storage))
            trials = study.get_trials(deepcopy=False)
            # the trials that count: not those failed as interrupted, which run again
            kept = sum(counted(t) for t in trials)
            said = f"kept: {kept} finished trial{'s' * (kept != 1)} in study " \
                f"{prep.study_name!r} at {prep.storage}"
            again = interrupted_here(trials)
            if again:
                said += f"; {again} in hand {'were' if again != 1 else 'was'} failed as " \
                    "interrupted and run again next time"
            console.err.print(said, highlight=False)
    sys.exit(code)


def interrupted_here(trials: list[Any]) -> int:
    """How many of ``trials`` this process's run failed as interrupted (queued again,
    not counted): those whose record names this process as their driver."""
    from explore.live.names import driver_host_pid, final_record  # noqa: PLC0415 (loaded by now)
    from explore.scheduler.core import INTERRUPTED  # noqa: PLC0415 (loaded by now)

    here = (socket.gethostname(), os.getpid())
    return sum(1 for t in trials
               if (r := final_record(t)).get("fail_reason") == INTERRUPTED
               and r.get("retried") and driver_host_pid(r.get("driver")) == here)


def _refused(e: Any) -> NoReturn:
    """Report a refused run (its space's errors one per line) and exit with status 2."""
    for item in e.errors:
        console.err.print(f"[red]{item}[/]", highlight=False)
    if e.errors:
        console.err.print(f"{len(e.errors)} error(s); nothing was run or written.",
                          highlight=False)
        sys.exit(EXIT_USAGE)
    fail(str(e))


def _next_steps(study: Any, prep: Any) -> None:
    """Where the results went and what to do with them."""
    from explore.study import default_storage  # noqa: PLC0415 (--help start-up; loaded by now)

    out = console.out
    where = f"--storage '{prep.storage}' --study '{study.study_name}'"
    default = prep.source is not None and prep.storage == default_storage(prep.source) \
        and study.study_name == (prep.space.name or "explore")
    target = str(prep.source) if default else \
        f"{prep.source} {where}" if prep.source is not None else where
    out.print(f"results: study {study.study_name!r} in {prep.storage}", highlight=False)
    kept = study.user_attrs.get(MODELS_ATTR) or []
    if kept:
        out.print(f"models kept: trials {', '.join(str(m['trial']) for m in kept)} "
                  f"(best first) in {study.user_attrs.get('artifacts')}", highlight=False)
    refit = study.user_attrs.get(REFIT_ATTR)
    if refit:
        tested = ", ".join(f"{k} {v:.4g}" for k, v in (refit.get("metrics") or {}).items()
                           if isinstance(v, (int, float)))
        rows = sum((refit.get("rows") or {}).values())
        out.print(f"refit model: trial {refit.get('trial')} trained again on {rows:,} rows "
                  "(training and validation)" + (f"; test {tested}" if tested else ""),
                  highlight=False)
    out.print("next:", highlight=False)
    out.print(f"  explore show {target}", highlight=False)
    if kept:
        flag = " --refit" if refit else ""
        out.print(f"  explore evaluate {target}{flag}", highlight=False)
        if not refit:
            out.print(f"  explore refit {target}", highlight=False)
        out.print(f"  explore export-model {target}{flag} --output model.onnx",
                  highlight=False)
    out.print(f"  in Python: explore.results.load({prep.storage!r}, {study.study_name!r}); "
              "notebooks/analysis.ipynb draws the study", highlight=False)


class _Display:
    """The live progress table (trials by state, best value, memory vs budget, and
    what was switched out of the arenas)."""

    def __init__(self, budget: int, trials: int, done: int, quiet: bool) -> None:
        self.budget, self.trials, self.done0, self.quiet = budget, trials, done, quiet
        self.live: Live | None = None
        self.last = 0.0

    def __enter__(self) -> _Display:
        if not self.quiet:
            self.live = Live(Table(), console=console.err, refresh_per_second=4,
                             transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, stats: Any) -> None:
        now = time.monotonic()
        if self.live is None or now - self.last < 0.2:
            return
        self.last = now
        self.live.update(self.table(stats))

    def table(self, stats: Any) -> Table:
        """The progress table of ``stats``: with a ``switched`` column once paused
        trials have been switched out of their arenas (times out and back in, how many
        are out now, the bytes written out)."""
        c = stats.counts
        s = stats.timeline[-1] if stats.timeline else None
        used = (s.heaps + s.fixed) if s else 0
        switched = c.get("switched_out", 0)
        t = Table(show_header=True, header_style="bold")
        for col in ("done", "running", "paused", "waiting", "pruned", "failed", "best",
                    "memory", *(["switched"] if switched else [])):
            t.add_column(col)
        done = self.done0 + c["complete"] + c["pruned"] + c["failed"]
        said = f"{switched} out, {c.get('switched_in', 0)} in"
        if c.get("out"):
            said += f" ({c['out']} out now)"
        if stats.switch_bytes:
            said += f", {small_mb(stats.switch_bytes)}"
        t.add_row(f"{done}/{self.trials}", str(c["running"]), str(c["paused"]),
                  str(c["waiting"]), str(c["pruned"]), str(c["failed"]),
                  "-" if stats.best is None else f"{stats.best:.4g}",
                  f"{used / 1e6:,.1f} / {self.budget / 1e6:,.1f} MB",
                  *([said] if switched else []))
        return t
