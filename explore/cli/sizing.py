"""``explore size``: the exact memory plan of one candidate of a space, and the largest
batch that fits a budget.

The candidate is the one ``--params`` names; every searched parameter it does not name
takes its range's low end or its choice's first (a model builder's too: its trial
answers each ``suggest_*`` so), and the command says which values it assumed.  Per
zone, the plan's table gives the bytes without sharing, the bytes planned and the lower
bound (the most bytes of the pieces the plan packs that are busy at one instruction;
an op that writes its result over its input, in place, shares that input's piece).
"""

from __future__ import annotations

import json
from typing import Any

import click

from explore.cli import console
from explore.cli.common import byte_size, read_bound
from explore.cli.console import fail


@click.command()
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--params", "params", multiple=True, metavar="KEY=VALUE",
              help="fix a parameter (repeatable); ranges take their low end otherwise")
@click.option("--memory", help="also report the largest batch that fits this budget")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def size(space_file: str, params: tuple[str, ...], memory: str | None, as_json: bool) -> None:
    """Print the exact plan of one candidate of SPACE_FILE."""
    # lazy: the engine, numpy and optuna, which --help does not need
    from engine import BudgetError, compile_graph  # noqa: PLC0415 (--help start-up)
    from engine.errors import EngineError  # noqa: PLC0415 (--help start-up)
    from explore.candidate import compile_candidate, graph_of  # noqa: PLC0415 (--help start-up)
    from explore.families import BuildError  # noqa: PLC0415 (--help start-up)
    from explore.families.builder import LowTrial  # noqa: PLC0415 (--help start-up)
    from explore.optimizers import build_optimizer  # noqa: PLC0415 (--help start-up)
    from explore.sampling import assumed, fixed  # noqa: PLC0415 (--help start-up)
    from explore.space import check_value  # noqa: PLC0415 (--help start-up)

    bound = read_bound(space_file)
    space = bound.space
    overrides = {}
    for item in params:
        if "=" not in item:
            fail(f"--params {item!r}: write KEY=VALUE")
        k, v = item.split("=", 1)
        if k.strip() in overrides:
            fail(f"--params {k.strip()} is given twice")
        try:
            overrides[k.strip()] = _value(v.strip())
        except ValueError as e:
            fail(f"--params {k.strip()}: {e}")
    builder_keys = set(type(space.model).model_fields) if bound.uses_builder else set()
    for k, v in overrides.items():
        if k in builder_keys:
            continue  # the builder's own parameter: its builder says what it may be
        try:
            check_value(k, v)
        except ValueError as e:
            fail(f"--params {k}: {e}")
    budget = byte_size(memory, "--memory")
    try:
        graph = None
        if bound.uses_builder:  # the builder's own parameters: answered from --params
            # the model's keys are the builder's; the space keeps its training ones
            mine = set(space.params()) - set(type(space.model).model_fields)
            given = {k: v for k, v in overrides.items() if k not in mine}
            overrides = {k: v for k, v in overrides.items() if k in mine}
        try:
            p = fixed(space, overrides)
        except ValueError as e:
            fail(f"--params {e}")
        guessed = assumed(space, p, overrides)
        if p["batch_size"] == "auto" and budget is None:
            p["batch_size"] = guessed["batch_size"] = space.training.auto_max_batch
        if bound.uses_builder:
            low = LowTrial(given)
            graph = graph_of(bound, p, trial=low)
            guessed.update({k: v for k, v in low.params.items() if k not in given})
        cand = compile_candidate(bound, p, budget or 1 << 62, graph=graph)
        # the engine's search for the largest batch that fits (engine.max_batch)
        biggest = compile_graph(graph or graph_of(bound, p), memory=budget,
                                optimizer=build_optimizer(p),
                                device=space.budget.device).batch_size if budget else None
    except KeyError as e:
        fail(f"--params: {e.args[0]}")
    except (BuildError, BudgetError, EngineError, ValueError) as e:
        fail(str(e))
    prog = cand.program
    result: dict[str, Any] = {"zones": dict(prog.zone_bytes), "total_bytes": prog.total_bytes,
                              "batch_size": cand.train_batch,
                              "compiled_batch": prog.batch_size, "assumed": guessed}
    if biggest is not None:
        result["max_batch"] = biggest
    if as_json:
        click.echo(json.dumps(result))
        return
    if guessed:
        console.out.print(f"assumed, as --params did not say: {assumed_text(guessed)}",
                          highlight=False)
    console.out.print(prog.plan_report(), highlight=False)
    console.out.print(
        f"batch {cand.train_batch} (compiled for {prog.batch_size}, the validation "
        f"chunk): {prog.total_bytes:,} bytes"
        + (f"; largest batch in {budget:,} bytes: {biggest:,}" if biggest else ""))


def _value(text: str, inside: bool = False) -> Any:
    """A --params value: an integer, a number, true/false, a [list] of those, or a
    name; ValueError for a list that is not one (unclosed, nested, an empty item).

    >>> _value("[8, 16]"), _value("0.5"), _value("relu")
    ([8, 16], 0.5, 'relu')
    >>> _value("[8,16,")
    Traceback (most recent call last):
    ...
    ValueError: '[8,16,' is not a list: write [first,second,...]
    """
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if "[" in text or "]" in text:
        items = text[1:-1].split(",")
        if inside or not (text.startswith("[") and text.endswith("]")) or \
                any(c in text[1:-1] for c in "[]") or not all(x.strip() for x in items):
            raise ValueError(f"{text!r} is not a list: write [first,second,...]")
        return [_value(x.strip(), inside=True) for x in items]
    return text


def assumed_text(values: dict[str, Any]) -> str:
    """``name=value, ...``, each as ``--params`` would give it.

    >>> assumed_text({"depth": 1, "widths": [16, 32], "optimizer": "adam", "lr": 0.001})
    'depth=1, widths=[16,32], optimizer=adam, lr=0.001'
    """
    def shown(v: Any) -> str:
        if isinstance(v, list):
            return f"[{','.join(shown(x) for x in v)}]"
        return str(v).lower() if isinstance(v, bool) else str(v)  # as --params reads it

    return ", ".join(f"{k}={shown(v)}" for k, v in values.items())
