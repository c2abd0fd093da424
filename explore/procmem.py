"""What the operating system says a process, or a run's whole tree of processes, uses.

The figure is the proportional set size (PSS, Linux ``/proc/PID/smaps_rollup``): a
process's private pages plus its share of the pages it maps together with others, so
that the PSS of a set of processes sums to the memory they use between them (resident
sizes count a shared library once per process).  Where PSS is missing the resident
size stands in; elsewhere than Linux both read 0.

>>> pss() > 0 and tree_pss() > 0
True
"""

from __future__ import annotations

import os
import subprocess
import threading
import time


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a zombie counts as gone; another
    user's process, which cannot be signalled, as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def rss(pid: int | str = "self") -> int:
    """A process's resident memory (0 where ``/proc`` has none, or once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _rollup_fields(pid: int | str, fields: tuple[str, ...]) -> dict[str, int] | None:
    """Each of ``fields`` (``"Pss:"``, ...) that a process's ``smaps_rollup`` has, in
    bytes, from one reading; None where it has none of them (or once it is gone)."""
    got: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(fields):
                    name, kb = line.split()[:2]
                    got[name] = int(kb) * 1024
    except (OSError, ValueError):
        return None
    return got or None


def _rollup(pid: int | str, fields: tuple[str, ...]) -> int | None:
    """The sum of ``fields`` (``"Pss:"``, ...) in a process's ``smaps_rollup``, in
    bytes; None where it has none of them (or once it is gone)."""
    got = _rollup_fields(pid, fields)
    return None if got is None else sum(got.values())


def pss(pid: int | str = "self") -> int:
    """A process's proportional set size (its resident size where PSS is missing)."""
    got = _rollup(pid, ("Pss:",))
    return rss(pid) if got is None else got


def pss_and_shmem(pid: int | str = "self") -> tuple[int, int]:
    """A process's PSS and the part of it that is shared memory (``Pss_Shmem``: pages of
    files on a RAM file system it maps, such as a run's data set in ``/dev/shm``), from
    one reading; the shared part reads 0 where the kernel does not say it."""
    got = _rollup_fields(pid, ("Pss:", "Pss_Shmem:"))
    if got is None or "Pss:" not in got:
        return rss(pid), 0
    return got["Pss:"], got.get("Pss_Shmem:", 0)


def rss_anon(pid: int | str = "self") -> int | None:
    """A process's resident anonymous pages (``RssAnon`` of ``/proc/PID/status``), in
    bytes: a counter the kernel keeps, read in constant time; None where it is missing
    (or once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class PssMeter:
    """A process's PSS, kept current at a small cost.  Reading ``smaps_rollup`` walks
    the page tables of every mapping, so it costs in proportion to the resident pages:
    10-20 ms for a worker holding a few hundred MB of arena in small pages, several
    times a second on the cores the workers train on.  A meter reads it in full at most
    every ``every`` seconds, and never more often than ``share`` of its time: each full
    reading is timed, and the next waits for ``1 / share`` times as long.  Between
    full readings it adds to the last the change of the process's anonymous pages,
    which the kernel counts as they come and go (``RssAnon``): a private anonymous page
    counts whole in the PSS, so a heap grown or given back shows at once, exactly.
    What the others' pages shared with it do (a library mapped, a sharer started or
    ended) shows at the next full reading.

    :meth:`read_own` leaves out the shared memory it maps (a run's data set, whose
    pages every process that reads them shares): its share of those moves whenever
    another process first reads a page, which this process's meter would see only at
    its next full reading, while the reader's meter sees it at once.  Two meters'
    readings of the shared pages taken at different moments do not add up to the pages;
    their own parts do.

    >>> m = PssMeter(every=10.0)
    >>> first = m.read()
    >>> import numpy as np
    >>> a = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB of new anonymous pages
    >>> m.read() - first >= 60 << 20
    True
    """

    def __init__(self, pid: int | str = "self", every: float = 1.0,
                 share: float = 0.02) -> None:
        self.pid, self.every, self.share = pid, every, share
        self._full_at = -float("inf")
        self._wait = 0.0  # seconds until the next full reading may come
        self._pss = 0
        self._shmem = 0  # of the last full reading: RssAnon says nothing of it
        self._anon: int | None = None

    def read(self, full: bool = False) -> int:
        """The PSS now, in bytes: read in full if ``full`` or if it is time to."""
        now = time.monotonic()
        if full or self._anon is None or now - self._full_at >= self._wait:
            self._pss, self._shmem = pss_and_shmem(self.pid)
            self._anon = rss_anon(self.pid)
            done = time.monotonic()
            self._full_at = done
            self._wait = max(self.every, (done - now) / self.share)
            return self._pss
        anon = rss_anon(self.pid)
        if anon is None:  # gone, or a kernel without the counter: read in full
            return self.read(full=True)
        return max(0, self._pss + anon - self._anon)

    def read_own(self, full: bool = False) -> int:
        """The PSS now less the shared memory the process maps (:attr:`shmem`)."""
        return max(0, self.read(full) - self.shmem)

    @property
    def shmem(self) -> int:
        """The shared memory in the last full reading (``Pss_Shmem``), which the PSS
        :meth:`read` gives holds: between full readings only private pages change it."""
        return self._shmem


def uss(pid: int | str = "self") -> int:
    """A process's unique set size: its private resident pages, which no other process
    shares, so no other's start or end moves it (0 where ``/proc`` has none)."""
    return _rollup(pid, ("Private_Clean:", "Private_Dirty:")) or 0


def gpu_bytes(pid: int | None = None) -> int | None:
    """The device memory a process (this one by default) holds on the current CUDA
    device, as the driver's management library (NVML) lists it: its context, its
    libraries' handles and its allocations.  None where cupy or NVML (the package
    ``nvidia-ml-py``) is missing or fails, or does not list the process (in a container
    whose process ids are not the host's).

    The device-wide figure (``total - free``) would count every other process on the
    device too: with four workers started at once on one GPU, the last to measure
    counted the three contexts before it as its own."""
    try:
        import cupy  # noqa: PLC0415 (optional dependency: the gpu extra)
        import pynvml  # noqa: PLC0415 (optional dependency: the gpu extra)
    except ImportError:
        return None
    me = os.getpid() if pid is None else pid
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(cupy.cuda.Device().pci_bus_id)
            listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML's errors are many classes; any means "cannot say"
        return None
    for p in listed:
        used = getattr(p, "usedGpuMemory", None)
        if getattr(p, "pid", None) == me and used is not None:
            return int(used)
    return None


def gpu_processes() -> dict[int, int] | None:
    """The device memory of every process the driver lists, on every GPU of this
    machine, summed per process: ``{pid: bytes}``.  Asks NVML only, so the process that
    asks makes no CUDA context and holds no device memory for asking.  None where NVML
    (``nvidia-ml-py``) is missing or fails; a process it does not list (in a container
    whose process ids are not the host's) is absent."""
    try:
        import pynvml  # noqa: PLC0415 (optional dependency: the gpu extra)
    except ImportError:
        return None
    out: dict[int, int] = {}
    try:
        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = getattr(p, "usedGpuMemory", None)
                    if used is not None:
                        out[int(p.pid)] = out.get(int(p.pid), 0) + int(used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML's errors are many classes; any means "cannot say"
        return None
    return out


def children(pid: int | str = "self") -> list[int]:
    """Every descendant of ``pid`` (children, their children, ...) now alive."""
    root = os.getpid() if pid == "self" else int(pid)
    out: list[int] = []
    todo = [root]
    while todo:
        p = todo.pop()
        kids: list[int] = []
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids.extend(int(c) for c in f.read().split())
        except OSError:
            continue
        out.extend(kids)
        todo.extend(kids)
    return out


def tree_pss(pid: int | str = "self") -> int:
    """The PSS of ``pid`` and every descendant, summed: what the run uses, as the
    system measures it (shared data and libraries counted once).

    The processes are read one after another, not at one instant, so a page of a
    shared file (a run's data set in ``/dev/shm``) that a process first maps between
    two readings counts in both: as a worker read the data set in its first pass, that
    put the tree MBs over what it held.  So each such file counts as the smaller of the
    processes' shares of it summed and what it holds (its blocks: a RAM file system's
    pages are the file's storage, and cannot take more)."""
    total = 0
    shares: dict[tuple[int, int], int] = {}
    held: dict[tuple[int, int], int] = {}
    for p in [pid, *children(pid)]:
        whole, shmem = pss_and_shmem(p)
        total += whole
        if shmem:
            for key, (share, blocks) in _shared_files(p).items():
                total -= share
                shares[key] = shares.get(key, 0) + share
                held[key] = blocks
    return total + sum(min(shares[k], held[k]) for k in shares)


def _shared_files(pid: int | str) -> dict[tuple[int, int], tuple[int, int]]:
    """The files in ``/dev/shm`` that process ``pid`` maps, by (device, inode): the PSS
    of its mappings of each, and the bytes the file holds (its blocks).  A file
    deleted since is left out: its pages count as the mappers' shares."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    path, inode = None, 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(maxsplit=5)
                if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping
                    path = head[5].rstrip("\n") if len(head) == 6 else None
                    inode = int(head[4])
                elif path is not None and path.startswith("/dev/shm/") and \
                        line.startswith("Pss:"):
                    try:
                        st = os.stat(path)
                    except OSError:
                        continue
                    if st.st_ino != inode:  # another file by that name since
                        continue
                    key = (st.st_dev, st.st_ino)
                    share = int(line.split()[1]) * 1024
                    out[key] = (out.get(key, (0, 0))[0] + share, st.st_blocks * 512)
    except (OSError, ValueError):
        return {}
    return out


def run_measured(argv: list[str], every: float = 0.02, timeout: float | None = None
                 ) -> tuple[int, str, int]:
    """Run ``argv`` and sample the PSS of its whole process tree every ``every`` seconds
    from outside; its exit status, its output (stdout and stderr) and the peak.

    >>> rc, out, peak = run_measured(["python3", "-c", "print(1)"])
    >>> rc, out.strip(), peak >= 0
    (0, '1', True)
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_pss(proc.pid))
            time.sleep(every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output, _ = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        done.set()
        sampler.join()
    return proc.returncode, output, peak
