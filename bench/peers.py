"""Time to a good model: ``explore`` against the tools a user would pick instead, Optuna
with PyTorch and Ray Tune with PyTorch, on the same searches and the same machine.

Searches (each a shipped space; ``--trials``/``--rounds``/``--train``/``--valid``
shrink them alike for every side):
- ``paper_mlp``: ``search_spaces/paper_mnist.yaml``, the CalcGraph paper's MLP,
  optimizer, learning rate and init searched, 60 trials of 10 rounds;
- ``mnist_cnn``: ``search_spaces/cnn_mnist.yaml``, 1 to 3 convolution blocks with
  searched widths, kernels, batch norm and residuals, 30 trials of 3 rounds, median
  pruning;
- any other space file (``--searches my_space.yaml``, named by its file's stem) that a
  PyTorch twin can train: the built-in ``mlp`` or ``cnn`` family, one objective,
  accuracy maximised.  Anything else is refused before a side runs, saying why.

Sides, each in its own fresh process tree, alternating (``bench/_sides.py``); every one
asks its Optuna trial the questions explore asks (:func:`explore.sampling.suggest`)
with the same TPE sampler, and trains the same network (``bench/_torch_models.py``) on
the same rows, ``--workers`` trials at a time:
- ``explore``: the scheduler over the space at ``--memory``;
- ``optuna_njobs``: ``study.optimize(objective, n_jobs=W)`` in one process (PyTorch
  threads shared out among the jobs on a CPU);
- ``optuna_journal``: W processes on one study in a journal file, each one PyTorch
  thread on a CPU (on a GPU, each its own CUDA context);
- ``ray_tune``: ``Tuner`` with ``OptunaSearch`` (the same TPE) and ``ASHAScheduler``,
  a function trainable reporting each round, W trials at a time (one CPU each; on a GPU
  a 1/W share of it), the data passed once through ``tune.with_parameters``; usage
  reporting, the dashboard and Tune's result loggers off.
Both Optuna sides draw with the sampler and prune with the pruner explore builds for the
space (``explore.study``: TPE with its startup trials, the median pruner, successive
halving, Hyperband); Ray Tune always stops trials with ASHA, its recommended scheduler.
``optuna_torch`` in the answer is the better Optuna side (sooner to the target, then
sooner done).

Each side's clock starts once its data is loaded and its libraries imported: explore's
workers start while its data loads and its study opens, as ``explore run``'s do (only
what remains of their start is on its clock), Ray's clock includes starting Ray
(``ray.init``, also given alone as ``startup_s``), the journal's does not include
starting its processes.  So each side is also timed on a user's stopwatch, from its
launch (``launch_s`` before its clock: the interpreter's start, imports, data, and the
workers' or the journal's processes):
``time_to_target_from_launch_s``.  A finished trial (complete or pruned) is a point of
the anytime curve at its end, with the best validation accuracy it reported.  The target
of a search is 98% of the best accuracy any side reached in any repeat; a run's time to
target is its first finished trial at or over it (medians over repeats; a side whose
median run never got there reports null).  Memory is sampled from outside every 50 ms
over the side's whole process tree: PSS (``peak_pss_mb``) and, on a GPU, the device
memory NVML lists for those processes (``peak_gpu_mb``).

    python bench/peers.py --json                          # CPU, both searches
    python bench/peers.py --json --quick                  # a smoke run, under 2 minutes
    python bench/peers.py --json --device gpu --workers 4 --memory 8GB
    python bench/peers.py --json --png build/peers        # anytime curves as PNG too
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEARCHES = {"paper_mlp": "paper_mnist.yaml", "mnist_cnn": "cnn_mnist.yaml"}
SIDES = ("explore", "optuna_njobs", "optuna_journal", "ray_tune")
OPTUNA_SIDES = ("optuna_njobs", "optuna_journal")
TARGET_SHARE = 0.98
MB = 1_000_000


# ---------------------------------------------------------------- the searches' sizes
def space_file(search: str) -> str:
    """The space file of a search: a shipped one's (:data:`SEARCHES`), else the path
    given."""
    if search in SEARCHES:
        return os.path.join(ROOT, "search_spaces", SEARCHES[search])
    return os.path.abspath(search)


def search_name(search: str) -> str:
    """What the answer calls a search: its name, or its space file's stem."""
    return search if search in SEARCHES else os.path.splitext(os.path.basename(search))[0]


TWINS = ("mlp", "cnn")  # the families bench/_torch_models.py builds in PyTorch


def refusal(search: str) -> str | None:
    """Why the peers cannot run ``search`` (None: they can): an unknown name, a space
    that does not load, or one no PyTorch twin trains (another family or a builder of
    its own, several objectives, or an objective other than accuracy maximised)."""
    from explore.space import load_space

    path = space_file(search)
    if search not in SEARCHES and not os.path.isfile(path):
        return (f"{search!r} is neither a search ({', '.join(SEARCHES)}) nor a space "
                f"file")
    try:
        space = load_space(path)
    except Exception as e:  # the space's own error names file, line and key
        return f"{search}: {e}"
    why = None
    if space.model.builder is not None:
        why = f"its model is a builder of its own ({space.model.builder})"
    elif space.model.family not in TWINS:
        why = f"model.family {space.model.family!r} has no PyTorch twin ({', '.join(TWINS)} do)"
    elif len(space.objectives) != 1 or space.objectives[0].metric != "accuracy" or \
            space.objectives[0].direction != "maximize":
        why = "the peers measure one objective, accuracy maximised"
    elif space.dataset is None:
        why = "it has no dataset section"
    elif "auto" in _choices(space.training.batch_size):
        why = "training.batch_size: auto is explore's to choose; give the peers a size"
    return None if why is None else f"{search}: the peers cannot run it: {why}"


def _choices(param: Any) -> list[Any]:
    """A parameter's values: a choice's options, else the value itself."""
    return list(getattr(param, "options", [param]))


def space_of(args: argparse.Namespace) -> Any:
    """The search's space with this run's sizes, seed and device: what every side runs."""
    from explore.space import load_space

    space = load_space(space_file(args.search))
    assert space.dataset is not None
    budget = space.budget.model_copy(update={
        "trials": args.trials or space.budget.trials, "rounds": args.rounds or
        space.budget.rounds, "workers": args.workers, "seed": args.seed,
        "device": args.device, "stack": args.stack or space.budget.stack})
    data = space.dataset.model_copy(update={
        "train": args.train or space.dataset.train, "valid": args.valid or space.dataset.valid})
    return space.model_copy(update={
        "budget": budget, "dataset": data,
        "sampler": space.sampler.model_copy(update={"seed": args.seed})})


def prunes(space: Any) -> bool:
    return bool(space.pruner.name != "none")


def validation_interval(space: Any) -> int:
    """Rounds between validations, as explore's scheduler takes them from the space
    (``training.validate_every``): the Optuna sides validate where explore does."""
    return int(space.training.validation_interval(space.budget.rounds, prunes(space)))


def eval_chunk(space: Any) -> int:
    return int(space.training.eval_batch_size or 10_000)


# ---------------------------------------------------------------- the anytime curve
def curve_of_study(study: Any, t0: float) -> list[list[float]]:
    """``[[seconds since t0, best accuracy the trial reported], ...]`` for every finished
    (complete or pruned) trial of an Optuna study, in the order they ended."""
    out = []
    for t in study.trials:
        if t.state.name not in ("COMPLETE", "PRUNED") or t.datetime_complete is None:
            continue
        seen = [*t.intermediate_values.values(), *([t.value] if t.value is not None else [])]
        if seen:
            out.append([t.datetime_complete.timestamp() - t0, max(seen)])
    return sorted(out)


def in_flight(spans: Sequence[Sequence[float]]) -> int:
    """The most trials training at once, from their (start, end) spans.

    >>> in_flight([[0, 2], [1, 3], [2.5, 4], [5, 6]])
    2
    """
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in edges:  # an end sorts before a start at the same moment
        now += step
        most = max(most, now)
    return most


def spans_of_study(study: Any) -> list[list[float]]:
    """Each finished trial's (start, end) as Optuna stored them (seconds)."""
    return [[t.datetime_start.timestamp(), t.datetime_complete.timestamp()]
            for t in study.trials if t.datetime_start and t.datetime_complete]


def time_to(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """When the curve first reached ``target`` (None: never).

    >>> time_to([[1.0, 0.5], [2.0, 0.91], [3.0, 0.95]], 0.9)
    2.0
    >>> time_to([[1.0, 0.5]], 0.9) is None
    True
    """
    return next((t for t, acc in curve if acc >= target), None)


def median_time(times: Sequence[float | None]) -> float | None:
    """The median of runs' times to target, a run that never got there counting as
    later than any that did: None when the median run never got there.

    >>> median_time([3.0, None, 1.0]), median_time([None, None, 1.0])
    (3.0, None)
    """
    m = statistics.median([float("inf") if t is None else t for t in times])
    return None if m == float("inf") else m


# ---------------------------------------------------------------- PyTorch training
class TorchTrainer:
    """The baselines' training of one trial: the space's rows on the device once (as
    float32), a fresh network per trial, mini-batches drawn from a permutation each
    round, validation accuracy after each round in the space's chunks."""

    def __init__(self, space: Any, device: str, arrays: Mapping[str, Any] | None = None
                 ) -> None:
        import torch

        self.torch = torch
        self.space = space
        self.dev = torch.device("cuda" if device == "gpu" else "cpu")
        from explore.binding import bind

        d = bind(space).data
        self.scale = d.pixel_scale or 1.0
        self.image = d.image
        self.classes = d.classes
        if arrays is None:
            arrays = load_arrays(space)

        def put(a: Any, dtype: Any) -> Any:
            t = torch.from_numpy(a).to(self.dev)
            return t.to(dtype) * self.scale if dtype is torch.float32 else t.to(dtype)

        self.x, self.y = put(arrays["x_train"], torch.float32), put(arrays["y_train"],
                                                                     torch.int64)
        self.xv, self.yv = put(arrays["x_valid"], torch.float32), put(arrays["y_valid"],
                                                                       torch.int64)

    def run(self, params: dict[str, Any], seed: int,
            report: Callable[[float, int], bool], every: int = 1) -> float:
        """Train ``params``'s network for the space's rounds; validate after every
        ``every``-th round and the last, and ``report(accuracy, round)`` then, which
        answers True to stop (pruned) and then this raises :class:`Pruned`.  The last
        round's validation accuracy."""
        from bench import _torch_models as tm

        torch = self.torch
        torch.manual_seed(seed)
        net = tm.model(params, self.x.shape[1], self.classes, self.image).to(self.dev)
        opt = tm.optimizer(params, list(net.parameters()))
        loss_fn = torch.nn.CrossEntropyLoss()
        batch = params.get("batch_size")
        batch = int(batch) if isinstance(batch, int) and batch > 0 else 64
        gen = torch.Generator(device=self.dev)
        gen.manual_seed(seed)
        n, chunk, acc = len(self.y), eval_chunk(self.space), 0.0
        for rnd in range(1, self.space.budget.rounds + 1):
            net.train()
            order = torch.randperm(n, device=self.dev, generator=gen)
            for s in range(0, n, batch):
                idx = order[s:s + batch]
                opt.zero_grad(set_to_none=True)
                loss_fn(net(self.x[idx]), self.y[idx]).backward()
                opt.step()
            if rnd % every and rnd < self.space.budget.rounds:
                continue  # as explore does (training.validate_every)
            net.eval()
            with torch.no_grad():
                right = sum(int((net(self.xv[s:s + chunk]).argmax(1) ==
                                 self.yv[s:s + chunk]).sum())
                            for s in range(0, len(self.yv), chunk))
            acc = right / len(self.yv)
            if report(acc, rnd):
                raise Pruned
        return acc


class Pruned(Exception):
    """A trial its pruner stopped."""


def load_arrays(space: Any) -> dict[str, Any]:
    """The space's rows as explore loads them (images as uint8 pixels)."""
    from explore.binding import bind

    d = bind(space).data.load_compact(*space.dataset.heads)
    return {"x_train": d.train.x, "y_train": d.train.y, "x_valid": d.valid.x,
            "y_valid": d.valid.y}


def torch_threads(device: str, share: int) -> None:
    import torch

    if device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // share))


# ---------------------------------------------------------------- the sides
def run_explore(args: argparse.Namespace) -> dict[str, Any]:
    import optuna

    from explore.binding import bind
    from explore.scheduler import Scheduler
    from explore.scheduler.admission import admit
    from explore.scheduler.prestart import prestart
    from explore.scheduler.shared_data import load_shared
    from explore.space import parse_size
    from explore.study import RECORD_ATTR, open_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = space_of(args)
    memory = parse_size(args.memory) if args.memory else space.budget.memory
    space = space.model_copy(update={"budget": space.budget.model_copy(
        update={"memory": memory})})
    bound = bind(space)
    data = load_shared(bound)
    # as `explore run` does (explore.runner.execute): the workers the budget holds
    # start while the study opens
    smallest = admit(bound)
    started = prestart(space.budget.model_copy(update={"workers": args.workers,
                                                       "device": args.device}),
                       smallest, data.nbytes)
    with tempfile.TemporaryDirectory() as tmp:
        study = open_study(space, f"sqlite:///{tmp}/peers.db")
        t0 = time.time()
        stats = Scheduler(bound, study, data, workers=args.workers, memory=memory,
                          device=args.device, smallest=smallest,
                          prestarted=started).run(space.budget.trials)
        started.close()
        wall = time.time() - t0
        curve = curve_of_study(study, t0)
        # when each trial trained (the scheduler's record), not when it was asked
        spans = [[r["start"], r["end"]] for t in study.trials
                 if isinstance(r := t.user_attrs.get(RECORD_ATTR), dict)
                 and r.get("start") is not None and r.get("end") is not None]
    return {"seconds": wall, "curve": curve, "trials": len(curve), "budget_bytes": memory,
            "t0": t0, "in_flight": in_flight(spans),
            "accounted_peak_bytes": stats.peak, "own_measured_peak_bytes": stats.measured_peak,
            "work": stats.work()}


def sampler_pruner(space: Any, seed: int) -> tuple[Any, Any]:
    """The Optuna sides' sampler and pruner: the ones explore builds for the space
    (TPE with its startup trials, the median pruner, ...), the sampler seeded with
    ``seed``."""
    from explore.study import make_pruner, make_sampler

    seeded = space.model_copy(update={"sampler": space.sampler.model_copy(
        update={"seed": seed})})
    return make_sampler(seeded), make_pruner(space)


def objective_of(space: Any, trainer: TorchTrainer, seed: int) -> Callable[[Any], float]:
    import optuna

    from explore.sampling import suggest

    def objective(trial: optuna.Trial) -> float:
        def report(acc: float, rnd: int) -> bool:
            trial.report(acc, rnd)
            return bool(trial.should_prune())

        try:
            return trainer.run(suggest(trial, space), seed + trial.number, report,
                               validation_interval(space))
        except Pruned:
            raise optuna.TrialPruned() from None

    return objective


def run_njobs(args: argparse.Namespace) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = space_of(args)
    torch_threads(args.device, args.workers)
    trainer = TorchTrainer(space, args.device)
    sampler, pruner = sampler_pruner(space, args.seed)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    t0 = time.time()
    study.optimize(objective_of(space, trainer, args.seed), n_trials=space.budget.trials,
                   n_jobs=args.workers)
    wall = time.time() - t0
    curve = curve_of_study(study, t0)
    return {"seconds": wall, "curve": curve, "trials": len(curve), "t0": t0,
            "in_flight": in_flight(spans_of_study(study))}


def journal(path: str) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(path))


def run_journal(args: argparse.Namespace) -> dict[str, Any]:
    """W processes on one journal-file study, the trials split between them; timed from
    when every one is ready (libraries imported, data on its device) to the last end."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = space_of(args)
    trials = space.budget.trials
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "journal.log")
        optuna.create_study(storage=journal(path), study_name="peers", direction="maximize")
        procs = []
        for k in range(args.workers):
            share = trials // args.workers + (k < trials % args.workers)
            cmd = [sys.executable, os.path.abspath(__file__), *child_args(args),
                   "--child", "journal-worker", "--journal", path, "--share", str(share),
                   "--process", str(k)]
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True))
        try:
            for p in procs:
                assert p.stdout is not None
                if (said := p.stdout.readline().strip()) != "ready":
                    raise RuntimeError(f"a journal process said {said!r}, not 'ready'")
            t0 = time.time()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(f"{t0}\n")
                p.stdin.flush()
            ends = []
            for p in procs:
                out, _ = p.communicate()
                if p.returncode != 0:
                    raise RuntimeError(f"a journal process exited {p.returncode}")
                ends.append(float(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        wall = max(ends) - t0  # its last trial's end, not its processes' exit
        study = optuna.load_study(study_name="peers", storage=journal(path))
        curve, spans = curve_of_study(study, t0), spans_of_study(study)
    return {"seconds": wall, "curve": curve, "trials": len(curve), "t0": t0,
            "in_flight": in_flight(spans)}


def journal_worker(args: argparse.Namespace) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = space_of(args)
    torch_threads(args.device, args.workers)
    trainer = TorchTrainer(space, args.device)
    # each process its own sampler seed: one seed would draw the same first trials twice
    sampler, pruner = sampler_pruner(space, args.seed + 100_000 * args.process)
    study = optuna.load_study(study_name="peers", storage=journal(args.journal),
                              sampler=sampler, pruner=pruner)
    print("ready", flush=True)
    sys.stdin.readline()
    study.optimize(objective_of(space, trainer, args.seed), n_trials=args.share)
    print(time.time(), flush=True)


def ray_trial(config: dict[str, Any], arrays: dict[str, Any], setup: dict[str, Any]) -> None:
    """Ray Tune's function trainable: one trial, reporting accuracy each round."""
    from ray import tune

    ns = argparse.Namespace(**setup)
    space = space_of(ns)
    torch_threads(ns.device, ns.workers)
    trainer = TorchTrainer(space, ns.device, arrays)

    def report(acc: float, rnd: int) -> bool:
        tune.report({"accuracy": acc, "now": time.time()})
        return False  # ASHA stops a trial by ending it at a report

    trainer.run(config, ns.seed + int(config.get("_number", 0)), report)


class Define:
    """OptunaSearch's define-by-run space: explore's questions, and the trial's number
    (a class, not a closure: Tune pickles its searcher at every checkpoint)."""

    def __init__(self, space: Any) -> None:
        self.space, self.count = space, 0

    def __call__(self, trial: Any) -> dict[str, Any]:
        from explore.sampling import suggest

        self.count += 1
        return {**suggest(trial, self.space), "_number": self.count - 1}


def _seen_callback() -> type:
    from ray import tune

    class Seen(tune.Callback):
        """Each trial's last report time and best accuracy, as the driver receives them
        (Tune's result files are off)."""

        def __init__(self, into: dict[str, tuple[float, float]],
                     starts: dict[str, float]) -> None:
            self.into, self.starts = into, starts

        def on_trial_start(self, iteration: int, trials: Any, trial: Any, **info: Any
                           ) -> None:
            self.starts[trial.trial_id] = time.time()

        def on_trial_result(self, iteration: int, trials: Any, trial: Any,
                            result: dict[str, Any], **info: Any) -> None:
            _, best = self.into.get(trial.trial_id, (0.0, 0.0))
            self.into[trial.trial_id] = (float(result["now"]),
                                         max(best, float(result["accuracy"])))

    return Seen


def run_ray(args: argparse.Namespace) -> dict[str, Any]:
    # before Ray is imported: no usage reporting, no result files beyond what Tune needs
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)  # Ray's workers import bench
    import logging

    import optuna
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    Seen = _seen_callback()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = space_of(args)
    arrays = load_arrays(space)
    setup = {k: v for k, v in vars(args).items() if k in CHILD_KEYS}
    seen: dict[str, tuple[float, float]] = {}  # trial id: (its last report's time, best)
    starts: dict[str, float] = {}
    gpu = args.device == "gpu"
    with tempfile.TemporaryDirectory(prefix="ray", dir="/tmp") as tmp:
        t0 = time.time()
        ray.init(num_cpus=args.workers, num_gpus=1 if gpu else 0, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.ERROR, _temp_dir=tmp,
                 configure_logging=True)
        startup = time.time() - t0
        try:
            trainable = tune.with_resources(
                tune.with_parameters(ray_trial, arrays=arrays, setup=setup),
                {"cpu": 1, "gpu": 1 / args.workers if gpu else 0})
            search = OptunaSearch(space=Define(space), metric="accuracy", mode="max",
                                  sampler=sampler_pruner(space, args.seed)[0])
            asha = ASHAScheduler(time_attr="training_iteration", max_t=space.budget.rounds,
                                 grace_period=max(1, space.pruner.warmup_rounds),
                                 reduction_factor=3)
            tuner = tune.Tuner(trainable, tune_config=tune.TuneConfig(
                metric="accuracy", mode="max", search_alg=search, scheduler=asha,
                num_samples=space.budget.trials, max_concurrent_trials=args.workers,
                reuse_actors=True),
                run_config=tune.RunConfig(storage_path=os.path.join(tmp, "results"),
                                          name="peers", verbose=0, callbacks=[Seen(seen, starts)]))
            grid = tuner.fit()
            wall = time.time() - t0
            errors = sum(r.error is not None for r in grid)
            curve = [[now - t0, acc] for now, acc in seen.values()]
        finally:
            ray.shutdown()
    if errors:
        raise RuntimeError(f"{errors} Ray trials failed")
    spans = [[starts[k], seen[k][0]] for k in seen if k in starts]
    return {"seconds": wall, "curve": sorted(curve), "trials": len(curve), "t0": t0,
            "startup_s": startup, "in_flight": in_flight(spans)}


RUNNERS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "explore": run_explore, "optuna_njobs": run_njobs, "optuna_journal": run_journal,
    "ray_tune": run_ray}
CHILD_KEYS = ("search", "device", "workers", "memory", "trials", "rounds", "train",
              "valid", "seed", "stack")


def child_args(args: argparse.Namespace) -> list[str]:
    out = []
    for k in CHILD_KEYS:
        v = getattr(args, k)
        out += [f"--{k}", str(v)] if v not in (None, "") else []
    return out


# ---------------------------------------------------------------- measuring from outside
class TreeSampler:
    """The peak PSS of a process and its descendants and, with ``gpu``, the peak device
    memory NVML lists for them, sampled every ``every`` seconds from this process (which
    holds no CUDA context)."""

    def __init__(self, pid: int, gpu: bool, every: float = 0.05) -> None:
        self.pid, self.gpu, self.every = pid, gpu, every
        self.peak_pss, self.peak_gpu = 0, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from explore.procmem import children, gpu_processes, pss

        while not self._done.is_set():
            tree = [self.pid, *children(self.pid)]
            self.peak_pss = max(self.peak_pss, sum(pss(p) for p in tree))
            if self.gpu:
                listed = gpu_processes() or {}
                self.peak_gpu = max(self.peak_gpu, sum(listed.get(p, 0) for p in tree))
            self._done.wait(self.every)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run_child(args: argparse.Namespace, side: str, seed: int, timeout: float
              ) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__),
           *child_args(argparse.Namespace(**{**vars(args), "seed": seed})), "--child", side]
    launched = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    sampler = TreeSampler(proc.pid, args.device == "gpu")
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise
    finally:
        sampler.stop()
    if proc.returncode != 0 or not out.strip():
        raise RuntimeError(f"{side} exited {proc.returncode}:\n{err[-3000:]}")
    got = dict(json.loads(out.strip().splitlines()[-1]))
    got.update(peak_pss_bytes=sampler.peak_pss, peak_gpu_bytes=sampler.peak_gpu or None,
               launch_s=got.pop("t0") - launched)
    return got


# ---------------------------------------------------------------- the answer
def summarise(runs: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One search's answer from its runs per side: the target and each side's figures."""
    best = max((acc for rs in runs.values() for r in rs for _, acc in r["curve"]),
               default=0.0)
    target = round(TARGET_SHARE * best, 4)
    sides: dict[str, Any] = {}
    for side, rs in runs.items():
        if not rs:
            continue
        times = [time_to(r["curve"], target) for r in rs]
        launches = [r.get("launch_s") for r in rs]
        # the same runs on a user's stopwatch: from the side's launch, its interpreter's
        # start, imports, data and processes included
        launched = [None if t is None or go is None else t + go
                    for t, go in zip(times, launches, strict=True)]
        sides[side] = {
            "time_to_target_s": _round(median_time(times)),
            "time_to_target_from_launch_s": (_round(median_time(launched))
                                             if None not in launches else None),
            "launch_s": (_round(statistics.median(float(go) for go in launches if go is not None))
                         if None not in launches else None),
            "best_accuracy": _round(statistics.median(
                max((a for _, a in r["curve"]), default=0.0) for r in rs), 4),
            "trials": statistics.median(r["trials"] for r in rs),
            "in_flight": max(r["in_flight"] for r in rs),
            "seconds": _round(statistics.median(r["seconds"] for r in rs)),
            "peak_pss_mb": _round(max(r["peak_pss_bytes"] for r in rs) / MB, 1),
            "peak_gpu_mb": (_round(max(r["peak_gpu_bytes"] or 0 for r in rs) / MB, 1)
                            if any(r.get("peak_gpu_bytes") for r in rs) else None),
            "time_to_target_all": [_round(t) for t in times],
            "time_to_target_from_launch_all": [_round(t) for t in launched],
            "runs": len(rs)}
        if side == "explore":
            budget = rs[0]["budget_bytes"]
            sides[side]["budget_mb"] = _round(budget / MB, 1)
            measured = [r["peak_gpu_bytes"] or r["peak_pss_bytes"] for r in rs]
            sides[side]["within_budget"] = all(m <= budget for m in measured)
        if side == "ray_tune":
            sides[side]["startup_s"] = _round(statistics.median(r["startup_s"] for r in rs))
    tried = [s for s in OPTUNA_SIDES if s in sides]
    if tried:
        better = min(tried, key=lambda s: (sides[s]["time_to_target_s"] or float("inf"),
                                           sides[s]["seconds"]))
        sides["optuna_torch"] = {**sides[better], "variant": better}
    return {"target": target, "sides": sides}


def utilisation(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """explore's utilisation of the machine over its runs of one search (medians;
    :mod:`explore.utilisation`): its model FLOPs over its wall time against the
    machine's GEMM peak, the rate while training and while validating against the
    workers' share of it, and the shares of the workers' time."""
    from explore.utilisation import PARTS, of_run

    got = [u for r in runs if (u := of_run({"work": r.get("work")})) is not None]
    if not got:
        return None

    def med(xs: Sequence[float | None], n: int = 3) -> float | None:
        have = [x for x in xs if x is not None]
        return round(statistics.median(have), n) if have else None

    return {"utilisation": med([u.utilisation for u in got]),
            "achieved_gflops": med([u.achieved / 1e9 for u in got], 1),
            "peak_gflops": med([(u.peak or 0) / 1e9 or None for u in got], 1),
            "while_training": med([u.while_training for u in got]),
            "while_validating": med([u.while_validating for u in got]),
            "model_tflop": med([u.total_flops / 1e12 for u in got]),
            "validation_share_of_flops": med([u.flops.get("valid", 0) / u.total_flops
                                              if u.total_flops else None for u in got]),
            "shares": {k: med([u.shares.get(k) for u in got]) for k in PARTS},
            "asking_s": med([u.asking_s for u in got], 2), "runs": len(got)}


def _round(x: float | None, n: int = 2) -> float | None:
    return None if x is None else round(x, n)


def plot(name: str, runs: Mapping[str, list[dict[str, Any]]], target: float, folder: str
         ) -> str | None:
    """The anytime curves of one search (every run of every side) as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, (side, rs) in enumerate(runs.items()):
        for i, r in enumerate(rs):
            t, acc = [0.0], [0.0]
            for x, a in r["curve"]:
                t.append(x)
                acc.append(max(acc[-1], a))
            t.append(r["seconds"])
            acc.append(acc[-1])
            ax.step(t, acc, where="post", color=f"C{k}", alpha=0.8,
                    label=side if i == 0 else None)
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target:.4f}")
    lows = [a for rs in runs.values() for r in rs for _, a in r["curve"]]
    ax.set_ylim(max(0.0, min(lows, default=0.0) - 0.02), 1.0)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("best validation accuracy so far")
    ax.set_title(f"{name}: best accuracy against time")
    ax.legend(loc="lower right")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"peers_{name}.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--searches", default=",".join(SEARCHES),
                    help=f"comma-separated: {', '.join(SEARCHES)}, or space files (an mlp "
                         "or cnn family, accuracy maximised)")
    ap.add_argument("--sides", default=",".join(SIDES),
                    help=f"comma-separated, of {', '.join(SIDES)}")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--workers", type=int, default=2, help="trials at a time, every side")
    ap.add_argument("--memory", default="", help="explore's budget (default: the space's)")
    ap.add_argument("--trials", type=int, default=0, help="0: the space's")
    ap.add_argument("--rounds", type=int, default=0, help="0: the space's")
    ap.add_argument("--train", type=int, default=0, help="training rows (0: the space's)")
    ap.add_argument("--valid", type=int, default=0, help="validation rows (0: the space's)")
    ap.add_argument("--stack", type=int, default=0,
                    help="explore's budget.stack: trials asked at once and stacked where "
                         "they can be (0: the space's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="repeat i runs with seed SEED + i")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per side's run")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 6 trials of 2 rounds on 2,000 + 1,000 images, once")
    ap.add_argument("--png", default="", help="a folder for the anytime curves' PNGs")
    ap.add_argument("--curves", default="", help="a JSON file for every run's curve")
    ap.add_argument("--log", action="store_true", help="each run's answer on stderr")
    ap.add_argument("--search", default="paper_mlp", help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--journal", help=argparse.SUPPRESS)
    ap.add_argument("--share", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.trials, args.rounds = args.trials or 6, args.rounds or 2
        args.train, args.valid, args.repeats = args.train or 2000, args.valid or 1000, 1
    if args.child == "journal-worker":
        journal_worker(args)
        return
    if args.child:
        print(json.dumps(RUNNERS[args.child](args)), flush=True)
        return
    searches = [s for s in args.searches.split(",") if s]
    sides = [s for s in args.sides.split(",") if s]
    for name in sides:
        if name not in SIDES:
            ap.error(f"unknown side {name!r} (sides: {', '.join(SIDES)})")
    for search in searches:
        if (why := refusal(search)) is not None:
            ap.error(why)
    searches = [s if s in SEARCHES else os.path.abspath(s) for s in searches]  # Ray's
    names = [search_name(s) for s in searches]  # workers run in folders of their own
    if len(set(names)) != len(names):
        ap.error(f"two searches share a name: {', '.join(names)}")
    if "explore" in sides:  # measured here, outside the sides' trees: explore's run reads it
        from explore.scheduler.peak import gemm_peak

        gemm_peak(args.device, fresh=True)
    for search in searches:  # every side loads its rows through explore's loader, whose
        # cache (explore.datasets.row_cache) the first run would otherwise fill on its clock
        load_arrays(space_of(argparse.Namespace(**{**vars(args), "search": search})))
    result: dict[str, Any] = {"searches": {}, "utilisation": {n: None for n in names},
                              "errors": []}
    curves: dict[str, dict[str, list[dict[str, Any]]]] = {
        search_name(search): {side: [] for side in sides} for search in searches}
    try:
        # repeat-major: a run cut short still has every search, with fewer repeats
        for i in range(args.repeats):
            for search in searches:
                k = i % len(sides)
                for side in sides[k:] + sides[:k]:
                    try:
                        got = run_child(argparse.Namespace(**{**vars(args),
                                                              "search": search}),
                                        side, args.seed + i, args.timeout)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        # one side's failure is reported; the others still run
                        result["errors"].append(f"{search_name(search)} {side} repeat "
                                                f"{i + 1}: "
                                                f"{str(e)[-1500:]}")
                        print(f"  {result['errors'][-1]}", file=sys.stderr, flush=True)
                        continue
                    curves[search_name(search)][side].append(got)
                    if args.log:
                        brief = {k: v for k, v in got.items() if k != "curve"}
                        print(f"  {search} repeat {i + 1}/{args.repeats} {side}: {brief}",
                              file=sys.stderr, flush=True)
    except KeyboardInterrupt:  # what was measured is still reported
        print("  interrupted", file=sys.stderr, flush=True)
    for search, runs in curves.items():
        if any(runs.values()):
            result["searches"][search] = summarise(runs)
            result["utilisation"][search] = utilisation(runs.get("explore", []))
            if args.png:
                plot(search, runs, result["searches"][search]["target"], args.png)
    result.update({
        "device": args.device, "workers": args.workers, "repeats": args.repeats,
        "seeds": [args.seed + i for i in range(args.repeats)],
        "sizes": {k: getattr(args, k) or "space's" for k in ("trials", "rounds", "train",
                                                              "valid", "stack")},
        "when": datetime.now().isoformat(timespec="seconds"),
        "isolation": "each side in a fresh process tree, alternating; medians"})
    if args.curves:
        with open(args.curves, "w") as f:
            json.dump(curves, f)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
