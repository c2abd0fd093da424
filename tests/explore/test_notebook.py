"""The analysis notebook runs headless against a small study made here, shows the best
trials with their final metrics, and draws its four pictures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from explore.binding import bind
from explore.datasets import load_digits
from explore.scheduler import Scheduler
from explore.space import load_space
from explore.study import open_study
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
    assert len(images) == 4
    texts = ["".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code"
             for o in c.get("outputs", []) if o.get("output_type") == "stream"]
    assert any("measured_peak" in s and "budget" in s for s in texts), texts
    # the best trials with the final metrics the run recorded
    assert any(s.startswith("final metrics:") and "accuracy" in s for s in texts), texts
    best = [o for c in nb.cells if c.get("id") == "e4a9f0c6" for o in c.get("outputs", [])
            if o.get("output_type") == "execute_result"]
    assert best and "accuracy" in best[0]["data"]["text/plain"]
    assert os.environ["EXPLORE_STUDY"] == "tiny"
