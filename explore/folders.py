"""Folders a run will write into, checked before anything is written (the schema and
:func:`explore.runner.prepare` call this; it imports nothing of explore, so the schema
can use it without importing the keeper, which imports the study and so the schema)."""

from __future__ import annotations

import os
from pathlib import Path


def directory_problem(directory: str | Path) -> str | None:
    """Why the artifact store cannot live at ``directory`` (None: it can): it must be a
    directory, or one that can be made, and writable.  Checked before any study is
    written; nothing is left behind (a probe folder is made in the nearest existing
    one and removed at once: as root, permissions say nothing about /proc or /sys)."""
    try:
        path = Path(directory).resolve()
        probe_in = path
        while not probe_in.exists():
            if probe_in.is_symlink():  # a dangling link: mkdir would fail
                return f"{probe_in} is a link to nothing"
            probe_in = probe_in.parent
        if not probe_in.is_dir():
            return f"{probe_in} is not a directory" + \
                ("" if probe_in == path else f", so {path} cannot be made")
        probe = probe_in / f".explore-probe-{os.getpid()}-{id(path):x}"
        os.mkdir(probe)
        os.rmdir(probe)
    except (OSError, ValueError) as e:
        return f"{directory} cannot hold the kept models: {e.strerror or e}" \
            if isinstance(e, OSError) else f"{directory!r} is not a path: {e}"
    return None
