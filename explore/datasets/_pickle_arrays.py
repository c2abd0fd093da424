"""A reader for pickles that hold only numpy arrays (tuples of them), streamed: the
large arrays are read a chunk of rows at a time and only the rows asked for are kept,
converted on the way (to exact uint8 pixels), so loading MNIST's 5,000 first images
takes 4 MB, not the 220 MB of the whole float32 file plus its pickled copy.

It is a small pickle machine of its own rather than :class:`pickle.Unpickler`, whose
C implementation reads each string whole before anything can look at it.  It knows
the opcodes that numpy arrays in tuples are pickled with (Python 2's protocol 2, whose
strings are read as latin-1, and protocols 3 and 4), builds only ``numpy.ndarray``
and ``numpy.dtype`` objects, and refuses anything else by name, so a tampered file
cannot run code.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from explore.datasets.errors import DataError

ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}
STREAM_BYTES = 1 << 20  # strings larger than this are array data, streamed
SMALL_BYTES = 16 << 20  # all the small strings of a file together, at most
CHUNK_BYTES = 4 << 20  # read this much array data at a time

class Reader(Protocol):
    """What is read from: a binary file (a gzip one, say)."""

    def read(self, n: int = ..., /) -> bytes: ...

    def readline(self, n: int = ..., /) -> bytes: ...

    def readinto(self, b: Any, /) -> int: ...


# A large array's data, as the caller wants it: (index among large arrays, shape, dtype,
# the stream, its byte count) -> the array kept (the caller reads exactly that many bytes).
Stream = Callable[[int, tuple[int, ...], np.dtype, Reader, int], np.ndarray]


class _Mark:
    pass


class _Reconstruct:
    """An array being unpickled: ``_reconstruct(...)`` then ``BUILD`` with its state."""


class _Global:
    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class _Streamed:
    """Array data already read (and converted) from the stream."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


def load_arrays(f: Reader, stream: Stream, where: str = "the pickle") -> Any:
    """Unpickle ``f`` (a file of numpy arrays in tuples), handing each large array's data
    to ``stream`` as it comes."""
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    small = 0
    streamed = 0

    def read(n: int) -> bytes:
        b = f.read(n)
        if len(b) != n:
            raise DataError(f"{where}: truncated")
        return b

    def string(n: int, text: bool) -> Any:
        nonlocal small, streamed
        if n > STREAM_BYTES:
            if len(stack) < 3 or not isinstance(stack[-2], np.dtype) or \
                    not isinstance(stack[-3], tuple):
                raise DataError(f"{where}: a {n:,}-byte string that is not array data")
            shape, dtype = stack[-3], stack[-2]
            if any(not isinstance(d, int) or d < 0 for d in shape) or \
                    int(np.prod(shape)) * dtype.itemsize != n:
                raise DataError(f"{where}: array data of {n:,} bytes for shape {shape} "
                                f"of {dtype}")
            out = _Streamed(stream(streamed, shape, dtype, f, n))
            streamed += 1
            return out
        small += n
        if small > SMALL_BYTES:
            raise DataError(f"{where}: more than {SMALL_BYTES:,} bytes of small strings")
        b = read(n)
        return b.decode("latin-1") if text else b

    def pop_mark() -> list[Any]:
        if not marks:
            raise DataError(f"{where}: unbalanced MARK")
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    while True:
        op = read(1)
        if op == b"\x80":  # PROTO
            read(1)
        elif op in (b"\x95",):  # FRAME (protocol 4): its length only
            read(8)
        elif op == b"c":  # GLOBAL
            module, name = (line(f, where) for _ in range(2))
            if (module, name) not in ALLOWED:
                raise DataError(f"refusing to unpickle {module}.{name}: only numpy arrays "
                                f"are read")
            stack.append(_Global(module, name))
        elif op == b"\x93":  # STACK_GLOBAL
            name, module = stack.pop(), stack.pop()
            if (module, name) not in ALLOWED:
                raise DataError(f"refusing to unpickle {module}.{name}: only numpy arrays "
                                f"are read")
            stack.append(_Global(module, name))
        elif op == b"q":  # BINPUT
            memo[read(1)[0]] = stack[-1]
        elif op == b"r":  # LONG_BINPUT
            memo[struct.unpack("<I", read(4))[0]] = stack[-1]
        elif op == b"\x94":  # MEMOIZE
            memo[len(memo)] = stack[-1]
        elif op == b"h":  # BINGET
            stack.append(memo[read(1)[0]])
        elif op == b"j":  # LONG_BINGET
            stack.append(memo[struct.unpack("<I", read(4))[0]])
        elif op == b"(":  # MARK
            marks.append(len(stack))
        elif op == b"J":  # BININT
            stack.append(struct.unpack("<i", read(4))[0])
        elif op == b"K":  # BININT1
            stack.append(read(1)[0])
        elif op == b"M":  # BININT2
            stack.append(struct.unpack("<H", read(2))[0])
        elif op == b"t":  # TUPLE
            stack.append(tuple(pop_mark()))
        elif op == b")":  # EMPTY_TUPLE
            stack.append(())
        elif op in (b"\x85", b"\x86", b"\x87"):  # TUPLE1..3
            n = op[0] - 0x84
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif op == b"U":  # SHORT_BINSTRING (Python 2 str)
            stack.append(string(read(1)[0], text=True))
        elif op == b"T":  # BINSTRING
            stack.append(string(struct.unpack("<i", read(4))[0], text=True))
        elif op == b"C":  # SHORT_BINBYTES
            stack.append(string(read(1)[0], text=False))
        elif op == b"B":  # BINBYTES
            stack.append(string(struct.unpack("<I", read(4))[0], text=False))
        elif op == b"\x8c":  # SHORT_BINUNICODE
            stack.append(read(read(1)[0]).decode("utf-8"))
        elif op == b"X":  # BINUNICODE: a name or a dtype's code, never array data
            n = struct.unpack("<I", read(4))[0]
            if n > 256:
                raise DataError(f"{where}: a {n:,}-byte text where names are expected")
            stack.append(read(n).decode("utf-8"))
        elif op == b"N":
            stack.append(None)
        elif op == b"\x88":
            stack.append(True)
        elif op == b"\x89":
            stack.append(False)
        elif op == b"R":  # REDUCE
            args, fn = stack.pop(), stack.pop()
            if not isinstance(fn, _Global) or not isinstance(args, tuple):
                raise DataError(f"{where}: a call of something not allowed")
            if fn.name == "_reconstruct":
                stack.append(_Reconstruct())
            elif fn.name == "dtype" and args and isinstance(args[0], str):
                stack.append(np.dtype(args[0]))
            else:
                raise DataError(f"{where}: refusing {fn.module}.{fn.name}{args!r:.60}")
        elif op == b"b":  # BUILD
            state, obj = stack.pop(), stack[-1]
            if isinstance(obj, np.dtype):
                if isinstance(state, tuple) and len(state) > 1 and state[1] in "<>|=":
                    stack[-1] = obj.newbyteorder(state[1]) if obj.itemsize > 1 else obj
            elif isinstance(obj, _Reconstruct):
                stack[-1] = _array(state, where)
            else:
                raise DataError(f"{where}: BUILD of something not allowed")
            for k, v in memo.items():  # BUILD completes the object the memo holds
                if v is obj:
                    memo[k] = stack[-1]
        elif op == b".":  # STOP
            return stack.pop()
        else:
            raise DataError(f"{where}: pickle opcode {op!r} is not one numpy arrays use")


def line(f: Reader, where: str) -> str:
    """A GLOBAL's module or name: a line of at most 256 characters."""
    b = f.readline(256)
    if not b.endswith(b"\n"):
        raise DataError(f"{where}: truncated" if len(b) < 256 else f"{where}: a name too long")
    return b[:-1].decode("ascii", "replace")


def _array(state: Any, where: str) -> np.ndarray:
    if not (isinstance(state, tuple) and len(state) == 5):
        raise DataError(f"{where}: an array state of the wrong form")
    _, shape, dtype, fortran, data = state
    if fortran or not isinstance(dtype, np.dtype) or not isinstance(shape, tuple):
        raise DataError(f"{where}: only C-ordered arrays are read")
    if isinstance(data, _Streamed):
        return data.array
    raw = data.encode("latin-1") if isinstance(data, str) else data
    if len(raw) != int(np.prod(shape)) * dtype.itemsize:
        raise DataError(f"{where}: array data of {len(raw):,} bytes for shape {shape}")
    return np.frombuffer(raw, dtype).reshape(shape).astype(dtype.newbyteorder("="))
