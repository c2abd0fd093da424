"""The four heap zones of the CalcGraph paper, by name.  A program's buffers each live
in one zone; the heap allocates each zone as one contiguous block."""

from __future__ import annotations

FORWARD, GRADIENT, OPTIMIZER, WORKSPACE = "forward", "gradient", "optimizer", "workspace"
ZONES = (FORWARD, GRADIENT, OPTIMIZER, WORKSPACE)
