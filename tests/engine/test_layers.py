"""The layers hold: import-linter's contracts in pyproject.toml (engine never imports
explore; runtime never imports compile; ops import neither; the meta-model imports
nothing; no cycles between sibling packages) are kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def test_import_contracts_are_kept() -> None:
    pytest.importorskip("importlinter", reason="import-linter is a dev extra; not installed here")
    r = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command;"
                        "lint_imports_command()", "--no-cache"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_a_broken_contract_is_caught(tmp_path: Path) -> None:
    """The check can fail: a runtime module that imports the compiler breaks a contract."""
    pytest.importorskip("importlinter", reason="import-linter is a dev extra; not installed here")
    import shutil

    for d in ("engine", "explore"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bad = tmp_path / "engine" / "runtime" / "heap.py"
    bad.write_text(bad.read_text() + "\nimport engine.compile.planner  # noqa\n")
    r = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command;"
                        "lint_imports_command()", "--no-cache"],
                       cwd=tmp_path, capture_output=True, text=True,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0
    assert "the runtime never imports the compiler BROKEN" in r.stdout
