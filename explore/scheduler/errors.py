"""What stops a run before it can search."""

from __future__ import annotations


class SchedulerError(Exception):
    """The run cannot start (a budget too small for its workers, a worker that does not
    start, ...)."""
