"""What an unknown name likely meant ("did you mean ...?"): the close ones by spelling
(:func:`difflib.get_close_matches`), or the one a table of synonyms gives, since no
spelling distance finds ``lr`` from ``learning_rate``.

Used by the search-space schema for unknown keys (:func:`explore.space.parse_space`)
and by the metrics' registry for an unknown metric name.

>>> close("round", ["trials", "rounds", "memory"])
['rounds']
>>> did_you_mean("Acuracy", ["accuracy", "loss"])
"; did you mean 'accuracy'?"
>>> did_you_mean("auc", ["accuracy", "roc_auc"], synonyms={"auc": "roc_auc"})
"; did you mean 'roc_auc'?"
>>> did_you_mean("zzz", ["accuracy", "loss"])
''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

CUTOFF = 0.6  # difflib's default: "round" finds "rounds", "auc" finds "roc_auc"
MOST = 3  # at most this many suggestions


def close(word: str, names: Iterable[str]) -> list[str]:
    """The names closest to ``word`` in spelling, best first (case ignored), at most
    :data:`MOST`."""
    by_lower: dict[str, str] = {}
    for n in names:
        by_lower.setdefault(n.lower(), n)
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=MOST, cutoff=CUTOFF)
    return [by_lower[f] for f in found]


def quoted(names: Iterable[str]) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``.

    >>> quoted(["a"]), quoted(["a", "b", "c"])
    ("'a'", "'a', 'b' or 'c'")
    """
    q = [repr(n) for n in names]
    return q[0] if len(q) == 1 else f"{', '.join(q[:-1])} or {q[-1]}"


def did_you_mean(word: object, names: Iterable[str],
                 synonyms: Mapping[str, str] | None = None) -> str:
    """``"; did you mean 'x'?"`` for an unknown ``word`` (a synonym's name first, then
    the close spellings among ``names``), or ``""`` when nothing is near: a message
    goes on to list every name then."""
    if not isinstance(word, str):
        return ""
    names = list(names)
    meant = (synonyms or {}).get(word.lower())
    found = [meant] if meant is not None and meant in names else close(word, names)
    return f"; did you mean {quoted(found)}?" if found else ""
