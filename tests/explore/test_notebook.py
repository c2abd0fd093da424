"""The analysis notebook runs headless against a small study made here, shows the best
trials with their final metrics, and draws its five pictures; its packing timeline
(:mod:`explore.timeline`) draws the spans a trial was switched out of its arena."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from explore.binding import bind
from explore.datasets import load_digits
from explore.scheduler import Scheduler
from explore.space import load_space
from explore.study import open_study
from explore.timeline import OUT_STYLE, draw_trials, pieces
from tests.explore.cli_run import IN_TEST
from tests.explore.test_explore_run import write

NOTEBOOK = Path(__file__).resolve().parent.parent.parent / "notebooks" / "analysis.ipynb"


@pytest.mark.slow  # a kernel and a whole notebook: CI's slow step runs it
def test_the_analysis_notebook_runs_on_a_study(tmp_path: Path, monkeypatch) -> None:
    nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat "
                                   "(pip install -e '.[dev]')")
    from nbclient import NotebookClient

    f = write(tmp_path, trials=5, width="{choice: [8, 16, 32]}")
    space = load_space(f)
    storage = f"sqlite:///{tmp_path / 'tiny.db'}"
    study = open_study(space, storage)
    from explore.runner import record_run as _record_run

    stats = Scheduler(bind(space), study, load_digits(), workers=2, memory=space.budget.memory,
                      device="cpu", main=IN_TEST).run(5)
    _record_run(study, stats)
    monkeypatch.setenv("EXPLORE_STORAGE", storage)
    monkeypatch.setenv("EXPLORE_STUDY", "tiny")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # the kernel imports this tree's explore, whatever an installed copy points at
    root = str(NOTEBOOK.parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    assert len(images) == 5
    texts = ["".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code"
             for o in c.get("outputs", []) if o.get("output_type") == "stream"]
    assert any("measured_peak" in s and "budget" in s for s in texts), texts
    # the run's utilisation and where the workers' time went
    assert any(s.startswith("utilisation: ") and "training" in s for s in texts), texts
    # the best trials with the final metrics the run recorded
    assert any(s.startswith("final metrics:") and "accuracy" in s for s in texts), texts
    best = [o for c in nb.cells if c.get("id") == "e4a9f0c6" for o in c.get("outputs", [])
            if o.get("output_type") == "execute_result"]
    assert best and "accuracy" in best[0]["data"]["text/plain"]
    assert os.environ["EXPLORE_STUDY"] == "tiny"


def test_the_timeline_cuts_a_trial_at_the_spans_it_was_out() -> None:
    # spans as the record keeps them: sorted here, clipped to the trial's own start and
    # end (the worker's stamps), the last one ending with the trial (it ended out)
    assert pieces(1.0, 10.0, [[6.0, 10.0], [0.5, 2.0], [3.0, 4.0]]) == [
        (1.0, 2.0, True), (2.0, 3.0, False), (3.0, 4.0, True), (4.0, 6.0, False),
        (6.0, 10.0, True)]
    assert pieces(1.0, 10.0, None) == [(1.0, 10.0, False)]
    assert pieces(1.0, 10.0, [[12.0, 13.0]]) == [(1.0, 10.0, False)]


def test_the_timeline_draws_the_spans_out_hatched() -> None:
    pytest.importorskip("matplotlib", reason="the timeline needs matplotlib "
                        "(pip install -e '.[dev]')")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = pd.DataFrame([
        {"number": 0, "start": 0.0, "end": 4.0, "arena_offset": 0, "total_bytes": 2e6,
         "out_spans": []},
        {"number": 1, "start": 1.0, "end": 9.0, "arena_offset": 2e6, "total_bytes": 3e6,
         "out_spans": [[3.0, 5.0], [7.0, 9.0]]}])
    fig, ax = plt.subplots()
    try:
        assert draw_trials(ax, rows) == 2
        bars = [(c.get_paths()[0].get_extents(), c.get_hatch()) for c in ax.collections]
        drawn = sorted((round(b.x0, 3), round(b.x1, 3), round(b.y0, 3), hatch)
                       for b, hatch in bars)
        assert drawn == [(0.0, 4.0, 0.0, None), (1.0, 3.0, 2.0, None),
                         (3.0, 5.0, 2.0, OUT_STYLE["hatch"]), (5.0, 7.0, 2.0, None),
                         (7.0, 9.0, 2.0, OUT_STYLE["hatch"])]
        assert draw_trials(ax, rows.drop(columns="out_spans")) == 0  # an older frame
    finally:
        plt.close(fig)
