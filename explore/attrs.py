"""Every attribute explore stores in an Optuna study, by name, and the typed record a
trial keeps: what a reader of a study (``explore show``, ``export``, the dashboard, a
notebook, another driver) may rely on.

A study's own attributes (``study.user_attrs`` and system attributes) say how it was
run and what it kept; a trial's say who ran it and what it cost.  The names are here
and nowhere else, so that the writers and the readers cannot drift apart.

>>> sorted(TrialRecord.__annotations__)[:4]
['arena_offset', 'batch_size', 'busy_s', 'compiled_batch']
"""

from __future__ import annotations

from typing import Any, TypedDict

# -- a trial's user attributes -----------------------------------------------------------
PARAMS_ATTR = "params"  # the full parameters (per-layer lists) of a trial
RECORD_ATTR = "explore"  # everything a trial records (TrialRecord)
REQUEUED_FROM = "requeued_from"  # the trial a re-queued one repeats
CLAIM_ATTR = "explore_claim"  # the driver that claimed a trial (explore.live.driver_name)
# A stale trial's verdict, written by the driver that fails it before it writes the
# record and the state: fail_reason, retried, failed_by, and the driver it condemns.  The
# trial's own driver never writes it, so it survives that driver's record written over
# the verdict's copy in the record (explore.live.names.final_record).
STALE_ATTR = "explore_stale"
# Numbers of a placed trial's record also stored as user attributes of their own (record
# key -> attribute): what a dashboard shows of a running trial at a glance, its planned
# heap bytes first (optuna-dashboard lists attributes by name), batch and placement.
FLAT = {"total_bytes": "bytes_planned", "batch_size": "batch_size", "worker": "worker",
        "device_index": "device_index"}

# -- a study's user attributes -----------------------------------------------------------
DATA_ATTR = "data"  # what a model of the study takes and gives (explore.runner.data_record)
BUILDER_DIR_ATTR = "builder_dir"  # where its model builder imports from
SPACE_ATTR = "space"  # the space it was run with (JSON)
CHANGES_ATTR = "space_changes"  # the changes of the space runs declared meant
RUNS_ATTR = "runs"  # each run's budget, constants and figures (RunStats.as_record)
MODELS_ATTR = "models"  # the kept models, best first
ARTIFACTS_ATTR = "artifacts"  # the artifact store's directory
REFIT_ATTR = "refit"  # a study's refit model: trial, rounds, rows, test metrics, artifact

# -- a study's system attributes, one per driver -----------------------------------------
HEARTBEAT_PREFIX = "explore:heartbeat:"  # + the driver's name: its last heartbeat
STORAGE_TIME_PREFIX = "explore:storage-time:"  # + the driver's name: its StorageTime


class TrialRecord(TypedDict, total=False):
    """A trial's record (its ``explore`` user attribute), written when it is claimed,
    placed and ended; a key is there once what it says is known."""

    # who runs it (explore.live)
    driver: str
    host: str
    pid: int
    device: str
    requeued_from: int
    # where it was placed and what it costs (explore.scheduler)
    planned_bytes: dict[str, int]  # by heap zone
    total_bytes: int
    batch_size: int
    compiled_batch: int
    kernels: str  # the worker's: "numpy" or "compiled" (explore.scheduler.kernels)
    worker: int
    device_index: int
    arena_offset: int
    placed_at: float  # seconds since the run began
    stack: dict[str, Any]  # models, model, trials: a stacked trial's stack
    moves: list[dict[str, Any]]  # a stack's member moved into new programs
    params: dict[str, Any]  # the full parameters (per-layer lists), as PARAMS_ATTR
    model: str  # the kept model's artifact id (explore.keeper)
    # how it went
    start: float | None
    end: float
    rounds: int | None
    pauses: int
    switches: int
    # switched out of its worker's arena to a file while paused (explore.scheduler.core)
    switched_out: int  # times it left an arena
    switch_bytes: int  # bytes of state written out, in all
    out_spans: list[list[float]]  # [left, back] seconds since the run began
    busy_s: float
    train_seconds: float
    valid_seconds: float  # of its seconds, validating
    flops: int  # model FLOPs of its rounds (explore.utilisation.round_flops)
    metrics: dict[str, float]
    # how it ended, when not on its own
    pruned: str  # why (explore.scheduler.core.endings): by the pruner, paused and not
    # promoted, or for room
    fail_reason: str
    started: bool  # whether a worker had begun it
    retried: bool  # failed by a death or Ctrl-C: queued again, not counted
    failed_by: str  # the driver that found it stale
    model_error: str  # its model could not be kept (the values stand)
