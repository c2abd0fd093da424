"""What switching a model out and back in costs, against a raw copy of the same bytes.

For models whose state (parameters and Adam's two slots) is about 1 MB, 16 MB and
128 MB (the paper's MLP, 784-h-h-10, batch 64, widened until it is; two Adam steps
taken, so that the moments are not zeros), timed interleaved in one process, the order
of the sides rotated every sample, median of ``--repeats`` samples:

- ``file_warm`` and ``file_cold``: the switch is ``VM.write_state(path)`` then
  ``VM.read_state(path)`` (the model's state straight from the heap to a file in
  ``--dir`` and back; for a GPU model through the engine's bounded pinned buffer); the
  raw side writes the very bytes ``write_state`` wrote (header included) from a host
  buffer with ``os.write`` to a new file in the same folder and reads them back into it
  with ``readinto`` (for a GPU model: the device bytes copied whole into pinned memory
  and written, read back into it and copied to the device: the fastest a user writes,
  with pinned memory as large as the model).  Each side then removes its file, as
  explore removes a switched-out trial's file once it is read back in, and writes a new
  one next time (overwriting one would make ext4 flush it at once, ``auto_da_alloc``).
  Neither side fsyncs in ``file_warm``, so the read finds the bytes in the page cache;
  in ``file_cold`` each side fsyncs its file after writing and then drops it from the
  page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``; ``drop_caches`` needs a privilege
  this machine's containers lack), so the read comes from the disk.  The fsync and the
  drop are timed on both sides alike (one helper, by path).  ``cold_resident_bytes`` is
  what ``fincore`` says is still cached after the drop, checked once per case (null
  without ``fincore``).
- ``memory``: the switch is ``VM.save_state(into=st)`` then ``VM.load_state(st)``
  (host memory; ``into`` reuses the buffers, as a pool does), the raw side copies
  the bytes the switch keeps (``state_bytes``, the same values) to a host buffer and back:
  ``np.copyto`` twice on the CPU, ``get(out=pinned)`` and ``set(pinned)`` on the GPU.

The raw file side runs two ways, the bytes in one ``write`` and one ``readinto`` call
(``raw_whole``) or in calls of 1 MiB (``raw_chunked``: on this machine's virtual disk a
cold 16 MB file reads back in 1 MiB calls in about 0.7 of the time one call takes, where
128 MB read in one call is the faster); ``raw_ms`` is the faster of the two by median
(``raw_variant`` names it) and ``switch_over_raw`` the switch's ratio to it.  Both
switches also clear the rest of the heap (activations, gradients, workspace:
``memset_bytes``), which the raw side does not: that is part of what a switch costs.
The clearing is timed as a side of its own (``clear_ms``: a memset of as many bytes),
and ``switch_over_raw_and_clear`` is the switch over the raw side and the clearing
together (the sum of their medians), which leaves the switch's own overhead.  Each
sample times as many back-to-back calls as make the raw side (``raw_whole`` for the
files) last about 20 ms, the same count for every side.  Besides the medians, each
side's fastest sample (``*_ms_min``, ``switch_over_raw_min``): the disk of a shared
machine spreads the cold samples by 2x and more, and the fastest is the least
disturbed.  The sides use one library (numpy, or CuPy on the GPU) and the same folder,
so they share a process, as ``bench/switching.py``'s do; their order rotates so that
none always follows another's writes.

``--device gpu`` (or ``all``, the default, where CuPy sees a device) runs the same cases
on the GPU backend; without CuPy or a device the ``gpu`` key says why it was skipped.

    python bench/switch_cost.py --json
    python bench/switch_cost.py --json --quick   # 1 MB and 16 MB, 3 samples
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._sides import calls_per_sample, timed
from engine import VM, Adam, Program, compile_graph
from engine.models import paper_mlp

TARGETS = (1 << 20, 16 << 20, 128 << 20)
BATCH = 64
MODES = ("memory", "file_warm", "file_cold")
CHUNK = 1 << 20  # the raw side's chunked variant: 1 MiB a call


def state_bytes(prog: Program) -> int:
    """What a switch keeps of a model that owes the optimizer no gradients."""
    return int(prog.state_bytes + prog.zone_bytes["optimizer"])


def program_near(target: int, device: str) -> tuple[Program, int]:
    """The paper's MLP (784-h-h-10, Adam) whose state is closest to ``target`` bytes."""
    def prog(h: int) -> Program:
        return compile_graph(paper_mlp((784, h, h, 10)), batch_size=BATCH,
                             optimizer=Adam(lr=1e-3), device=device)
    lo, hi = 1, 2
    while state_bytes(prog(hi)) < target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if state_bytes(prog(mid)) < target else (lo, mid)
    best = min((lo, hi), key=lambda h: abs(state_bytes(prog(h)) - target))
    return prog(best), best


def train(vm: VM, steps: int = 2) -> None:
    """A few Adam steps on random data: the moments are then no longer zeros, as a
    paused trial's are not (a file of zeros might be cheaper to store than this one)."""
    rng = np.random.default_rng(0)
    for _ in range(steps):
        vm.set("x", rng.standard_normal((BATCH, 784)).astype(np.float32))
        vm.set("y", rng.integers(0, 10, BATCH).astype(np.int64))
        vm.train_step("train")


def settle(path: str, cold: bool) -> None:
    """After a write, on both sides alike: in cold mode, the file's bytes on the disk
    (fsync) and out of the page cache, so that the read that follows comes from disk."""
    if not cold:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident(path: str) -> int | None:
    """Bytes of ``path`` in the page cache, as ``fincore`` says (None without it)."""
    if not shutil.which("fincore"):
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                         capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.strip() else None


def write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def read_all(f: Any, view: memoryview) -> None:
    while view:
        got = f.readinto(view)
        if not got:
            raise EOFError("file cut short")
        view = view[got:]




def compare(sides: dict[str, Callable[[], Any]], sync: Callable[[], None],
            repeats: int, pace: str) -> dict[str, Any]:
    """The sides, interleaved, the order rotated every sample, each sample as many
    calls as make side ``pace`` last ~20 ms: per side its median (``NAME_ms``), its
    fastest sample (``NAME_ms_min``) and every sample."""
    for _ in range(2):  # warm up: bindings, page faults, the pinned buffers
        for fn in sides.values():
            fn()
    k = calls_per_sample(sides[pace], sync)
    runs: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides.items())
    for i in range(repeats):
        j = i % len(order)
        for name, fn in order[j:] + order[:j]:
            runs[name].append(timed(fn, sync, k))
    out: dict[str, Any] = {}
    for name, v in runs.items():
        out[f"{name}_ms"] = round(statistics.median(v), 4)
        out[f"{name}_ms_min"] = round(min(v), 4)
    out["calls_per_sample"] = k
    out.update({f"{name}_ms_samples": [round(x, 4) for x in v] for name, v in runs.items()})
    return out


def ratios(r: dict[str, Any], variants: tuple[str, ...]) -> dict[str, Any]:
    """``raw_ms``: the fastest of the raw ``variants`` by median (named in
    ``raw_variant``), and the switch's ratios to it, with and without the clearing."""
    best = min(variants, key=lambda v: r[f"{v}_ms"])
    raw, low = r[f"{best}_ms"], min(r[f"{v}_ms_min"] for v in variants)
    both = raw + r["clear_ms"]
    return {"raw_variant": best, "raw_ms": raw, "raw_ms_min": low,
            "raw_and_clear_ms": round(both, 4),
            "switch_over_raw": round(r["switch_ms"] / raw, 3),
            "switch_over_raw_min": round(r["switch_ms_min"] / low, 3),
            "switch_over_raw_and_clear": round(r["switch_ms"] / both, 3)}


class Raw:
    """The raw side: the bytes of ``content`` in a buffer (host, or device) moved to a
    host buffer or a file and back, as a user writes it with numpy or CuPy; ``rest``:
    the bytes :meth:`clear` clears."""

    def __init__(self, device: str, content: np.ndarray, rest: int) -> None:
        n = self.n = int(content.nbytes)
        if device == "gpu":
            import cupy
            import cupyx

            self.cp = cupy
            self.src: Any = cupy.asarray(content)
            self.host = cupyx.empty_pinned(n, dtype=np.uint8)
            self.rest: Any = cupy.zeros(rest, dtype=np.uint8)
        else:
            self.cp = None
            self.src = content.copy()
            self.host = np.empty(n, dtype=np.uint8)
            self.rest = np.zeros(rest, dtype=np.uint8)
        self.host.fill(1)

    def sync(self) -> None:
        if self.cp is not None:
            self.cp.cuda.get_current_stream().synchronize()

    def clear(self) -> None:
        """The memset a switch does of the rest of the heap (``memset_bytes``)."""
        self.rest.fill(0)

    def memory(self) -> None:
        """Out to host memory and back in."""
        if self.cp is None:
            np.copyto(self.host, self.src)
            np.copyto(self.src, self.host)
        else:
            self.src.get(out=self.host)  # blocking: the bytes are on the host after it
            self.src.set(self.host)

    def file(self, path: str, cold: bool, chunk: int | None = None) -> None:
        """Out to a new file and back in, then the file removed: straight from and into
        the buffer on the CPU, through pinned memory from and to a device buffer; in one
        ``write`` and one ``readinto`` call, or in calls of ``chunk`` bytes."""
        if self.cp is not None:
            self.src.get(out=self.host)
            buf = self.host
        else:
            buf = self.src
        view = memoryview(buf).cast("B")
        step = chunk or self.n
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for a in range(0, self.n, step):
                write_all(fd, view[a : a + step])
        finally:
            os.close(fd)
        settle(path, cold)
        with open(path, "rb", buffering=0) as f:
            for a in range(0, self.n, step):
                read_all(f, view[a : a + step])
        os.unlink(path)
        if self.cp is not None:
            self.src.set(self.host)
        self.sync()


def case(target: int, repeats: int, device: str, folder: str,
         modes: tuple[str, ...]) -> dict[str, Any]:
    prog, hidden = program_near(target, device)
    vm = VM(prog, seed=0)
    train(vm)
    sync = vm.backend.synchronize
    kept = state_bytes(prog)
    st = vm.save_state()
    path = os.path.join(folder, f"switch-{device}-{hidden}.state")
    raw_path = os.path.join(folder, f"raw-{device}-{hidden}.bin")
    file_bytes = vm.write_state(path)
    with open(path, "rb") as f:  # the raw side moves these very bytes
        stream = np.frombuffer(f.read(), dtype=np.uint8)
    os.unlink(path)
    state = np.concatenate([np.asarray(st.forward), np.asarray(st.optimizer)])
    out: dict[str, Any] = {
        "target_bytes": target, "hidden": hidden, "state_bytes": kept,
        "heap_bytes": int(prog.total_bytes), "file_bytes": int(file_bytes),
        "memset_bytes": int(prog.total_bytes) - kept}
    rest = int(prog.total_bytes) - kept
    if "memory" in modes:
        raw = Raw(device, state, rest)

        def switch_memory() -> None:
            vm.save_state(into=st)
            vm.load_state(st)

        got = compare({"switch": switch_memory, "raw": raw.memory, "clear": raw.clear},
                      sync, repeats, pace="raw")
        out["memory"] = {**got, **ratios(got, ("raw",))}
        del raw
    for mode in ("file_warm", "file_cold"):
        if mode not in modes:
            continue
        cold = mode == "file_cold"
        raw = Raw(device, stream, rest)

        def switch_file(cold: bool = cold) -> None:
            vm.write_state(path)
            settle(path, cold)
            vm.read_state(path)
            os.unlink(path)

        def raw_whole(raw: Raw = raw, cold: bool = cold) -> None:
            raw.file(raw_path, cold)

        def raw_chunked(raw: Raw = raw, cold: bool = cold) -> None:
            raw.file(raw_path, cold, CHUNK)

        got = compare({"switch": switch_file, "raw_whole": raw_whole,
                       "raw_chunked": raw_chunked, "clear": raw.clear},
                      sync, repeats, pace="raw_whole")
        out[mode] = {**got, **ratios(got, ("raw_whole", "raw_chunked"))}
        if cold:
            vm.write_state(path)
            settle(path, True)
            out[mode]["cold_resident_bytes"] = resident(path)
        del raw
    for p in (path, raw_path):
        if os.path.exists(p):
            os.unlink(p)
    return out


def gpu_missing() -> str | None:
    """Why the GPU cases cannot run here (None: they can)."""
    try:
        import cupy
    except ImportError as e:
        return f"cupy is not installed ({e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # any CUDA error: no usable device
        return f"cupy sees no CUDA device ({type(e).__name__}: {e})"
    return None if n > 0 else "cupy sees no CUDA device"


def filesystem(folder: str) -> str | None:
    """The type of the file system ``folder`` is on (from /proc/mounts)."""
    real, best, kind = os.path.realpath(folder), "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and (real == parts[1] or
                                       real.startswith(parts[1].rstrip("/") + "/")) \
                        and len(parts[1]) >= len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=9, help="samples per side (median)")
    ap.add_argument("--device", default="all", choices=["cpu", "gpu", "all"],
                    help="all: the CPU, and the GPU where CuPy sees one")
    ap.add_argument("--dir", default=None,
                    help="folder for the files (default: the system's temporary folder)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1 MB and 16 MB, 3 samples")
    args = ap.parse_args()
    modes = tuple(m for m in args.modes.split(",") if m)
    if unknown := set(modes) - set(MODES):
        ap.error(f"unknown modes {sorted(unknown)}")
    targets = TARGETS[:2] if args.quick else TARGETS
    repeats = 3 if args.quick else args.repeats
    base = args.dir or tempfile.gettempdir()
    out: dict[str, Any] = {
        "repeats": repeats, "modes": list(modes), "cores": os.cpu_count(),
        "machine": platform.machine(), "python": platform.python_version(),
        "numpy": np.__version__, "dir": base, "filesystem": filesystem(base)}
    devices = ["cpu", "gpu"] if args.device == "all" else [args.device]
    for device in devices:
        why = gpu_missing() if device == "gpu" else None
        if why is not None:
            out[device] = {"skipped": why}
            continue
        with tempfile.TemporaryDirectory(dir=base, prefix="switch_cost.") as folder:
            out[device] = {"cases": [case(t, repeats, device, folder, modes)
                                     for t in targets]}
    if args.json:
        print(json.dumps(out))
        return
    for device in devices:
        got = out[device]
        if "skipped" in got:
            print(f"{device}: skipped: {got['skipped']}")
            continue
        for c in got["cases"]:
            line = f"{device} {c['state_bytes']:>12,} B state"
            for m in modes:
                r = c[m]
                line += (f"  {m} {r['switch_ms']:.3f}/{r['raw_ms']:.3f} ms "
                         f"({r['switch_over_raw']:.2f}x)")
            print(line)


if __name__ == "__main__":
    main()
