"""A worker process: one arena for its life, trials switched in and out of it.

The scheduler starts workers with the ``spawn`` method.  A worker maps the shared
data set (no copy on the CPU), measures its own fixed overhead and reports it, then
allocates its arena once, of the size the scheduler sends.  From then on it hosts
the trials the scheduler places in it, each in its own region of the arena (their
heaps are packed side by side), and runs them a round at a time, depth first (the
trial furthest along goes on; the others wait, ready, in their regions).  After each
round it reports the validation metrics and goes straight on with the same trial:
the pruner's answer comes back soon, and a "stop" ends the round it interrupts within
``engine.runtime.train.STOP_EVERY`` mini-batches: the worker never idles waiting for
it.  A *gated* trial (one the pruner may pause at a rung) instead waits for "continue"
after each report; "pause" tells it that the trial waits at a rung, so the worker
starts a trial not yet begun in the meantime.

One job per module:

- :mod:`.process`: the process's entry point, tied to the driver's life;
- :mod:`.serve`: the conversation with the scheduler (:func:`main`): greeting, arena,
  then each message carried out as it comes;
- :mod:`.residents`: the arena and the trials resident in it, their coming and going;
- :mod:`.rounds`: one round of a resident and its report;
- :mod:`.switching`: a trial switched out to its file and back in;
- :mod:`.validation`: the metrics a round measures, and divergence;
- :mod:`.device`: the warm-up and the overhead measured after it.

Messages: :mod:`explore.scheduler.protocol`; the scheduler's side:
:mod:`explore.scheduler.core` and :mod:`explore.scheduler.loop`.  None of these modules
imports the scheduler's side (Optuna, the study): a worker's memory is charged to the
budget, and that would add to it.
"""

from explore.scheduler.worker.device import device_overhead, release_heap_memory, warm_up
from explore.scheduler.worker.process import JIT_DEFAULT, process_main, stay_with_the_driver
from explore.scheduler.worker.residents import ArenaHost, Resident
from explore.scheduler.worker.serve import main
from explore.scheduler.worker.switching import clock_of, clock_text
from explore.scheduler.worker.validation import Validation, diverged

__all__ = ["JIT_DEFAULT", "ArenaHost", "Resident", "Validation", "clock_of", "clock_text",
           "device_overhead", "diverged", "main", "process_main", "release_heap_memory",
           "stay_with_the_driver", "warm_up"]
