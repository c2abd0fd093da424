"""Byte alignment: every buffer, zone and arena slice starts on a 64-byte boundary
(a cache line, and more than any SIMD load or cuBLAS needs).

>>> align_up(1), align_up(64), align_up(65), align_down(127)
(64, 64, 128, 64)
"""

from __future__ import annotations

ALIGN = 64


def align_up(n: int, a: int = ALIGN) -> int:
    """The smallest multiple of ``a`` that is at least ``n``."""
    return -(-int(n) // a) * a


def align_down(n: int, a: int = ALIGN) -> int:
    """The largest multiple of ``a`` that is at most ``n``."""
    return int(n) // a * a
