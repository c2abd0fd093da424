"""The session's own checks (``tests/session_guard.py``): a test process over the memory
limit, a process a test started over it, and a file left in the temporary directory
each fail the session, naming the test; the session's folder is gone afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.session_guard import SESSION_ENV

ROOT = Path(__file__).resolve().parents[1]

PROBE = """\
import subprocess, sys, tempfile
import numpy as np

def test_grows():
    a = np.ones(300 << 17)  # 300 MB
    del a

def test_starts_a_big_process():
    subprocess.run([sys.executable, "-c", "import numpy as np; "
                    "a = np.ones(300 << 17)"], check=True)

def test_leaves_a_folder():
    (open(tempfile.mkdtemp(prefix="forgotten-") + "/s.db", "w")).close()

def test_cleans_up(tmp_path):
    with tempfile.TemporaryDirectory() as d:
        (tmp_path / "kept").write_text(d)
"""


def session(tmp_path: Path, *args: str) -> tuple[int, str, Path]:
    """Run :data:`PROBE` as a pytest session of its own, with the checks as
    ``tests/conftest.py`` registers them and a temporary directory of its own: its exit
    status, its output and that directory."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_probe.py").write_text(PROBE)
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items()  # not this session's: its own
           if k not in (SESSION_ENV, "EXPLORE_CACHE_DIR") and not k.startswith("PYTEST_")}
    env.update(TMPDIR=str(temp), PYTEST_DEBUG_TEMPROOT=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p",
                        "no:cacheprovider", "--rootdir", str(tmp_path), *args,
                        str(tmp_path / "test_probe.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr, temp


def test_a_session_over_the_limit_or_with_leftovers_fails_naming_the_tests(
        tmp_path: Path) -> None:
    code, out, temp = session(tmp_path, "--max-test-rss", "250MB")
    assert code == 1, out
    assert "4 passed" in out, out
    lines = out.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("the test process peaked at")))
    assert "(limit 250 MB)" in lines[at] and "test_probe.py::test_grows" in lines[at + 1], out
    at = lines.index(next(x for x in lines if x.startswith("a process the test process")))
    assert "test_probe.py::test_starts_a_big_process" in lines[at + 1], out
    at = lines.index(next(x for x in lines if x.startswith("the tests left in the temp")))
    assert lines[at + 1].strip().startswith("forgotten-"), out
    assert lines[at + 1].endswith("(1 entries: s.db)"), out
    assert list(temp.iterdir()) == []  # the session's folder, and what was in it, gone


def test_a_session_within_the_limit_and_clean_passes(tmp_path: Path) -> None:
    code, out, temp = session(tmp_path, "-k", "cleans_up")
    assert code == 0, out
    assert "session checks" not in out
    assert list(temp.iterdir()) == []
