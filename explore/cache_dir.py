"""Where explore keeps what it can measure or derive again: ``$EXPLORE_CACHE_DIR``, else
``$XDG_CACHE_HOME/explore`` (``~/.cache/explore``).  Everything there may be deleted at
any time; it imports nothing of explore, so any layer may use it.

>>> import os
>>> saved = {k: v for k, v in os.environ.items() if k == "EXPLORE_CACHE_DIR"}
>>> os.environ["EXPLORE_CACHE_DIR"] = "/tmp/explore-cache"
>>> str(cache_root())
'/tmp/explore-cache'
>>> _ = os.environ.pop("EXPLORE_CACHE_DIR"); os.environ.update(saved)
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$EXPLORE_CACHE_DIR`` or ``$XDG_CACHE_HOME/explore`` (``~/.cache/explore``)."""
    return Path(os.environ.get("EXPLORE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "explore"))
