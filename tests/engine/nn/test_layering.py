"""engine.nn sits above the other engine packages and imports only the meta-model, the
op table, the errors and the initializers: an import of the compiler breaks a contract."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def lint(root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import "
                           "lint_imports_command; lint_imports_command()", "--no-cache"],
                          cwd=root, capture_output=True, text=True, env=env)


def test_nn_importing_the_compiler_is_caught(tmp_path: Path) -> None:
    pytest.importorskip("importlinter", reason="import-linter is a dev extra; not installed here")
    for d in ("engine", "explore"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bad = tmp_path / "engine" / "nn" / "build.py"
    bad.write_text(bad.read_text() + "\nimport engine.compile.compiler  # noqa\n")
    r = lint(tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0
    assert "engine.nn traces into graphs" in r.stdout and "BROKEN" in r.stdout
