"""The ``explore`` command: run a search space, size a candidate, show or export a
study.

    explore run search_spaces/quick.yaml
    explore size search_spaces/paper_mnist.yaml --params lr=0.01 --memory 64MB --json
    explore show search_spaces/quick.yaml
    explore export search_spaces/quick.yaml --format csv --output trials.csv

Bad input (a malformed space, an unknown parameter, a size that is not one) is
reported with the file, line and key at fault and exit status 2, before any study is
created or changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from explore import __version__
from explore.yamlio import SpaceError

EXIT_USAGE = 2
EXIT_FAILED = 1  # the run began and could not go on (a failed write)
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a process ended by SIGINT
err = Console(stderr=True, soft_wrap=True)  # whole lines: paths stay copyable
out = Console()


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    sys.exit(EXIT_USAGE)


def _space(path: str, resolve_data: bool = True) -> Any:
    """The space of ``path`` (exit status 2 with every error); its data file is read
    and checked only with ``resolve_data`` (commands that read a study need only the
    space's name)."""
    from explore.space import load_space

    try:
        return load_space(path, resolve_data=resolve_data)
    except SpaceError as e:
        for item in e.errors:
            err.print(f"[red]{escape(str(item))}[/]", highlight=False)
        err.print(f"{len(e.errors)} error(s); nothing was run or written.", highlight=False)
        sys.exit(EXIT_USAGE)


def _size(value: str | None, what: str) -> int | None:
    from explore.space import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        _fail(f"{what}: {e}")
    return None


def _ordinals(value: str | None) -> list[int] | None:
    """``--devices 0,1``: the device numbers, each once (the budget checks the rest)."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() and p.isascii() for p in parts):
        _fail(f"--devices: {value!r} is not a list of device numbers such as 0,1")
    return [int(p) for p in parts]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="explore",
                      message="%(prog)s %(version)s")
def main() -> None:
    """Hyperparameter and architecture search that never runs out of memory."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An option given as an empty string is a mistake (an unset variable), not a
    request for the default."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty; leave the option out for the default")
    return value


@main.command()
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--storage", callback=_not_empty,
              help="an Optuna storage URL (default: SQLite next to the file)")
@click.option("--study", "study_name", callback=_not_empty,
              help="the study name (default: the space's name)")
@click.option("--trials", type=click.IntRange(min=1, max=1_000_000),
              help="trials in all (budget.trials)")
@click.option("--workers", type=click.IntRange(min=1, max=256), help="worker processes")
@click.option("--memory", help="memory budget, e.g. 512MB or 4GiB (budget.memory)")
@click.option("--device", type=click.Choice(["cpu", "gpu"]), help="where trials run")
@click.option("--devices", metavar="0,1,...",
              help="several devices of this machine, each with --memory and --workers of "
                   "its own (budget.devices; simulated on the CPU)")
@click.option("--quiet", is_flag=True, help="no live progress display")
@click.option("--space-changed", is_flag=True,
              help="the space differs from the one the study was searched with, and that "
                   "is meant (the change is recorded in the study)")
def run(space_file: str, storage: str | None, study_name: str | None, trials: int | None,
        workers: int | None, memory: str | None, device: str | None, devices: str | None,
        quiet: bool, space_changed: bool) -> None:
    """Search SPACE_FILE: sample, size, pack and train trials; resume if run again."""
    from explore.live import WriteFailed
    from explore.runner import RunRefused, execute, prepare
    from explore.scheduler.errors import Stopped, raise_stopped

    # SIGTERM and SIGHUP (a job scheduler, a closed terminal) stop a run as Ctrl-C does:
    # the scheduler acts on them between steps, and before it runs they raise here.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_stopped)
    prep = None
    try:
        prep = prepare(space_file, storage=storage, study=study_name, trials=trials,
                       workers=workers, memory=_size(memory, "--memory"), device=device,
                       devices=_ordinals(devices), space_changed=space_changed)
        budget = prep.space.budget
        display = _Display(budget.memory * len(budget.ordinals), budget.trials, 0, quiet)
        with display:
            study, run_record = execute(prep, progress=display.update)
    except RunRefused as e:
        _refused(e)
    except KeyboardInterrupt as e:
        by = f" by {e.name}" if isinstance(e, Stopped) and e.signum != signal.SIGINT else ""
        _stopped(prep, f"interrupted{by}: the trials in hand were failed as 'interrupted' "
                 "and queued again; run the same command to go on",
                 e.exit_status if isinstance(e, Stopped) else EXIT_INTERRUPTED)
    except WriteFailed as e:
        _stopped(prep, f"the study's storage failed: {e}; the run stopped at the first "
                 "failed call", EXIT_FAILED)
    if run_record is None:
        done = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
        out.print(f"study {study.study_name!r} already has {done} finished trials "
                  f"(budget {budget.trials}); raise --trials to run more")
        run_record = _last_run(study)
    _summary(study, run_record)
    _next_steps(study, prep)


def _stopped(prep: Any, message: str, code: int) -> None:
    """A run that stopped early: what happened, what the study kept, and the exit
    status (128 + the signal after Ctrl-C, SIGTERM or SIGHUP: 130, 143, 129; 1 after a
    failed write)."""
    err.print(f"[red]{message}[/]", highlight=False)
    if prep is not None:
        with contextlib.suppress(Exception):  # the storage itself may be what failed
            import optuna

            from explore.study import storage_url

            study = optuna.load_study(study_name=prep.study_name,
                                      storage=storage_url(prep.storage))
            from explore.live import counted

            # the trials that count: not those failed as interrupted, which run again
            kept = sum(counted(t) for t in study.get_trials(deepcopy=False))
            err.print(f"kept: {kept} finished trials in study {prep.study_name!r} at "
                      f"{prep.storage}", highlight=False)
    sys.exit(code)


def _refused(e: Any) -> None:
    """Report a refused run (its space's errors one per line) and exit with status 2."""
    for item in e.errors:
        err.print(f"[red]{item}[/]", highlight=False)
    if e.errors:
        err.print(f"{len(e.errors)} error(s); nothing was run or written.", highlight=False)
        sys.exit(EXIT_USAGE)
    _fail(str(e))


def _next_steps(study: Any, prep: Any) -> None:
    """Where the results went and what to do with them."""
    from explore.keeper import MODELS_ATTR
    from explore.study import default_storage

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
    out.print("next:", highlight=False)
    out.print(f"  explore show {target}", highlight=False)
    if kept:
        out.print(f"  explore export-model {target} --output model.onnx", highlight=False)
        out.print(f"  explore evaluate {target}", highlight=False)
    out.print(f"  in Python: explore.results.load({prep.storage!r}, {study.study_name!r}); "
              "notebooks/analysis.ipynb draws the study", highlight=False)


def _record_run(study: Any, stats: Any) -> dict[str, Any]:
    from explore.runner import record_run

    return record_run(study, stats)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _last_run(study: Any) -> dict[str, Any] | None:
    runs = study.user_attrs.get("runs") or []
    return runs[-1] if runs and "measured_peak" in runs[-1] else None


class _Display:
    """The live progress table (trials by state, best value, memory vs budget)."""

    def __init__(self, budget: int, trials: int, done: int, quiet: bool) -> None:
        self.budget, self.trials, self.done0, self.quiet = budget, trials, done, quiet
        self.live: Live | None = None
        self.last = 0.0

    def __enter__(self) -> _Display:
        if not self.quiet:
            self.live = Live(Table(), console=err, refresh_per_second=4, transient=True)
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
        c = stats.counts
        s = stats.timeline[-1] if stats.timeline else None
        used = (s.heaps + s.fixed) if s else 0
        t = Table(show_header=True, header_style="bold")
        for col in ("done", "running", "paused", "waiting", "pruned", "failed", "best",
                    "memory"):
            t.add_column(col)
        done = self.done0 + c["complete"] + c["pruned"] + c["failed"]
        t.add_row(f"{done}/{self.trials}", str(c["running"]), str(c["paused"]),
                  str(c["waiting"]), str(c["pruned"]), str(c["failed"]),
                  "-" if stats.best is None else f"{stats.best:.4g}",
                  f"{used / 1e6:,.1f} / {self.budget / 1e6:,.1f} MB")
        self.live.update(t)


def _summary(study: Any, run: dict[str, Any] | None) -> None:
    """The study's counts and best trial, and the memory of ``run`` (the run just ended,
    or the study's last): the budget, the planned peak, the peak the system measured
    for the run's processes, and the packing efficiency.  Reads the trials directly:
    pandas alone would add 35 MB to the run's process at its end."""
    trials = study.get_trials(deepcopy=False)
    states = Counter(tr.state.name.lower() for tr in trials)
    t = Table(title=f"study {study.study_name!r}", header_style="bold")
    for col in ("trials", "complete", "pruned", "failed", "best value", "best trial"):
        t.add_column(col)
    best_v, best_n = "-", "-"
    if len(study.directions) == 1:
        with contextlib.suppress(ValueError):  # no complete trial yet
            best_v, best_n = f"{study.best_value:.4g}", str(study.best_trial.number)
    else:
        best_v = f"{len(study.best_trials)} on the Pareto front"
    t.add_row(str(len(trials)), str(states["complete"]), str(states["pruned"]),
              str(states["fail"]), best_v, best_n)
    out.print(t)
    if run is None:
        return
    m = Table(title="memory (last run)", header_style="bold")
    for col in ("budget", "planned peak", "measured peak", "packing", "workers", "fixed"):
        m.add_column(col)
    eff = run.get("packing_efficiency")
    fixed = run.get("main", 0) + run.get("tracker", 0) + sum(run.get("overheads", [])) + \
        run.get("data", 0)
    m.add_row(_mb(run["budget"]), _mb(run["peak"]),
              _mb(run["measured_peak"]) if run.get("measured_peak") else "-",
              "-" if eff is None else f"{eff:.0%}", str(run.get("workers", "-")), _mb(fixed))
    out.print(m)
    out.print(f"fixed: scheduler {_mb(run.get('main', 0))}, resource tracker "
              f"{_mb(run.get('tracker', 0))}, workers "
              f"{', '.join(_mb(o) for o in run.get('overheads', []))}, data "
              f"{_mb(run.get('data', 0))}; measured peak = " + (
                  "the device memory the driver lists for the run's processes"
                  if run.get("device") == "gpu" else "the run's processes' PSS"),
              highlight=False)
    for note in run.get("notes", []):
        out.print(f"note: {note}", highlight=False)


@main.command()
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--params", "params", multiple=True, metavar="KEY=VALUE",
              help="fix a parameter (repeatable); ranges take their low end otherwise")
@click.option("--memory", help="also report the largest batch that fits this budget")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def size(space_file: str, params: tuple[str, ...], memory: str | None, as_json: bool) -> None:
    """Print the exact plan of one candidate of SPACE_FILE."""
    from engine import BudgetError, compile_graph
    from engine.errors import EngineError
    from explore.builders import BuildError
    from explore.candidate import compile_candidate, graph_of
    from explore.optimizers import build_optimizer
    from explore.sampling import fixed
    from explore.space import check_value

    space = _space(space_file)
    overrides = {}
    for item in params:
        if "=" not in item:
            _fail(f"--params {item!r}: write KEY=VALUE")
        k, v = item.split("=", 1)
        overrides[k.strip()] = _value(v.strip())
    builder_keys = set(type(space.model).model_fields) if space.uses_builder else set()
    for k, v in overrides.items():
        if k in builder_keys:
            continue  # the builder's own parameter: its builder says what it may be
        try:
            check_value(k, v)
        except ValueError as e:
            _fail(f"--params {k}: {e}")
    budget = _size(memory, "--memory")
    try:
        graph = None
        if space.uses_builder:  # the builder's own parameters: answered from --params
            from explore.model_builders import LowTrial

            # the model's keys are the builder's; the space keeps its training ones
            mine = set(space.params()) - set(type(space.model).model_fields)
            given = {k: v for k, v in overrides.items() if k not in mine}
            overrides = {k: v for k, v in overrides.items() if k in mine}
        try:
            p = fixed(space, overrides)
        except ValueError as e:
            _fail(f"--params {e}")
        if p["batch_size"] == "auto" and budget is None:
            p["batch_size"] = space.training.auto_max_batch
        if space.uses_builder:
            graph = graph_of(space, p, trial=LowTrial(given))
        cand = compile_candidate(space, p, budget or 1 << 62, graph=graph)
        # the engine's search for the largest batch that fits (engine.max_batch)
        biggest = compile_graph(graph or graph_of(space, p), memory=budget,
                                optimizer=build_optimizer(p),
                                device=space.budget.device).batch_size if budget else None
    except KeyError as e:
        _fail(f"--params: {e.args[0]}")
    except (BuildError, BudgetError, EngineError, ValueError) as e:
        _fail(str(e))
    prog = cand.program
    result: dict[str, Any] = {"zones": dict(prog.zone_bytes), "total_bytes": prog.total_bytes,
                              "batch_size": cand.train_batch,
                              "compiled_batch": prog.batch_size}
    if biggest is not None:
        result["max_batch"] = biggest
    if as_json:
        click.echo(json.dumps(result))
        return
    out.print(prog.plan_report(), highlight=False)
    out.print(f"batch {cand.train_batch} (compiled for {prog.batch_size}, the validation "
              f"chunk): {prog.total_bytes:,} bytes"
              + (f"; largest batch in {budget:,} bytes: {biggest:,}" if biggest else ""))


def _value(text: str) -> Any:
    """A --params value: an integer, a number, true/false, a [list] or a name."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text.startswith("["):
        return [_value(x.strip()) for x in text.strip("[]").split(",") if x.strip()]
    return text


def _open(space_file: str | None, storage: str | None, study_name: str | None) -> Any:
    """The study to show or export.  A SQLite file that does not exist is an error (exit
    status 2), not an empty database created by looking."""
    import optuna

    from explore.storages import StorageError
    from explore.study import storage_url

    storage, study_name = _where(space_file, storage, study_name)
    try:
        opened = storage_url(storage)
    except FileNotFoundError as e:
        _fail(f"no study {study_name!r}: {e}; has `explore run` been run?")
    except StorageError as e:
        _fail(str(e))
    try:
        return optuna.load_study(study_name=study_name, storage=opened)
    except KeyError:
        _fail(f"no study {study_name!r} in {storage}")
    except Exception as e:  # a corrupt file, a server gone: said as such
        from explore.storages import explain

        _fail(f"cannot read study {study_name!r} in {storage}: {explain(e)}")


@main.command()
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
def show(space_file: str | None, storage: str | None, study_name: str | None) -> None:
    """Summarise a study: counts, best trial, and the best few trials with their final
    metrics and every parameter that varies (those the same in every trial below)."""
    from explore.results import frame, metric_columns

    study = _open(space_file, storage, study_name)
    _summary(study, _last_run(study))
    df = frame(study)
    done = df[df["state"] == "complete"]
    if len(done) and "value" in done and done["value"].notna().any():
        asc = study.directions[0].name == "MINIMIZE"
        top = done.sort_values("value", ascending=asc).head(5)
        model = (study.user_attrs.get("space") or {}).get("model") or {}
        other = bool(model.get("builder") or model.get("onnx"))  # not a built-in family

        def shown_params(p: Any) -> Any:
            return _shown_params(p, other)

        df["params"] = df["params"].map(shown_params)
        top = top.assign(params=top["params"].map(shown_params))
        varying, same = _split_params(list(df["params"]))
        shown = [c for c in [*metric_columns(df), "train_seconds"] if top[c].notna().any()]
        # the batch trained with, where the space lets the engine choose it
        auto = any(p.get("batch_size") == "auto" for p in top["params"])
        t = Table(title="best trials", header_style="bold", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False)
        for col in ("trial", "value", *shown, *(["batch"] if auto else []), "bytes"):
            t.add_column(col, overflow="fold")  # wrapped, never cut short
        for _, r in top.iterrows():
            t.add_row(str(r["number"]), f"{r['value']:.4g}", *(_num(r[c]) for c in shown),
                      *([str(r["batch_size"])] if auto else []), f"{r['total_bytes']:,}")
        out.print(t)
        # Parameters in full (as the sampler chose them), one line per trial: a column
        # each squeezed the values into slivers on a terminal's width.
        for _, r in top.iterrows():
            out.print(f"trial {r['number']}: " + "  ".join(
                f"{k}={_param(r['params'].get(k, '-'))}" for k in varying), highlight=False)
        if same:
            out.print("the same in every trial: " + ", ".join(
                f"{k}={_param(v)}" for k, v in same.items()), highlight=False)


def _shown_params(p: Any, other: bool = False) -> Any:
    """A trial's parameters as ``show`` lists them: a model builder's own ones in line
    with the others, and the built-in families' model keys left out where a builder or
    an ONNX file made the model (``other``: they were not used)."""
    if not isinstance(p, dict) or not (other or "builder_params" in p or "onnx" in p):
        return p
    from explore.sampling import PER_LAYER
    from explore.space import Model

    unused = (set(Model.model_fields) | set(PER_LAYER.values())) - {"onnx", "freeze", "head"}
    return {**{k: v for k, v in p.items() if k not in unused and k != "builder_params"},
            **p.get("builder_params", {})}


def _split_params(params: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """The parameters whose value differs between trials (in the order the trials list
    them), and the others with their one value.

    >>> _split_params([{"lr": 0.1, "optimizer": "adam"}, {"lr": 0.2, "optimizer": "adam"}])
    (['lr'], {'optimizer': 'adam'})
    """
    params = [p for p in params if isinstance(p, dict)]
    keys = list(dict.fromkeys(k for p in params for k in p))
    varying = [k for k in keys if len({json.dumps(p.get(k), sort_keys=True)
                                       for p in params}) > 1]
    return varying, {k: next(p[k] for p in params if k in p) for k in keys
                     if k not in varying}


def _param(v: Any) -> str:
    """A parameter's value in full: floats as Python writes them back exactly."""
    return v if isinstance(v, str) else json.dumps(v)


def _num(v: Any) -> str:
    return "-" if v is None or v != v else f"{v:.4g}"


@main.command()
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet"]), default="csv")
@click.option("--output", type=click.Path(dir_okay=False), required=True)
def export(space_file: str | None, storage: str | None, study_name: str | None, fmt: str,
           output: str) -> None:
    """Write the study's trials as a table (one row per trial)."""
    from explore.results import frame

    target = _output(output, space_file, storage, study_name)
    study = _open(space_file, storage, study_name)
    df = frame(study)
    df["params"] = df["params"].map(json.dumps)

    def write(tmp: Path) -> None:
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        else:
            try:
                df.to_parquet(tmp, index=False)
            except ImportError as e:  # pyarrow is a dependency: a broken installation
                _fail(f"parquet needs pyarrow, which did not import: {e}")

    _write_output(target, output, write)
    out.print(f"{len(df)} trials -> {target}")


def _output(output: str, space_file: str | None, storage: str | None,
            study_name: str | None) -> Path:
    """``--output`` checked before anything is read or written: its folder exists, and
    it is a new path or a regular file that is neither a link (not followed or replaced
    silently) nor a file the command reads (the space, the study's database).  Exit
    status 2 otherwise."""
    from explore.storages import sqlite_file

    target = Path(output)
    if not output.strip():
        _fail("--output is empty: give the path of the file to write")
    if target.is_symlink():
        _fail(f"--output {output}: a symbolic link (to {os.readlink(target)}); give the "
              "path of the file itself")
    try:
        st = target.stat() if target.exists() else None
    except OSError as e:
        _fail(f"--output {output}: {e.strerror or e}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else \
            "not a regular file (a device, FIFO or socket)"
        _fail(f"--output {output}: {kind}; give the path of a file to write")
    folder = target.parent
    if not folder.is_dir():
        _fail(f"--output {output}: the folder {folder} does not exist")
    if st is not None:
        storage_url, _ = _where(space_file, storage, study_name)
        db = sqlite_file(storage_url)
        reads = [Path(space_file)] if space_file else []
        if db is not None:
            reads += [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
        for r in reads:
            with contextlib.suppress(OSError):
                if os.path.samefile(r, target):
                    _fail(f"--output {output}: the command reads this file ({r}); give "
                          "another path")
    return target


def _write_output(target: Path, output: str, write: Any) -> None:
    """``write(tmp)`` into a new file beside ``target``, then renamed over it: the
    target is replaced whole or not at all, and a file of the temporary's name is
    never touched.  A new file gets the usual permissions; a replaced one keeps its."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                    suffix=".tmp")
    except OSError as e:
        _fail(f"--output {output}: {e.strerror or e}")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        if target.exists():
            mode = stat.S_IMODE(target.stat().st_mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as e:
        _fail(f"--output {output}: {e.strerror or e}")
    finally:
        tmp.unlink(missing_ok=True)


def _where(space_file: str | None, storage: str | None, study_name: str | None
           ) -> tuple[str, str]:
    """The storage and study a command names: by its space file (the study next to it,
    named after it) or by --storage and --study (exit status 2 if neither)."""
    from explore.study import default_storage

    if space_file is None and (storage is None or study_name is None):
        _fail("give SPACE_FILE, or both --storage and --study")
    if space_file is not None:
        space = _space(space_file, resolve_data=False)
        storage = storage or default_storage(space_file)
        study_name = study_name or space.name
    assert storage is not None and study_name is not None
    return storage, study_name


def _model(space_file: str | None, storage: str | None, study_name: str | None,
           trial: int | None) -> Any:
    """The kept model a command names (exit status 2 with the reason if none)."""
    from explore.storages import StorageError
    from explore.trained import ModelError, load_model

    storage, study_name = _where(space_file, storage, study_name)
    try:
        return load_model(storage, study_name, trial)
    except (ModelError, StorageError) as e:
        _fail(str(e))


@main.command("export-model")
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
@click.option("--trial", type=int, help="the trial whose model (default: the best kept)")
@click.option("--output", type=click.Path(dir_okay=False), required=True,
              help="the ONNX file to write")
def export_model(space_file: str | None, storage: str | None, study_name: str | None,
                 trial: int | None, output: str) -> None:
    """Write a kept model as ONNX, its preprocessing inside: it takes raw rows."""
    import onnx

    target = _output(output, space_file, storage, study_name)
    model = _model(space_file, storage, study_name, trial)
    proto = model.to_onnx()
    _write_output(target, output, lambda tmp: onnx.save(proto, str(tmp)))
    ins = ", ".join(f"{i.name}" for i in proto.graph.input)
    outs = ", ".join(o.name for o in proto.graph.output)
    out.print(f"trial {model.trial} of study {model.study!r} -> {target} (inputs: {ins}; "
              f"outputs: {outs})", highlight=False)


@main.command()
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
@click.option("--trial", type=int, help="the trial whose model (default: the best kept)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def evaluate(space_file: str, storage: str | None, study_name: str | None, trial: int | None,
             as_json: bool) -> None:
    """Report a kept model's metrics on the test split of SPACE_FILE's data set."""
    from explore.datasets import DataError
    from explore.trained import data_mismatch, evaluate_split

    space = _space(space_file)  # first: a refused space leaves the storage unopened
    model = _model(space_file, storage, study_name, trial)
    try:
        other = data_mismatch(model, space.data)
        if other is not None:
            _fail(f"{space_file}: its data set is not the one study {model.study!r} was "
                  f"trained on ({other}); evaluate with the study's own space file")
        test = space.data.load().test
    except DataError as e:
        _fail(str(e))
    if len(test) == 0:
        _fail(f"{space_file}: the data set has no test split; add dataset.test "
              "(a fraction such as 0.2, or a file)")
    try:
        got = evaluate_split(model, test.x, test.y)
    except DataError as e:
        _fail(f"{space_file}: {e}")
    if as_json:
        click.echo(json.dumps({"trial": model.trial, "rows": len(test), "metrics": got}))
        return
    t = Table(title=f"trial {model.trial} on the test split ({len(test):,} rows)",
              header_style="bold")
    for name in got:
        t.add_column(name)
    t.add_row(*(f"{v:.4g}" for v in got.values()))
    out.print(t)


@main.command()
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage", callback=_not_empty,
              help="the study's storage URL (default: SQLite next to the file)")
@click.option("--study", "study_name", callback=_not_empty,
              help="the study name (default: the space's name)")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="the address to listen on (0.0.0.0: every interface)")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="the port to listen on (0: any free one)")
def dashboard(space_file: str | None, storage: str | None, study_name: str | None,
              host: str, port: int) -> None:
    """Serve optuna-dashboard on the study, live, until Ctrl-C (the dashboard extra)."""
    from explore.dashboard import DashboardError, serve

    storage, study_name = _where(space_file, storage, study_name)

    def announce(url: str) -> None:
        out.print(f"dashboard of study {study_name!r} in {storage}: {url} (Ctrl-C to stop)",
                  highlight=False, soft_wrap=True)
        sys.stdout.flush()  # at once, into a log or a pipe too: the server runs on

    try:
        serve(storage, study_name, host, port, announce=announce)
    except DashboardError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        err.print("dashboard stopped", highlight=False)
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
