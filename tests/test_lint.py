"""ruff and mypy are clean (they run here so that CI runs exactly the README's command)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("ruff") is None and not (Path(sys.prefix) / "bin/ruff").exists(),
                    reason="ruff is a dev extra; not installed here")
def test_ruff_is_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "engine", "explore", "tests",
                        "bench"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean() -> None:
    pytest.importorskip("mypy", reason="mypy is a dev extra; not installed here")
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
