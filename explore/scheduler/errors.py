"""What stops a run before it can search, and what stops it part way."""

from __future__ import annotations

import signal


class SchedulerError(Exception):
    """The run cannot start (a budget too small for its workers, a worker that does not
    start, ...)."""


class Stopped(KeyboardInterrupt):
    """The run was stopped by a signal: Ctrl-C (SIGINT), or SIGTERM and SIGHUP, which
    job schedulers (Kubernetes, SLURM, systemd) and a closed terminal send.  All three
    end a run alike (the trials in hand fail as interrupted and are queued again); a
    KeyboardInterrupt, so code that handles Ctrl-C handles them.

    >>> Stopped(signal.SIGTERM).exit_status, Stopped(signal.SIGTERM).name
    (143, 'SIGTERM')
    """

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """As a shell reports a process the signal ended: 128 + its number."""
        return 128 + self.signum


# The signals that stop a run as Ctrl-C does.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def raise_stopped(signum: int, frame: object) -> None:
    """A signal handler raising :class:`Stopped` where the signal lands (as Python's
    own SIGINT handler raises KeyboardInterrupt): for the phases of a command before
    the scheduler runs, which it stops between steps instead."""
    raise Stopped(signum)
