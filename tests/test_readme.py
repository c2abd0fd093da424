"""The README's example runs as written, and its two set-up commands stay two."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def example(containing: str) -> str:
    """The README's python example that contains ``containing``."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
              if containing in b]
    assert len(blocks) == 1, f"one python example in the README has {containing!r}"
    return blocks[0]


def test_readme_example_runs_and_learns(capsys) -> None:
    exec(compile(example("rmse"), "README.md", "exec"), {})
    out = capsys.readouterr().out
    rmse = float(re.search(r"rmse ([\d.e-]+)", out).group(1))  # type: ignore[union-attr]
    assert rmse < 0.05


def test_readme_model_switching_example_runs(capsys, tmp_path, monkeypatch) -> None:
    block = example("switches").replace("/tmp/trial0.npz", str(tmp_path / "trial0.npz"))
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("30 switches") and (tmp_path / "trial0.npz").exists()


def test_readme_python_api_example_searches_a_frame_and_predicts(capsys, tmp_path,
                                                                monkeypatch) -> None:
    """explore.run on a DataFrame, then the best kept model predicts its labels."""
    monkeypatch.chdir(tmp_path)
    exec(compile(example("explore.run("), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert (tmp_path / "churn.db").exists() and (tmp_path / "churn.artifacts").is_dir()
    assert "'yes'" in out or "'no'" in out


def test_readme_gives_exactly_two_setup_commands() -> None:
    setup = README.read_text().split("## Set-up")[1].split("## ")[0]
    commands = re.findall(r"```bash\n(.*?)```", setup, re.S)
    assert len(commands) == 2
    assert "pytest" in commands[1]


def test_demo_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "explore.demo", "--epochs", "1"],
                         capture_output=True, text=True, check=True).stdout
    assert "allocated =" in out and "test accuracy" in out


def test_readme_main_job_runs_the_quick_space_and_summarises(tmp_path: Path) -> None:
    setup = README.read_text().split("## Set-up")[1].split("## ")[0]
    first = re.findall(r"```bash\n(.*?)```", setup, re.S)[0]
    assert "explore run search_spaces/quick.yaml" in first
    root = README.parent
    out = subprocess.run([sys.executable, "-m", "explore.cli", "run",
                          str(root / "search_spaces" / "quick.yaml"), "--storage",
                          f"sqlite:///{tmp_path / 'q.db'}", "--quiet"],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert "study 'quick'" in out and "complete" in out
    assert "measured peak" in out and "budget" in out
    # how close it ran to the machine, and where the workers' time went
    assert "utilisation:" in out and "training" in out
