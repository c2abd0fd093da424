"""Checks on the test session as a whole, registered by ``tests/conftest.py``.

**Peak memory.** The README's test command runs on a contributor's laptop and on CI's
2-core, 24 GiB machine with one test process per core, so no test process, nor any
process a test starts, may grow past :data:`DEFAULT_LIMIT` resident (``--max-test-rss``;
``0`` turns the check off).  Each test process records, per test, its peak resident
size during the test (Linux's high-water mark, reset as the test starts), the largest
peak of a process the test started (an ``explore run``, or that run's workers: an upper
bound, :func:`children_high_water`), and its own resident size before and after the
test (what the test kept).  After each test the C heap's free
memory goes back to the system (``malloc_trim``), after a garbage collection where the
test left the process bigger (an exception's traceback keeps its frames' arrays until a
collection finds the cycle), so that what a test no longer holds does not stay counted.
At the end of the session the process that reports (the xdist controller, which gets
each worker's figures as the worker finishes, or the one process without xdist) fails
the session if a peak is over the limit, naming the tests with the highest::

    gw1 peaked at 8.3 GB resident (limit 2.0 GB); the tests with the highest peaks:
      8.3 GB  tests/explore/test_x.py::test_big  (from 412 MB)
      ...

**Nothing left behind.** The session points ``$TMPDIR`` at a folder of its own
(:func:`enter_session_folder`), so that what the tests and every process they start
put in the temporary directory lands there, the cache of measured constants too.  At
the end the reporting process lists what is still in it (but the cache), removes it,
and fails the session if that list is not empty.  pytest's own ``tmp_path`` folders
stay under the real temporary directory, kept for failed tests only (``pyproject.toml``:
``tmp_path_retention_policy``).  Shared data files (``/dev/shm``) of runs a test killed
are removed as every run removes them (:func:`explore.scheduler.shared_arrays.sweep_stale`).
"""

from __future__ import annotations

import contextlib
import ctypes
import fnmatch
import gc
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from explore.procmem import rss

GB = 1 << 30
DEFAULT_LIMIT = 2 * GB
TOP = 5  # tests named per process over the limit
# A test that leaves its process this much bigger is followed by a full garbage
# collection (~0.1 s with the heavier libraries loaded: not after every test).
COLLECT_ABOVE = 32 << 20
SESSION_ENV = "EXPLORE_TEST_TMPDIR"  # the session's folder, for the processes it starts
CACHE = "cache"  # in the session's folder: $EXPLORE_CACHE_DIR, expected to be there
# What libraries keep in the temporary directory on purpose, removed with the folder:
# the measured constants' cache (CACHE), onnxruntime's telemetry session file, the
# compiled kernels of torch.compile (the benchmarks' PyTorch side).
EXPECTED = (CACHE, ".ses", "torchinductor_*")
_KEY = "explore_session_guard"  # in xdist's workeroutput


def high_water() -> int:
    """This process's peak resident size in bytes, since it started or since the last
    :func:`reset_high_water`: Linux's ``VmHWM``.  Elsewhere ``ru_maxrss``, which never
    resets (and which Linux carries over an ``exec`` from the process that started this
    one: a pytest started by a big process would begin at its size)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # KiB but on macOS


def reset_high_water() -> None:
    """Start :func:`high_water` again from the resident size now (Linux; elsewhere it
    keeps the process's peak, and each test is charged the peak so far)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # 5: reset the peak only (1-4 clear page bits)


def children_high_water() -> int:
    """The largest peak resident size, in bytes, of a process this one started and
    waited for (theirs included: an ``explore run`` and its workers).  An upper bound:
    Linux carries a process's peak over ``exec`` from the process that started it, so a
    child counts at least its parent's size then (it is over the limit only if the
    child, or its parent then, was)."""
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # KiB but on macOS


def release_heap_memory() -> None:
    """Hand the C heap's free memory back to the system (glibc's ``malloc_trim``)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


def parse_size(text: str) -> int:
    """Bytes from ``2GB``, ``512MB``, ``1.5G`` or a plain number of bytes.

    >>> parse_size("2GB"), parse_size("512M"), parse_size("0")
    (2147483648, 536870912, 0)
    """
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        return int(float(s[:-1]) * units[s[-1]]) if s and s[-1] in units else int(s)
    except ValueError:
        raise pytest.UsageError(f"--max-test-rss {text!r}: a size such as 2GB or 512MB, "
                                "or 0 for no limit") from None


@dataclass(frozen=True)
class Growth:
    """One test's peak resident size (``peak``), the largest resident size of a process
    it started (``children``), and its process's resident size before and after it;
    all in bytes."""

    nodeid: str
    peak: int
    children: int
    before: int
    after: int

    def figure(self, name: str) -> int:
        """``peak``, ``children`` or ``kept`` (``after - before``)."""
        return self.after - self.before if name == "kept" else int(getattr(self, name))


@dataclass
class ProcessPeaks:
    """One test process's peaks, and for each of the three figures of :class:`Growth`
    (the test's peak, its largest child, what the process kept) the :data:`TOP` tests
    with the most."""

    name: str
    peak: int = 0
    children_peak: int = 0
    top: dict[str, list[Growth]] = field(
        default_factory=lambda: {"peak": [], "children": [], "kept": []})

    def add(self, g: Growth) -> None:
        for figure, tests in self.top.items():
            if g.figure(figure) >= 1 << 20:  # less is noise (a page here and there)
                tests.append(g)
                tests.sort(key=lambda t: t.figure(figure), reverse=True)
                del tests[TOP:]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "peak": self.peak, "children_peak": self.children_peak,
                "top": {k: [asdict(g) for g in v] for k, v in self.top.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProcessPeaks:
        return cls(d["name"], d["peak"], d["children_peak"],
                   {k: [Growth(**g) for g in v] for k, v in d["top"].items()})


def over_limit(processes: Iterable[ProcessPeaks], limit: int) -> list[str]:
    """The report's lines for each process whose peak, or whose largest child's, is
    over ``limit`` bytes (none when ``limit`` is 0): the tests with the highest peaks
    and those that kept the most (what a later test starts from), or the tests that
    started the largest processes.

    >>> p = ProcessPeaks("gw0", peak=3 * GB, children_peak=5 * GB)
    >>> p.add(Growth("t.py::big", 3 * GB, 5 * GB, GB // 4, GB // 2))
    >>> print("\\n".join(over_limit([p], 2 * GB)))
    gw0 peaked at 3.0 GB resident (limit 2.0 GB); the tests with the highest peaks:
      3.0 GB  t.py::big  (from 256 MB)
    and those that left it the most bigger (resident before -> after):
      +256 MB  t.py::big  (256 MB -> 512 MB)
    a process gw0 started reached 5.0 GB resident (limit 2.0 GB); the tests that started it:
      5.0 GB  t.py::big
    >>> over_limit([p], 8 * GB), over_limit([p], 0)
    ([], [])
    """
    def size(n: int) -> str:
        return f"{n / GB:.1f} GB" if n >= GB else f"{n >> 20} MB"

    lines = []
    for p in processes if limit else ():
        if p.peak > limit:
            lines.append(f"{p.name} peaked at {size(p.peak)} resident (limit {size(limit)}); "
                         "the tests with the highest peaks:")
            lines += [f"  {size(g.peak)}  {g.nodeid}  (from {size(g.before)})"
                      for g in p.top["peak"]]
            if p.top["kept"]:
                lines.append("and those that left it the most bigger (resident before -> "
                             "after):")
                lines += [f"  +{size(g.figure('kept'))}  {g.nodeid}  ({size(g.before)} -> "
                          f"{size(g.after)})" for g in p.top["kept"]]
        if p.children_peak > limit:
            lines.append(f"a process {p.name} started reached {size(p.children_peak)} "
                         f"resident (limit {size(limit)}); the tests that started it:")
            lines += [f"  {size(g.children)}  {g.nodeid}" for g in p.top["children"]]
    return lines


def enter_session_folder() -> Path | None:
    """Point ``$TMPDIR`` (and :mod:`tempfile`) at a new folder for the session and
    return it; None where an enclosing process did so already (the xdist controller,
    for its workers; a test session that runs pytest), which then removes it.

    pytest's own folders (``tmp_path``) stay where they were (``$PYTEST_DEBUG_TEMPROOT``),
    so that a failed test's files outlive the session as pytest promises."""
    if os.environ.get(SESSION_ENV):
        return None
    real = tempfile.gettempdir()
    folder = Path(tempfile.mkdtemp(prefix="explore-tests-"))
    folder.chmod(0o755)  # the PostgreSQL server runs as its own user, in a folder here
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", real)
    os.environ[SESSION_ENV] = os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = str(folder)
    return folder


def left_in(folder: Path, expected: Iterable[str] = EXPECTED) -> list[str]:
    """What is in ``folder`` but the ``expected`` names (:func:`fnmatch` patterns), as
    paths relative to it; a folder with a few of its files, so that the test that made
    it can be found.

    >>> d = Path(tempfile.mkdtemp())
    >>> (d / CACHE).mkdir(); (d / "tmpab12").mkdir(); (d / "tmpab12" / "s.db").touch()
    >>> left_in(d)
    ['tmpab12/ (1 entries: s.db)']
    >>> shutil.rmtree(d)
    """
    out = []
    for p in sorted(folder.iterdir()):
        if any(fnmatch.fnmatch(p.name, e) for e in expected):
            continue
        if p.is_dir() and not p.is_symlink():
            inside = sorted(str(q.relative_to(p)) for q in p.rglob("*"))
            shown = ", ".join(inside[:4]) + (", ..." if len(inside) > 4 else "")
            out.append(f"{p.name}/ ({len(inside)} entries{': ' if inside else ''}{shown})")
        else:
            out.append(p.name)
    return out


class SessionGuard:
    """The plugin: records each test's memory, and fails a session over the limit or
    one that left something in its temporary folder (``folder``, when this process
    made it)."""

    def __init__(self, config: pytest.Config, folder: Path | None) -> None:
        self.config = config
        self.limit = parse_size(config.getoption("max_test_rss"))
        self.folder = folder
        worker = getattr(config, "workerinput", {}).get("workerid")
        self.worker: str | None = worker
        self.me = ProcessPeaks(worker or "the test process")
        self.workers: list[ProcessPeaks] = []
        self.problems: list[str] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        before, children = rss(), children_high_water()
        self.me.peak = max(self.me.peak, high_water())  # collection, or the tests before
        reset_high_water()
        yield
        peak = high_water()
        child = children_high_water() if children_high_water() > children else 0
        if rss() - before > COLLECT_ABOVE:  # cycles (a traceback's frames) holding arrays
            gc.collect()
        release_heap_memory()
        self.me.peak = max(self.me.peak, peak)
        self.me.children_peak = max(self.me.children_peak, child)
        self.me.add(Growth(item.nodeid, peak, child, before, rss()))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        out = getattr(node, "workeroutput", {}).get(_KEY)
        if out is not None:
            self.workers.append(ProcessPeaks.from_json(out))

    @pytest.hookimpl(trylast=True)  # after xdist's, which waits for its workers to end
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.me.peak = max(self.me.peak, high_water())
        if self.worker is not None:  # the controller reports
            self.config.workeroutput[_KEY] = self.me.to_json()  # type: ignore[attr-defined]
            return
        self.problems = over_limit(self.workers or [self.me], self.limit)
        if self.folder is not None:
            left = left_in(self.folder)
            if left:
                self.problems.append(f"the tests left in the temporary directory "
                                     f"({self.folder}, now removed):")
                self.problems += [f"  {name}" for name in left]
            shutil.rmtree(self.folder, ignore_errors=True)
        from explore.scheduler.shared_arrays import sweep_stale

        sweep_stale()  # the shared data of runs that tests killed
        if self.problems and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.problems:
            terminalreporter.section("session checks (tests/session_guard.py)", red=True)
            for line in self.problems:
                terminalreporter.line(line)


def add_options(parser: pytest.Parser) -> None:
    default = f"{DEFAULT_LIMIT >> 30}GB"
    parser.addoption("--max-test-rss", default=default, metavar="SIZE",
                     help="fail the session if a test process, or a process it started, "
                          f"grows past SIZE resident (default {default}; 0: no limit)")
