"""What a run stores is what :mod:`explore.attrs` names: every key of a trial's record
is a field of :class:`~explore.attrs.TrialRecord`, and every attribute of the study and
its trials is one of the module's names."""

from __future__ import annotations

from pathlib import Path

import optuna

from explore import attrs
from explore.optuna_adapter import storage_of, study_id
from tests.explore.cli_run import explore_run

SPACE = """\
name: rec
dataset: {name: digits, train: 300, valid: 100}
budget: {trials: 6, rounds: 2, memory: 300MB, workers: 2}
sampler: {name: random, seed: 0}
pruner: {name: median, warmup_rounds: 1}
keep_models: 1
model: {depth: 1, width: {int: [8, 32]}, activation: relu}
training: {optimizer: adam, lr: {float: [0.00001, 0.1], log: true}, batch_size: 32}
"""


def names(prefix: str = "") -> set[str]:
    return {v for k, v in vars(attrs).items() if isinstance(v, str) and k.isupper()
            and v.startswith(prefix)}


def test_a_runs_records_and_attributes_are_all_named(tmp_path: Path) -> None:
    f = tmp_path / "rec.yaml"
    f.write_text(SPACE)
    r = explore_run(f)
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="rec", storage=f"sqlite:///{tmp_path / 'rec.db'}")
    fields = set(attrs.TrialRecord.__annotations__)
    flat = set(attrs.FLAT.values())
    seen: set[str] = set()
    for t in study.trials:
        record = t.user_attrs[attrs.RECORD_ATTR]
        assert set(record) <= fields, set(record) - fields
        seen |= set(record)
        assert set(t.user_attrs) <= names() | flat, set(t.user_attrs) - names() - flat
    # the run wrote the records this checks (placement, timing and an end's keys)
    assert {"total_bytes", "worker", "placed_at", "rounds", "driver"} <= seen
    assert set(study.user_attrs) <= names(), set(study.user_attrs) - names()
    system = storage_of(study).get_study_system_attrs(study_id(study))
    prefixes = {":".join(k.split(":", 2)[:2]) + ":" for k in system
                if k.startswith("explore:")}
    assert prefixes == {attrs.HEARTBEAT_PREFIX, attrs.STORAGE_TIME_PREFIX}, prefixes
