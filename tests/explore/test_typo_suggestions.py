"""An unknown key or metric name in a search space says what was likely meant: a close
spelling among the section's keys, a synonym's key (``learning_rate`` -> ``lr``), the
section that has the key, or else every key the section takes; at its file and line."""

from __future__ import annotations

import pytest

from explore import metrics
from explore.metrics._base import SYNONYMS as METRIC_SYNONYMS
from explore.space import SYNONYMS, SpaceError, parse_space, unknown_key
from explore.yamlio import load_text

SPACE = """\
dataset: digits
objectives:
  - {{metric: {metric}}}
budget:
  trials: 2
  {rounds}: 3
  memory: 64MB
training:
  {lr}: 0.01
{extra}"""


def errors(metric: str = "accuracy", rounds: str = "rounds", lr: str = "lr",
           extra: str = "") -> list[str]:
    doc = load_text(SPACE.format(metric=metric, rounds=rounds, lr=lr, extra=extra), "s.yaml")
    with pytest.raises(SpaceError) as e:
        parse_space(doc.data, doc)
    return [str(err) for err in e.value.errors]


def test_a_misspelt_key_names_the_close_one_at_its_line() -> None:
    assert "s.yaml:6: budget.round: unknown key; did you mean 'rounds'?" in \
        errors(rounds="round")


def test_a_synonym_names_the_key_of_the_schema() -> None:
    assert errors(lr="learning_rate") == [
        "s.yaml:9: training.learning_rate: unknown key; did you mean 'lr'?"]


def test_a_key_in_the_wrong_section_names_the_right_one() -> None:
    assert errors(extra="epochs: 3\n") == [
        "s.yaml:10: epochs: unknown key; did you mean 'budget.rounds'?"]
    assert errors(extra="trials: 3\n") == [
        "s.yaml:10: trials: unknown key; did you mean 'budget.trials'?"]


def test_a_key_with_nothing_near_lists_the_sections_keys() -> None:
    got = errors(extra="sampler: {name: tpe, xyzzy: 1}\n")
    assert got == ["s.yaml:10: sampler.xyzzy: unknown key; sampler takes name, seed, "
                   "startup_trials"]


def test_a_range_key_is_matched_against_the_ranges_keys() -> None:
    """``lgo`` in a float range: that range's keys (log), not the section's."""
    assert errors(lr="lr: {float: [0.001, 0.1], lgo: true}\n  batch") == [
        "s.yaml:9: training.lr.lgo: unknown key; did you mean 'log'?",
        "s.yaml:10: training.batch: unknown key; did you mean 'batch_size'?"]
    # a choice's keys: per_layer, not the float range's step
    assert unknown_key(("model", "width", "per_layr"),
                       {"model": {"width": {"choice": [8], "per_layr": True}}}) == \
        "unknown key; did you mean 'per_layer'?"
    assert unknown_key(("model", "width", "stepp"),
                       {"model": {"width": {"choice": [8], "stepp": 2}}}) == \
        "unknown key; model.width takes when, per_layer, choice"


def test_an_unknown_metric_names_the_close_one() -> None:
    got = errors(metric="auc")
    assert len(got) == 1 and got[0].startswith("s.yaml:3: objectives[0].metric: Input "
                                               "should be 'accuracy'")
    assert got[0].endswith("; did you mean 'roc_auc'?")
    assert errors(metric="acuracy")[0].endswith("; did you mean 'accuracy'?")
    # nothing near: the list alone
    assert "did you mean" not in errors(metric="xyzzy")[0]
    assert "'train_seconds'" in errors(metric="xyzzy")[0]


@pytest.mark.parametrize("word", sorted(SYNONYMS))
def test_every_synonym_names_a_key_of_the_schema(word: str) -> None:
    """The table is complete by test: its target is a key of the space, which a space
    can be written with."""
    section, _, key = SYNONYMS[word].rpartition(".")
    data = {"budget": {"trials": 1, "rounds": 1, "memory": "64MB"}}
    if section:
        data.setdefault(section, {})
        assert key in unknown_key((section, "xyzzy"), data).split("takes ")[1].split(", ")
    else:
        assert key in unknown_key(("xyzzy",), data).split("takes ")[1].split(", ")


def test_every_metric_synonym_names_a_metric() -> None:
    assert set(METRIC_SYNONYMS.values()) <= set(metrics.names())
