"""Where the ``explore`` command writes and how it ends: its two consoles, its exit
statuses and :func:`fail`.

The commands print through ``console.out`` and ``console.err`` (the attributes, looked
up at each call), so that a test can swap a console for one of another width.
"""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console
from rich.markup import escape

EXIT_USAGE = 2
# The run did not do its work: it began and could not go on (a failed write), or every
# trial it ran failed (explore run's help lists every status).
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a process ended by SIGINT
err = Console(stderr=True, soft_wrap=True)  # whole lines: paths stay copyable
out = Console()


def fail(message: str) -> NoReturn:
    """Report bad input on stderr and exit with status 2."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    sys.exit(EXIT_USAGE)
