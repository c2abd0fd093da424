"""``explore show`` and ``explore export``: a study's summary and best trials on the
terminal, or all its trials as a table in a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.table import Table

from explore.cli import console
from explore.cli.common import read_study
from explore.cli.console import fail
from explore.cli.output import checked_output, write_output
from explore.cli.summary import last_run, print_summary, small_mb


@click.command()
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
def show(space_file: str | None, storage: str | None, study_name: str | None) -> None:
    """Summarise a study: counts, best trial, and the best few trials with their final
    metrics and every parameter that varies (those the same in every trial below), and
    the trials switched out of their worker's arena while paused."""
    from explore.results import frame, metric_columns  # noqa: PLC0415 (--help start-up: pandas)

    out = console.out
    study = read_study(space_file, storage, study_name)
    print_summary(study, last_run(study))
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
    _print_switched(df)


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


def _shown_params(p: Any, other: bool = False) -> Any:
    """A trial's parameters as ``show`` lists them: a model builder's own ones in line
    with the others, and the built-in families' model keys left out where a builder or
    an ONNX file made the model (``other``: they were not used)."""
    if not isinstance(p, dict) or not (other or "builder_params" in p or "onnx" in p):
        return p
    from explore.sampling import PER_LAYER  # noqa: PLC0415 (--help start-up; loaded by now)
    from explore.space import Model  # noqa: PLC0415 (--help start-up; loaded by now)

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


@click.command()
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet"]), default="csv")
@click.option("--output", type=click.Path(dir_okay=False), required=True)
def export(space_file: str | None, storage: str | None, study_name: str | None, fmt: str,
           output: str) -> None:
    """Write the study's trials as a table (one row per trial)."""
    from explore.results import frame  # noqa: PLC0415 (--help start-up: pandas)

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
