"""``explore show`` and ``explore export``: a study's summary and best trials on the
terminal, or all its trials as a table in a file."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from explore.attrs import SPACE_ATTR
from explore.cli import console
from explore.cli.common import read_study
from explore.cli.console import fail
from explore.cli.output import checked_output, write_output
from explore.cli.summary import fitted, last_run, print_summary, small_mb


@click.command()
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
def show(space_file: str | None, storage: str | None, study_name: str | None) -> None:
    """Summarise a study: counts, best trial, and the best few trials with their final
    metrics and every parameter that varies (those the same in every trial below), the
    failed trials with their reasons in full, and the trials switched out of their
    worker's arena while paused.  A trial's parameters are those it used: not the
    keys of other model families, nor those its optimizer has no use for."""
    from explore.results import frame, metric_columns  # noqa: PLC0415 (--help start-up: pandas)

    out = console.out
    study = read_study(space_file, storage, study_name)
    print_summary(study, last_run(study))
    df = frame(study)
    done = df[df["state"] == "complete"]
    if len(done) and "value" in done and done["value"].notna().any():
        asc = study.directions[0].name == "MINIMIZE"
        top = done.sort_values("value", ascending=asc).head(5)
        model = (study.user_attrs.get(SPACE_ATTR) or {}).get("model") or {}
        other = bool(model.get("builder") or model.get("onnx"))  # not a built-in family

        def shown_params(p: Any) -> Any:
            return _shown_params(p, other, model.get("family"))

        df["params"] = df["params"].map(shown_params)
        top = top.assign(params=top["params"].map(shown_params))
        varying, same = _split_params(list(df["params"]))
        metrics = [c for c in metric_columns(df) if top[c].notna().any()]
        timed = ["train_seconds"] if top["train_seconds"].notna().any() else []
        # the batch trained with, where the space lets the engine choose it
        auto = any(p.get("batch_size") == "auto" for p in top["params"])
        # a trial's model FLOPs per second on its worker (explore.utilisation)
        rates = {"GFLOP/s": [_num(None if v is None else v / 1e9, "{:.3g}")
                             for v in top["flop_rate"]]} \
            if top["flop_rate"].notna().any() else {}
        columns = {"trial": [str(n) for n in top["number"]],
                   "value": [f"{v:.4g}" for v in top["value"]],
                   **{c: [_num(v) for v in top[c]] for c in [*metrics, *timed]},
                   **rates,
                   **({"batch": [str(b) for b in top["batch_size"]]} if auto else {}),
                   "bytes": [_num(b, "{:,.0f}") for b in top["total_bytes"]]}
        # the first to go where the terminal is too narrow for every column
        t, dropped = fitted(columns, [*rates, *timed, *reversed(metrics),
                                      *(["batch"] if auto else []), "bytes"],
                            title="best trials", header_style="bold", box=box.SIMPLE_HEAD,
                            show_edge=False, pad_edge=False)
        out.print(t)
        if dropped:
            out.print(f"(left out for the terminal's width: {', '.join(dropped)}; explore "
                      "export has every column)", highlight=False)
        # Parameters in full (as the sampler chose them), one line per trial: a column
        # each squeezed the values into slivers on a terminal's width.  Each key=value
        # holds no space, so a line breaks between them, never inside a value.
        for _, r in top.iterrows():
            out.print(f"trial {r['number']}: " + "  ".join(
                f"{k}={_param(r['params'][k])}" for k in varying if k in r["params"]),
                highlight=False, markup=False)
        if same:
            out.print("the same in every trial: " + ", ".join(
                f"{k}={_param(v)}" for k, v in same.items()), highlight=False, markup=False)
    _print_failed(df)
    _print_switched(df)


FAILED_SHOWN = 10  # reasons listed by show's table of failed trials (export: all)


def _print_failed(df: Any) -> None:
    """The failed trials with their reasons in full (a model builder's traceback, say),
    the trials that failed for the very same reason on one row, the first
    ``FAILED_SHOWN`` reasons."""
    from explore.failures import NO_REASON, listed  # noqa: PLC0415 (--help start-up; loaded by now)

    failed = df[df["state"] == "fail"].sort_values("number")
    if failed.empty:
        return
    by: dict[str, list[int]] = {}
    for number, why in zip(failed["number"], failed["fail_reason"], strict=True):
        by.setdefault(why if isinstance(why, str) and why.strip() else NO_REASON,
                      []).append(int(number))
    t = Table(title="failed trials", header_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False)
    t.add_column("trials", max_width=24)  # broken between numbers, not inside one
    t.add_column("reason", overflow="fold")
    for why, numbers in list(by.items())[:FAILED_SHOWN]:
        t.add_row(Text(listed(numbers, most=6)), Text(why.strip()))
    console.out.print(t)
    left = len(by) - FAILED_SHOWN
    if left > 0:
        console.out.print(f"... and {left} more reasons (explore export lists every trial's "
                          "fail_reason)", highlight=False)


SWITCHED_SHOWN = 10  # trials listed by show's table of switched ones (export: all)


def _print_switched(df: Any) -> None:
    """The trials that were switched out of their worker's arena to a file while
    paused: how often, the bytes of state written out, and when they were out (seconds
    since their run began), the first ``SWITCHED_SHOWN`` by number."""
    switched = df[df["switched_out"] > 0].sort_values("number")
    if switched.empty:
        return
    t = Table(title="switched out of the arena", header_style="bold",
              box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for col in ("trial", "state", "times", "written", "out (s from its run's start)"):
        t.add_column(col, overflow="fold")
    for _, r in switched.head(SWITCHED_SHOWN).iterrows():
        t.add_row(str(r["number"]), r["state"], str(r["switched_out"]),
                  small_mb(int(r["switch_bytes"])), _spans(r["out_spans"]))
    console.out.print(t)
    left = len(switched) - SWITCHED_SHOWN
    if left > 0:
        console.out.print(f"... and {left} more switched out (explore export lists every "
                          "trial: switched_out, switch_bytes, out_spans)", highlight=False)


def _spans(spans: Any) -> str:
    """When a trial was out of its arena, in seconds since its run began.

    >>> _spans([[3.14159, 5.0], [7.25, 9.0]])
    '3.1-5.0, 7.2-9.0'
    """
    return ", ".join(f"{a:.1f}-{b:.1f}" for a, b in spans or []) or "-"


# The model keys only some of the built-in families read (explore/families), with those
# families: a trial of another built-in family does not show them.  A family of a
# plugin's shows every key.
FAMILY_KEYS = {"blocks": {"cnn", "resnet"}, "channels": {"cnn", "resnet"},
               "stride": {"cnn", "resnet"}, "kernel": {"cnn"}, "pool": {"cnn"},
               "batch_norm": {"cnn"}, "residual": {"cnn"}, "stage_blocks": {"resnet"}}
BUILT_IN = {"mlp", "cnn", "resnet"}


def _shown_params(p: Any, other: bool = False, family: str | None = None) -> Any:
    """A trial's parameters as ``show`` lists them, those it used: a model builder's own
    ones in line with the others, and the built-in families' model keys left out where a
    builder or an ONNX file made the model (``other``: they were not used); a built-in
    ``family``'s trial without the keys of the others (:data:`FAMILY_KEYS`); and the
    training keys its optimizer has no use for left out (:func:`_unused_by`).

    >>> _shown_params({"depth": 1, "kernel": 3, "optimizer": "adam", "momentum": 0.0,
    ...                "lr": 0.1}, family="mlp")
    {'depth': 1, 'optimizer': 'adam', 'lr': 0.1}
    """
    if not isinstance(p, dict):
        return p
    if other or "builder_params" in p or "onnx" in p:
        from explore.sampling import PER_LAYER  # noqa: PLC0415 (--help start-up; loaded by now)
        from explore.space import Model  # noqa: PLC0415 (--help start-up; loaded by now)

        unused = (set(Model.model_fields) | set(PER_LAYER.values())) - {"onnx", "freeze",
                                                                        "head"}
        p = {**{k: v for k, v in p.items() if k not in unused and k != "builder_params"},
             **p.get("builder_params", {})}
    elif family in BUILT_IN:
        p = {k: v for k, v in p.items() if family in FAMILY_KEYS.get(k, {family})}
    unused_by = _unused_by(str(p.get("optimizer", "")).lower())
    return {k: v for k, v in p.items() if k not in unused_by}


# training keys an optimizer may have no use for, each with a value it would use
OPTIMIZER_KEYS = {"momentum": 0.5, "weight_decay": 0.01}


@functools.cache
def _unused_by(optimizer: str) -> frozenset[str]:
    """The keys of :data:`OPTIMIZER_KEYS` that ``optimizer`` has no use for: those whose
    value does not change the optimizer it builds (none for a name not registered here).

    >>> sorted(_unused_by("adam")), sorted(_unused_by("sgd")), sorted(_unused_by("?"))
    (['momentum'], [], [])
    """
    from explore.optimizers import OPTIMIZERS  # noqa: PLC0415 (--help start-up: the engine)

    if optimizer not in OPTIMIZERS:
        return frozenset()
    opt = OPTIMIZERS.get(optimizer)
    base = dict.fromkeys(OPTIMIZER_KEYS, 0.0)

    def built(**values: float) -> Any:
        v = {**base, **values}
        return opt.build(0.01, v["momentum"], v["weight_decay"])

    try:
        return frozenset(k for k, v in OPTIMIZER_KEYS.items() if built(**{k: v}) == built())
    except Exception:  # a plugin's optimizer that refuses these values: show every key
        return frozenset()


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
    """A parameter's value in full (floats as Python writes them back exactly), with no
    space in it, so that a line breaks between values, never inside one.

    >>> _param([0.5, 0.25]), _param("relu"), _param(0.1)
    ('[0.5,0.25]', 'relu', '0.1')
    """
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


def _num(v: Any, form: str = "{:.4g}") -> str:
    """A number of a table (``-`` where there is none).

    >>> _num(0.123456), _num(None), _num(float("nan")), _num(1234567.0, "{:,.0f}")
    ('0.1235', '-', '-', '1,234,567')
    """
    return "-" if v is None or v != v else form.format(v)


TABLE_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


@click.command()
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet"]), default=None,
              help="the table's format (default: the output's suffix, .parquet or .csv; "
                   "csv for any other)")
@click.option("--output", type=click.Path(dir_okay=False), required=True)
def export(space_file: str | None, storage: str | None, study_name: str | None,
           fmt: str | None, output: str) -> None:
    """Write the study's trials as a table (one row per trial)."""
    from explore.results import frame  # noqa: PLC0415 (--help start-up: pandas)

    by_suffix = TABLE_SUFFIXES.get(Path(output).suffix.lower())
    if fmt is not None and by_suffix is not None and fmt != by_suffix:
        fail(f"--format {fmt} into {output}: its suffix says {by_suffix}; give a .{fmt} "
             "file, or leave --format out")
    fmt = fmt or by_suffix or "csv"
    target = checked_output(output, space_file, storage, study_name)
    study = read_study(space_file, storage, study_name)
    df = frame(study)
    df["params"] = df["params"].map(json.dumps)
    df["out_spans"] = df["out_spans"].map(json.dumps)  # [[left, back], ...] as JSON

    def write(tmp: Path) -> None:
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        else:
            try:
                df.to_parquet(tmp, index=False)
            except ImportError as e:  # pyarrow is a dependency: a broken installation
                fail(f"parquet needs pyarrow, which did not import: {e}")

    write_output(target, output, write)
    console.out.print(f"{len(df)} trials -> {target}")
