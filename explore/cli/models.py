"""``explore export-model`` and ``explore evaluate``: a model the search kept, written
as ONNX (described, with a snippet that runs it) or scored on the test split."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from explore.cli import console
from explore.cli.common import not_empty, read_bound, where
from explore.cli.console import fail
from explore.cli.output import checked_output, write_output


def _model(space_file: str | None, storage: str | None, study_name: str | None,
           trial: int | None, builder: str | None = None, refit: bool = False) -> Any:
    """The kept model a command names, or the study's refit model (exit status 2 with
    the reason if none)."""
    # lazy: optuna, numpy and the engine, which --help does not need
    from explore.storages import StorageError  # noqa: PLC0415 (--help start-up)
    from explore.trained import ModelError, load_model  # noqa: PLC0415 (--help start-up)

    storage, study_name = where(space_file, storage, study_name)
    try:
        return load_model(storage, study_name, trial, builder, refit=refit)
    except (ModelError, StorageError) as e:
        fail(str(e))


@click.command("export-model")
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
@click.option("--trial", type=int, help="the trial whose model (default: the best kept)")
@click.option("--refit", is_flag=True,
              help="the study's refit model (explore refit) instead of a kept one")
@click.option("--builder", callback=not_empty, metavar="MODULE:FUNCTION",
              help="the study's model builder, where the study cannot import it (one "
                   "defined in a notebook)")
@click.option("--output", type=click.Path(dir_okay=False), required=True,
              help="the ONNX file to write")
def export_model(space_file: str | None, storage: str | None, study_name: str | None,
                 trial: int | None, refit: bool, builder: str | None, output: str) -> None:
    """Write a kept model as ONNX, its preprocessing inside: it takes raw rows.

    Prints each input and output (type, shape, columns in order, categories) and a
    short onnxruntime snippet that runs the file; the file itself says the same in its
    metadata (explore.* keys)."""
    import onnx  # noqa: PLC0415 (--help start-up: onnx loads in a fifth of a second)

    from explore.onnx_metadata import decode, example_code, metadata  # noqa: PLC0415 (--help start-up)

    target = checked_output(output, space_file, storage, study_name)
    model = _model(space_file, storage, study_name, trial, builder, refit)
    proto = model.to_onnx()
    write_output(target, output, lambda tmp: onnx.save(proto, str(tmp)))
    meta = decode(metadata(model, proto))
    lines = [f"trial {model.trial} of study {model.study!r} -> {target}", "inputs:"]
    lines += [f"  {name}: {layout}" for name, layout in meta["inputs"].items()]
    lines.append("outputs:")
    lines += [f"  {name}: {layout}" for name, layout in meta["outputs"].items()]
    lines += ["run it with onnxruntime (pip install onnxruntime):", "",
              example_code(proto, output, meta)]
    # plain text: the snippet's [[...]] is no markup, and its lines are not wrapped
    console.out.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


@click.command()
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--storage")
@click.option("--study", "study_name")
@click.option("--trial", type=int, help="the trial whose model (default: the best kept)")
@click.option("--refit", is_flag=True,
              help="the study's refit model (explore refit) instead of a kept one")
@click.option("--builder", callback=not_empty, metavar="MODULE:FUNCTION",
              help="the study's model builder, where the study cannot import it (one "
                   "defined in a notebook)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def evaluate(space_file: str, storage: str | None, study_name: str | None, trial: int | None,
             refit: bool, builder: str | None, as_json: bool) -> None:
    """Report a kept model's metrics on the test split of SPACE_FILE's data set."""
    # lazy: numpy, optuna and the engine, which --help does not need
    from explore.datasets import DataError  # noqa: PLC0415 (--help start-up)
    from explore.trained import data_mismatch, evaluate_split  # noqa: PLC0415 (--help start-up)

    bound = read_bound(space_file)  # first: a refused space leaves the storage unopened
    model = _model(space_file, storage, study_name, trial, builder, refit)
    try:
        other = data_mismatch(model, bound.data)
        if other is not None:
            fail(f"{space_file}: its data set is not the one study {model.study!r} was "
                 f"trained on ({other}); evaluate with the study's own space file")
        test = bound.data.load().test
    except DataError as e:
        fail(str(e))
    if len(test) == 0:
        fail(f"{space_file}: the data set has no test split; add dataset.test "
             "(a fraction such as 0.2, or a file)")
    try:
        got = evaluate_split(model, test.x, test.y)
    except DataError as e:
        fail(f"{space_file}: {e}")
    if as_json:
        click.echo(json.dumps({"trial": model.trial, "refit": model.refit is not None,
                               "rows": len(test), "metrics": got}))
        return
    what = "refit of trial" if model.refit is not None else "trial"
    t = Table(title=f"{what} {model.trial} on the test split ({len(test):,} rows)",
              header_style="bold")
    for name in got:
        t.add_column(name)
    t.add_row(*(f"{v:.4g}" for v in got.values()))
    console.out.print(t)
