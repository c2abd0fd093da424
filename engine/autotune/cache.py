"""Decisions persisted across runs: one JSON file, ``autotune.json``, in the engine's
cache directory (``$ENGINE_CACHE_DIR``, else ``$EXPLORE_CACHE_DIR``, else
``$XDG_CACHE_HOME/explore``, i.e. ``~/.cache/explore``: the directory the explorer
already uses, found without importing it).

Written atomically (a temporary file in the same directory, then a rename) after
merging with what is there, so workers that tune at the same time lose nothing but a
simultaneous write of the same key.  A damaged file is ignored with a warning and
rewritten whole at the next save; a directory that cannot be written is skipped with a
warning (the next run tunes again).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

FILE = "autotune.json"
FORMAT = 1


def cache_dir() -> Path:
    """``$ENGINE_CACHE_DIR``, ``$EXPLORE_CACHE_DIR`` or ``$XDG_CACHE_HOME/explore``."""
    root = os.environ.get("ENGINE_CACHE_DIR") or os.environ.get("EXPLORE_CACHE_DIR") or \
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                     "explore")
    return Path(root)


class DecisionCache:
    """Decisions by key (:func:`engine.autotune.keys.decision_key`): an entry is
    ``{"choice": variant, "ms": {option: milliseconds}}``."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else cache_dir() / FILE
        self.entries = self._read(warn=True)
        self._new: dict[str, dict[str, Any]] = {}

    def _read(self, warn: bool) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as e:
            if warn:
                warnings.warn(f"autotune cache {self.path} cannot be read ({e}): tuning "
                              "from scratch", RuntimeWarning, stacklevel=3)
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT or \
                    not isinstance(data.get("decisions"), dict):
                raise ValueError("not an autotune cache of format 1")
            entries = data["decisions"]
            for key, entry in entries.items():
                if not isinstance(entry, dict) or not isinstance(entry.get("choice"), str):
                    raise ValueError(f"entry {key[:60]!r}... has no choice")
            return entries
        except ValueError as e:
            if warn:
                warnings.warn(f"autotune cache {self.path} is damaged ({e}): ignored, and "
                              "rewritten at the next save", RuntimeWarning, stacklevel=3)
            return {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        self.entries[key] = entry
        self._new[key] = entry

    def save(self) -> None:
        """Merge the new decisions into the file, atomically."""
        if not self._new:
            return
        table = self._read(warn=False)
        table.update(self._new)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".autotune-")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"format": FORMAT, "decisions": table}, f, indent=1,
                              sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as e:
            warnings.warn(f"autotune cache {self.path} cannot be written ({e}): the next "
                          "run tunes again", RuntimeWarning, stacklevel=2)
            return
        self.entries = table
        self._new.clear()
