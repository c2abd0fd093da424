"""The error every dataset raises."""

from __future__ import annotations


class DataError(Exception):
    """A dataset is missing, corrupt or malformed.  ``key`` names the option of the
    search space's ``dataset:`` section at fault (``path``, ``target``, ``valid``...)
    when there is one, so that :func:`explore.space.load_space` can point at its line."""

    def __init__(self, message: str = "", key: str | None = None) -> None:
        super().__init__(message)
        self.key = key
