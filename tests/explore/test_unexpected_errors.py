"""An exception no command expected (a bug in explore, not bad input) ends the
``explore`` executable with a few lines and exit status 1, never a traceback; with
``EXPLORE_TRACEBACK=1`` the traceback is shown, for the report."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# A bug planted in export-model, in the process the executable's own code runs.
PLANTED = textwrap.dedent("""
    import sys
    import explore.cli.models as models

    def broken(*args, **kwargs):
        raise RuntimeError("planted fault")

    models.checked_output = broken
    from explore.cli import entry
    sys.argv = ["explore", "export-model", "space.yaml", "--output", "model.onnx"]
    entry()
""")


def _run(tmp_path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PLANTED], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, **env}, timeout=120)


def test_an_unexpected_error_is_said_in_a_few_lines_with_exit_status_1(tmp_path) -> None:
    r = _run(tmp_path, EXPLORE_TRACEBACK="")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "error: unexpected RuntimeError: planted fault" in r.stderr
    assert "explore/cli/models.py" in r.stderr  # where it was raised, in explore
    assert "explore export-model space.yaml --output model.onnx" in r.stderr
    assert "EXPLORE_TRACEBACK=1" in r.stderr
    assert not (tmp_path / "model.onnx").exists()


def test_explore_traceback_shows_the_traceback(tmp_path) -> None:
    r = _run(tmp_path, EXPLORE_TRACEBACK="1")
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "RuntimeError: planted fault" in r.stderr


def test_bad_input_keeps_its_own_message_and_status(tmp_path) -> None:
    """The catch-all is the last resort: a refusal is still said by its command, 2."""
    r = subprocess.run([sys.executable, "-m", "explore.cli", "export-model", "missing.yaml",
                        "--output", "m.onnx"], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "unexpected" not in r.stderr and "Traceback" not in r.stderr


def test_an_operating_system_error_is_not_called_a_fault_of_explore(tmp_path) -> None:
    code = PLANTED.replace('raise RuntimeError("planted fault")',
                           'raise OSError(28, "No space left on device")')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "EXPLORE_TRACEBACK": ""}, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "No space left on device" in r.stderr and "operating system" in r.stderr
    assert "fault in explore" not in r.stderr


def test_a_reader_gone_away_ends_it_quietly(tmp_path) -> None:
    """``explore ... | head``: the pipe closed under its output is no error to show."""
    code = PLANTED.replace('raise RuntimeError("planted fault")', 'raise BrokenPipeError(32, "x")')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "EXPLORE_TRACEBACK": ""}, timeout=120)
    assert r.returncode == 1 and r.stderr == ""
