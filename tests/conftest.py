"""Test-session settings shared by every test."""

from __future__ import annotations

import os
import tempfile

# The constants a run measures (explore.scheduler.constants) are remembered per machine;
# tests keep theirs apart from the user's cache, in one folder for the session, which
# the subprocesses they start inherit.
os.environ.setdefault("EXPLORE_CACHE_DIR", tempfile.mkdtemp(prefix="explore-test-cache-"))
