"""Ctrl-C, SIGTERM and SIGHUP during a run: the first is noted, for the loop to act on
between steps (raised anywhere, it broke storage writes half way); a second ends the
process at once, after removing what must not outlive it."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from explore.scheduler.errors import STOP_SIGNALS


class StopFlag:
    """Whether a stop signal came, and which (``signum``)."""

    def __init__(self) -> None:
        self.set = False
        self.signum = int(signal.SIGINT)


def catch_stop_signals(flag: StopFlag, last_words: Callable[[], Any]) -> Callable[[], None]:
    """Route the stop signals to ``flag``; a second one calls ``last_words`` (errors
    ignored) and exits with 128 + its number.  Returns what puts the previous handlers
    back.  Off the main thread, where Python delivers no signal, nothing changes.

    >>> restore = catch_stop_signals(StopFlag(), lambda: None)
    >>> restore()
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        if flag.set:  # no time to clean up: but the last words, at least
            with contextlib.suppress(Exception):
                last_words()
            os._exit(128 + signum)
        flag.set, flag.signum = True, signum

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore
