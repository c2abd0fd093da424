"""The packing timeline that ``notebooks/analysis.ipynb`` draws: each trial's region of
its worker's arena over time, from the rows of :func:`explore.results.frame`.

A trial paused at a rung may have been switched out of its arena to a file while
another trial needed the room (``out_spans`` of its record): those spans are drawn
hatched and unfilled, as the arena did not hold the trial then.

>>> pieces(1.0, 9.0, [[2.0, 4.0], [6.0, 9.0]])
[(1.0, 2.0, False), (2.0, 4.0, True), (4.0, 6.0, False), (6.0, 9.0, True)]
>>> pieces(1.0, 9.0, [])
[(1.0, 9.0, False)]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

# how a span out of the arena is drawn: the trial's colour, hatched and unfilled
OUT_STYLE: dict[str, Any] = {"hatch": "////", "facecolor": "none", "alpha": 0.6,
                             "linewidth": 0.6}
IN_ALPHA = 0.6


def pieces(start: float, end: float, out_spans: Iterable[Sequence[float]] | None
           ) -> list[tuple[float, float, bool]]:
    """``[start, end]`` cut at the spans the trial was out of its arena: ``(from, to,
    out)`` in time order, empty pieces left out (spans are clipped to ``[start, end]``:
    a trial's ``start`` is its worker's stamp, a span's the scheduler's)."""
    cut: list[tuple[float, float, bool]] = []
    at = start
    for left, back in sorted((float(a), float(b)) for a, b in out_spans or []):
        left, back = max(left, at), min(back, end)
        if back <= left:
            continue
        if left > at:
            cut.append((at, left, False))
        cut.append((left, back, True))
        at = back
    if end > at:
        cut.append((at, end, False))
    return cut


def draw_trials(ax: Any, rows: Any) -> int:
    """Draw each trial of ``rows`` (a frame's rows of one worker, with ``start`` and
    ``end``) as its region of the arena (``arena_offset`` and ``total_bytes``, in MB)
    over time, in its own colour; its spans out of the arena hatched.  Returns how many
    spans out it drew."""
    drawn = 0
    for _, r in rows.iterrows():
        off = r["arena_offset"] if r["arena_offset"] == r["arena_offset"] else 0  # NaN: none
        band = (off / 1e6, r["total_bytes"] / 1e6)
        color = f"C{int(r['number']) % 10}"
        spans = r["out_spans"] if "out_spans" in r.index else None
        for a, b, out in pieces(r["start"], r["end"], spans if isinstance(spans, list)
                                else None):
            if out:
                ax.broken_barh([(a, b - a)], band, edgecolor=color, **OUT_STYLE)
                drawn += 1
            else:
                ax.broken_barh([(a, b - a)], band, alpha=IN_ALPHA, color=color)
    return drawn


def out_legend(ax: Any) -> None:
    """A legend entry saying what the hatched spans are."""
    from matplotlib.patches import Patch  # noqa: PLC0415 (the notebook's extra)

    ax.legend(handles=[Patch(edgecolor="0.3", label="switched out of the arena",
                             **OUT_STYLE)], loc="upper right", fontsize=8)
