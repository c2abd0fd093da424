"""``explore refit``: the best trial (or ``--trial N``) trained again on the training and
validation rows, kept as the study's refit model (:mod:`explore.refit`), and its test
metrics beside the searched model's."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from explore.cli import console
from explore.cli.common import not_empty, read_bound, read_study, where
from explore.cli.console import EXIT_FAILED, fail


@click.command("refit")
@click.argument("space_file", required=False, type=click.Path(dir_okay=False))
@click.option("--storage", callback=not_empty,
              help="an Optuna storage URL (default: SQLite next to the file)")
@click.option("--study", "study_name", callback=not_empty,
              help="the study name (default: the space's name)")
@click.option("--trial", type=click.IntRange(min=0),
              help="the trial to refit (default: the best; a study of several "
                   "objectives needs one)")
@click.option("--builder", metavar="module:function", callback=not_empty,
              help="the model builder to rebuild the trial's model with (default: the "
                   "one the study names)")
@click.option("--json", "as_json", is_flag=True, help="print the refit's record as JSON")
def refit_command(space_file: str | None, storage: str | None, study_name: str | None,
          trial: int | None, builder: str | None, as_json: bool) -> None:
    """Train a trial again on the training and validation rows, as scikit-learn's
    refit=True: same model, seed, rounds, optimizer and mini-batch, the test rows held
    out.  It is kept as the study's refit model (evaluate, export-model and predict
    take --refit); the test metrics are printed beside the searched model's.

    The rows are SPACE_FILE's data set, which must be the one the study was searched
    on; without SPACE_FILE (--storage and --study), the data set the study recorded.

    \b
    Exit status:
      0  refit, and stored in the study's artifact store
      1  its training diverged (a NaN or infinite loss): nothing was stored
      2  bad input: no such study or trial, a trial that did not complete, a data
         set that cannot be read or is not the study's
    """
    # lazy: numpy, optuna and the engine, which --help does not need
    from explore.refit import RefitFailed, artifacts_for, refit_study  # noqa: PLC0415 (--help start-up)
    from explore.storages import StorageError  # noqa: PLC0415 (--help start-up)
    from explore.trained import ModelError  # noqa: PLC0415 (--help start-up)

    # first: a refused space leaves the storage unopened
    bound = read_bound(space_file) if space_file is not None else None
    storage, study_name = where(space_file, storage, study_name)
    study = read_study(None, storage, study_name)
    try:
        model = refit_study(study, trial, builder, bound.data if bound else None,
                            artifacts_for(storage))
    except (ModelError, StorageError) as e:
        fail(str(e))
    except RefitFailed as e:
        console.err.print(f"[bold red]error:[/] {escape(str(e))}; nothing was stored",
                          highlight=False)
        sys.exit(EXIT_FAILED)
    record: dict[str, Any] = model.refit or {}
    if as_json:
        click.echo(json.dumps(record))
        return
    _report(study_name, record)


def _report(study: str, r: dict[str, Any]) -> None:
    """What was trained, where it went, and its test metrics beside the searched
    model's."""
    rows = r["rows"]
    out = console.out
    out.print(f"refit trial {r['trial']} of study {study!r}: {r['rounds']} round"
              f"{'s' * (r['rounds'] != 1)} on {rows['train'] + rows['valid']:,} rows "
              f"({rows['train']:,} training + {rows['valid']:,} validation), seed "
              f"{r['seed']}, batch {r['batch_size']}, heap {r['heap_bytes']:,} bytes",
              highlight=False, markup=False, soft_wrap=True)
    out.print(f"kept as its refit model: {r['artifact']} in {r['artifacts']}",
              highlight=False, markup=False, soft_wrap=True)
    if not r["test_rows"]:
        out.print("no test split, so no test metrics: add dataset.test (a fraction such "
                  "as 0.2, or a file) to measure it", highlight=False, markup=False, soft_wrap=True)
        return
    t = Table(title=f"trial {r['trial']} on the test split ({r['test_rows']:,} rows)",
              header_style="bold")
    t.add_column("model")
    for name in r["metrics"]:
        t.add_column(name, justify="right")
    t.add_row("refit", *(f"{v:.4g}" for v in r["metrics"].values()))
    searched = r.get("searched_metrics")
    if searched:
        t.add_row("searched", *(f"{searched[k]:.4g}" if k in searched else "-"
                                for k in r["metrics"]))
    out.print(t)
    if not searched:
        out.print(f"(the search kept no model of trial {r['trial']}: keep_models keeps "
                  "the best few)", highlight=False, markup=False, soft_wrap=True)
