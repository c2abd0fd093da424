"""Whether auto-tuning is on: an argument, else the ``ENGINE_AUTOTUNE`` environment
variable (off when unset, so a default compile is deterministic to the bit)."""

from __future__ import annotations

import os

ENV = "ENGINE_AUTOTUNE"
_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def autotune_enabled(flag: bool | None = None) -> bool:
    """``flag`` if given, else whether ``$ENGINE_AUTOTUNE`` says on (``1``, ``on``...)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get(ENV, "").strip().lower() in _ON


def autotune_refused() -> bool:
    """Whether ``$ENGINE_AUTOTUNE`` says off explicitly: a VM then runs even a tunable
    program's default variants."""
    return os.environ.get(ENV, "").strip().lower() in _OFF
