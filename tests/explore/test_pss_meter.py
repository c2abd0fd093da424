"""A process's PSS kept current cheaply (:class:`explore.procmem.PssMeter`): full
readings at most as often as asked and as their cost allows, anonymous pages followed
exactly in between."""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from explore import procmem
from explore.procmem import PssMeter, pss

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(),
                                reason="needs Linux's /proc/PID/smaps_rollup")

MIB = 1 << 20


@dataclass
class FullReadings:
    """The full readings (``smaps_rollup``) the meters make, by process, on a clock the
    test moves (``now``); each reading takes ``cost`` seconds of it."""

    cost: float = 0.0
    now: float = 0.0
    pids: list[int | str] = field(default_factory=list)


def counting(monkeypatch: pytest.MonkeyPatch, cost: float = 0.0) -> FullReadings:
    readings = FullReadings(cost)
    real = procmem.pss_and_shmem

    def full(pid: int | str = "self") -> tuple[int, int]:
        readings.pids.append(pid)
        readings.now += readings.cost
        return real(pid)

    monkeypatch.setattr(procmem, "pss_and_shmem", full)
    monkeypatch.setattr(procmem.time, "monotonic", lambda: readings.now)
    return readings


def test_between_full_readings_anonymous_pages_are_followed_exactly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    readings = counting(monkeypatch)
    meter = PssMeter(every=10.0)
    before = meter.read()
    pages = mmap.mmap(-1, 96 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for at in range(0, 96 * MIB, mmap.PAGESIZE):  # touched: resident, counted
        pages[at] = 1
    assert 96 * MIB <= meter.read() - before < 100 * MIB
    pages.madvise(mmap.MADV_DONTNEED)  # given back: no longer counted
    assert meter.read() - before < 4 * MIB
    pages.close()
    assert len(readings.pids) == 1  # the first reading alone was full


def test_a_full_reading_comes_when_due(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = counting(monkeypatch)
    meter = PssMeter(every=1.0)
    meter.read()
    readings.now += 0.5
    meter.read()
    assert len(readings.pids) == 1
    readings.now += 0.6
    meter.read()
    assert len(readings.pids) == 2
    meter.read(full=True)  # asked: in full at once
    assert len(readings.pids) == 3


def test_full_readings_take_no_more_than_their_share_of_the_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    readings = counting(monkeypatch, cost=0.05)  # a costly reading: 50 ms
    meter = PssMeter(every=0.1, share=0.02)
    meter.read()
    readings.now += 2.0  # due by ``every``, not by the share: 0.05 / 0.02 = 2.5 s
    meter.read()
    assert len(readings.pids) == 1
    readings.now += 0.6
    meter.read()
    assert len(readings.pids) == 2


def test_a_process_gone_reads_as_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    meter = PssMeter(child.pid)
    assert meter.read() == 0 and meter.read() == 0


def test_a_first_reading_is_the_process_pss() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; print(1, flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()  # started, not starting
        got, direct = PssMeter(child.pid).read(), pss(child.pid)
        assert got > 0 and abs(got - direct) < 2 * MIB
    finally:
        child.kill()
        child.wait()


TOUCH = """
import mmap, sys
with open(sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
total = sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))  # every page read
print(total, flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def written_shared_file(size: int) -> Iterator[str]:
    """A file of ``size`` bytes in ``/dev/shm``, every page written through this
    process's mapping of it (kept while the block runs); its path."""
    with tempfile.NamedTemporaryFile(dir="/dev/shm") as f:
        f.truncate(size)
        pages = mmap.mmap(f.fileno(), size)
        try:
            for at in range(0, size, mmap.PAGESIZE):
                pages[at] = 1
            yield f.name
        finally:
            pages.close()


@contextlib.contextmanager
def reader(path: str) -> Iterator[subprocess.Popen[str]]:
    """A child process that has read every page of ``path`` (and waits, until killed)."""
    child = subprocess.Popen([sys.executable, "-c", TOUCH, path],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        child.stdout.readline()
        yield child
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="needs /dev/shm")
def test_shared_memory_another_process_reads_stays_out_of_both_own_parts() -> None:
    """A run's data set in shared memory: when a worker first reads its pages, the
    reader's PSS gains its share and the writer's loses as much; each meter sees the
    change only at its next full reading, so their PSSs taken at different moments do
    not add up.  Their own parts (the shared memory left out) move only by the
    libraries both map."""
    size = 48 * MIB
    with written_shared_file(size) as path:
        mine = PssMeter(every=3600.0)
        own_before = mine.read_own()
        assert mine.shmem >= size - MIB  # the writer alone holds the pages
        with reader(path) as child:
            theirs = PssMeter(child.pid)
            theirs.read()
            assert abs(theirs.shmem - size // 2) < MIB  # the reader's share, at once
            assert theirs.read_own() < 32 * MIB  # an interpreter, no more
            mine.read()
            assert mine.shmem >= size - MIB  # not yet read in full: the old share
            mine.read(full=True)
            assert abs(mine.shmem - size // 2) < MIB
            # the own part moves by what this process allocates and the libraries the
            # child maps too (a few MB), not by the 24 MB share that moved
            assert abs(own_before - mine.read_own()) < size // 4


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="needs /dev/shm")
def test_a_shared_file_counts_once_in_a_tree_however_its_shares_are_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree's PSS is read process by process: a shared file's page that a process
    maps between two readings counts in both.  The file counts at most what it holds."""
    size = 16 * MIB
    with written_shared_file(size) as path, reader(path):
        me = os.getpid()
        real = procmem.tree_pss(me)
        # every process read as if it were the file's only mapper: the race at its worst
        whole_of, files_of = procmem.pss_and_shmem, procmem._shared_files

        def racy_whole(pid: int | str = "self") -> tuple[int, int]:
            whole, shmem = whole_of(pid)
            return (whole + size - shmem, size) if shmem else (whole, shmem)

        def racy_files(pid: int | str) -> dict[tuple[int, int], tuple[int, int]]:
            return {k: (size, held) for k, (_, held) in files_of(pid).items()}

        monkeypatch.setattr(procmem, "pss_and_shmem", racy_whole)
        monkeypatch.setattr(procmem, "_shared_files", racy_files)
        assert abs(procmem.tree_pss(me) - real) < 2 * MIB
