"""BestOf, the online kernel selector (the auto-tuner PyDTNN integrates: alternatives
cycled during real execution, grouped and nested selections).

The op table registers kernel variants (:class:`~engine.ops._base.Variant`); the
compiler, with ``autotune=True`` (or ``ENGINE_AUTOTUNE=1``), marks each instruction
where more than one applies and the user fixed none, sizes its workspace for the
largest of them, and groups the instructions of a parameter whose variants declare a
layout (:mod:`engine.compile.tunable`).  A VM of such a program tunes during its first
real steps (:class:`Tuner`): each decision cycles through its options, times them,
keeps the best median and freezes — the winners' steps are then bound directly, with
nothing in between — and persists them (:class:`DecisionCache`), keyed by problem,
device and library versions, so the next run and every worker start tuned.

``VM(program, tune=False)`` (or ``ENGINE_AUTOTUNE=0``) runs a tunable program's default
variants instead: results then do not depend on timings.
"""

from engine.autotune._settings import ENV, autotune_enabled, autotune_refused
from engine.autotune.cache import DecisionCache, cache_dir
from engine.autotune.keys import ENGINE_VERSION, decision_key, problem, versions
from engine.autotune.tuner import CALLS, PRUNE, ROUNDS, Decision, Probe, Tuner

__all__ = [
    "CALLS",
    "ENGINE_VERSION",
    "ENV",
    "PRUNE",
    "ROUNDS",
    "Decision",
    "DecisionCache",
    "Probe",
    "Tuner",
    "autotune_enabled",
    "autotune_refused",
    "cache_dir",
    "decision_key",
    "problem",
    "versions",
]
