"""The error every dataset raises, and how its messages list names."""

from __future__ import annotations

from collections.abc import Sequence


class DataError(Exception):
    """A dataset is missing, corrupt or malformed.  ``key`` names the option of the
    search space's ``dataset:`` section at fault (``path``, ``target``, ``valid``...)
    when there is one, so that :func:`explore.space.load_space` can point at its line."""

    def __init__(self, message: str = "", key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def listing(names: Sequence[str]) -> str:
    """Column or array names for a message: the first 30, then how many in all.

    >>> listing(["a", "b"])
    'a, b'
    """
    return ", ".join(map(str, names[:30])) + (f", ... ({len(names)} in all)"
                                               if len(names) > 30 else "")
