"""BestOf's online selection, over a program's tunable instructions.

A :class:`Decision` is one choice for one problem: an instruction's op at its shapes
(every instruction with the same problem shares it and pools its timings, as BestOf
keys its selections by problem size), or a *group* of instructions that choose
together (a dense layer's forward and gradient products), timed by the sum of its
members' medians.  During the first real steps a decision runs option 1 for ``calls``
calls of its first-called member, then option 2, ..., timing every call with the clock
(the device synchronised around it), the first call of each option discarded as a
warm-up, and does so ``rounds`` times (BestOf's rounds: on a shared machine a burst of
load during one option's calls would otherwise decide); an option's measure is the
median of its calls in its best round.  Then it keeps the best option and *freezes*.
An option ``prune`` times slower than the best so far is cut after its second call and
not tried again.

An option may hold a *nested* decision (BestOf's recursive selection): im2col's GEMM
layout is a choice inside the choice of im2col.  While the outer decision holds that
option it is locked, and the inner decision explores its own options; once the inner
one is frozen (leaves first), its best median is the option's measure.  Every node of
the tree is persisted under its own key.

The VM binds a tunable instruction through :meth:`Tuner.kernel`: a frozen decision's
winner is bound directly; otherwise a :class:`Probe` dispatches and times.  When no
decision that has started is still exploring, the tuner saves the decisions and asks
the VM to bind again, so no probe is left in its step lists.

>>> d = Decision("k", ("a", "b"), calls=3, rounds=1)
>>> for cost in [5, 5, 5, 1, 1, 1]:  # option a three calls, then b
...     frozen = d.record("role", cost)
>>> d.winner, frozen
('b', True)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from engine.autotune.cache import DecisionCache
from engine.autotune.keys import decision_key, problem, problem_text
from engine.ops._base import VARIANT_SEP, Step

Clock = Callable[[], float]
CALLS = 4  # calls per option and round: a warm-up and three (a median robust to one outlier)
ROUNDS = 3  # times over the options: each option's measure is its best round's
PRUNE = 2.0  # an option this many times slower than the best so far is cut early


class Decision:
    """One online choice among ``leaves`` (variant paths), explored option by option,
    ``rounds`` times over; options that share a first path segment below ``prefix`` form
    a nested decision."""

    def __init__(self, key: str, leaves: tuple[str, ...], *, calls: int = CALLS,
                 rounds: int = ROUNDS, prune: float = PRUNE,
                 cache: DecisionCache | None = None, prefix: str = "",
                 on_frozen: Callable[[Decision], None] | None = None, kind: str = "") -> None:
        self.key, self.leaves, self.calls, self.prune = key, leaves, calls, prune
        self.kind = kind  # the op, or the group, it chooses for
        self.on_frozen = on_frozen
        self.options: list[str] = []  # full paths of this level's options
        self.children: dict[str, Decision] = {}
        for leaf in leaves:
            head = leaf[len(prefix):].split(VARIANT_SEP)[0]
            opt = prefix + head
            if opt not in self.options:
                self.options.append(opt)
        for opt in list(self.options):
            sub = tuple(v for v in leaves if v.startswith(opt + VARIANT_SEP))
            if len(sub) > 1:
                self.children[opt] = Decision(f"{key}|{opt}", sub, calls=calls, rounds=rounds,
                                              prune=prune, cache=cache,
                                              prefix=opt + VARIANT_SEP, on_frozen=on_frozen)
            elif sub:  # one inner variant applies: the option is that leaf
                self.options[self.options.index(opt)] = sub[0]
        self.winner: str | None = None
        self.score: float | None = None  # the winner's measure (seconds), when timed here
        self.measures: dict[str, list[float]] = {}  # option -> one measure per round
        self.started = False
        self._plan = [o for _ in range(rounds) for o in self.options]  # what is left
        self._n = 0
        self._clock_role: str | None = None
        self._samples: dict[str, list[float]] = {}
        entry = cache.get(key) if cache is not None else None
        if entry is not None and entry.get("choice") in leaves:
            self.winner = entry["choice"]

    @property
    def frozen(self) -> bool:
        return self.winner is not None

    def current(self) -> str:
        """The leaf to run now: the winner, or the option being explored."""
        if self.winner is not None:
            return self.winner
        opt = self._plan[0]
        child = self.children.get(opt)
        return child.current() if child is not None else opt

    def record(self, role: str, seconds: float) -> bool:
        """One call of ``current()`` by a member in ``role`` took ``seconds``; True when
        this made the decision freeze."""
        if self.winner is not None:
            return False
        self.started = True
        opt = self._plan[0]
        child = self.children.get(opt)
        if child is not None and not child.frozen:  # locked while the inner one explores
            if not child.record(role, seconds):
                return False
            assert child.score is not None
            self.measures.setdefault(opt, []).append(child.score)  # its best measure
            return self._next(False)
        self._samples.setdefault(role, []).append(seconds)
        if self._clock_role is None:
            self._clock_role = role
        if role != self._clock_role:
            return False
        self._n += 1
        pruned = self._pruned()
        if self._n >= self.calls or pruned:
            self.measures.setdefault(opt, []).append(self._measure())
            return self._next(pruned)
        return False

    def _measure(self) -> float:
        """The sum over members of the median of their calls, first calls discarded."""
        return sum(statistics.median(s[1:] if len(s) > 1 else s)
                   for s in self._samples.values())

    def _best(self) -> float | None:
        """The best measure so far: an option's is the least of its rounds' (load on
        the machine only ever adds time)."""
        return min((min(m) for m in self.measures.values()), default=None)

    def _pruned(self) -> bool:
        best = self._best()
        return self._n >= 2 and best is not None and self._measure() > self.prune * best

    def _next(self, pruned: bool) -> bool:
        opt = self._plan.pop(0)
        if pruned:  # not worth another round
            self._plan = [o for o in self._plan if o != opt]
        self._n = 0
        self._samples = {}
        if self._plan:
            return False
        scores = {o: min(m) for o, m in self.measures.items()}
        best = min(scores, key=scores.__getitem__)
        child = self.children.get(best)
        self.winner = child.winner if child is not None else best
        self.score = scores[best]
        if self.on_frozen is not None:
            self.on_frozen(self)
        return True

    def entry(self) -> dict[str, Any]:
        """What is persisted: the choice, and each option's measure in milliseconds."""
        return {"choice": self.winner,
                "ms": {k: round(min(v) * 1e3, 6) for k, v in self.measures.items()}}

    def tree(self) -> dict[str, Any]:
        """The decision and its nested ones, for reports."""
        out: dict[str, Any] = {"choice": self.winner, "ms": self.entry()["ms"]}
        if self.children:
            out["inner"] = {k: c.tree() for k, c in self.children.items()}
        return out


class Probe:
    """The step of a tunable instruction while its decision explores: runs the option
    of the moment and times it (the device synchronised first and after)."""

    __slots__ = ("decision", "role", "steps", "tuner")

    def __init__(self, tuner: Tuner, decision: Decision, role: str,
                 steps: dict[str, Step]) -> None:
        self.tuner, self.decision, self.role, self.steps = tuner, decision, role, steps

    def __call__(self) -> None:
        d = self.decision
        if d.winner is not None:
            self.steps[d.winner]()
            return
        step = self.steps[d.current()]
        t = self.tuner
        if t.sync is not None:
            t.sync()
        start = t.clock()
        if t.started_at is None:
            t.started_at = start
        step()
        if t.sync is not None:
            t.sync()
        if d.record(self.role, t.clock() - start):
            t._root_frozen()


class Tuner:
    """The online selector of one VM: its decisions, clock and cache.

    ``clock``: seconds (``time.perf_counter``; tests inject a fake one). ``calls``:
    calls per option and round, the first discarded.  ``rounds``: times over the
    options.  ``prune``: cut an option this many times
    slower than the best so far after its second call.  ``cache``: a
    :class:`DecisionCache` (default: the file in :func:`~engine.autotune.cache.cache_dir`),
    or None to remember nothing.  ``pin``: a static choice instead of tuning, by decision
    kind (an op name, or a group's: ``{"Conv": "direct", "dense layout": "blas"}``);
    where the named variant does not apply, the first candidate (the op's default)."""

    def __init__(self, *, clock: Clock = time.perf_counter, calls: int = CALLS,
                 rounds: int = ROUNDS, prune: float = PRUNE,
                 cache: DecisionCache | bool | None = True,
                 pin: dict[str, str] | None = None) -> None:
        if calls < 1 or rounds < 1:
            raise ValueError(f"calls and rounds must be at least 1, got {calls}, {rounds}")
        self.clock, self.calls, self.rounds, self.prune = clock, calls, rounds, prune
        self.cache = DecisionCache() if cache is True else (cache or None)
        self.pin = dict(pin or {})
        self.sync: Callable[[], None] | None = None
        self.decisions: dict[str, Decision] = {}
        self._of: dict[int, tuple[Decision, str]] = {}  # instruction -> (decision, role)
        self._on_change: Callable[[], None] | None = None
        self.started_at: float | None = None
        self.frozen_at: float | None = None

    def attach(self, program: Any, on_change: Callable[[], None] | None = None,
               sync: Callable[[], None] | None = None) -> Tuner:
        """Make a decision for each problem (or group) of ``program``'s tunable
        instructions (a :class:`~engine.runtime.program.Program`), at its compiled
        batch; ``on_change`` is called when the winners should be bound."""
        if self._of:
            raise RuntimeError("a Tuner serves one VM: make another")
        self._on_change, self.sync = on_change, sync
        roles: dict[int, str] = {}
        groups: dict[str, list[int]] = {}
        for k, ins in enumerate(program.instrs):
            if not ins.variants:
                continue
            descs = [program.buffers[j].desc.at_batch(program.batch_size)
                     for j in (*ins.ins, *ins.outs)]
            roles[k] = problem_text(problem(ins.op, descs[:len(ins.ins)],
                                            descs[len(ins.ins):], ins.attrs))
            groups.setdefault(ins.group or f"\0{k}", []).append(k)
        for group, members in groups.items():
            first = program.instrs[members[0]]
            kind = group.split(":")[0] if not group.startswith("\0") else first.op
            key = decision_key(kind, [roles[k] for k in members], first.variants,
                               program.device)
            d = self.decisions.get(key)
            if d is None:
                d = Decision(key, first.variants, calls=self.calls, rounds=self.rounds,
                             prune=self.prune, cache=self.cache, on_frozen=self._persist,
                             kind=kind)
                if kind in self.pin:
                    name = self.pin[kind]
                    d.winner = name if name in d.leaves else d.leaves[0]
                self.decisions[key] = d
            for k in members:
                self._of[k] = (d, roles[k])
        return self

    def kernel(self, k: int, make: Callable[[str], Step], at_compiled_batch: bool) -> Step:
        """The step to bind for tunable instruction ``k``; ``make(variant)`` calls the
        variant's kernel factory.  A smaller batch (the last mini-batch) runs the
        decision's winner, or the first candidate while it explores."""
        d, role = self._of[k]
        if d.winner is not None:
            return make(d.winner)
        if not at_compiled_batch:
            return make(d.leaves[0])
        return Probe(self, d, role, {v: make(v) for v in d.leaves})

    @property
    def tuning(self) -> bool:
        """Whether a decision that has started is still exploring."""
        return any(d.started and not d.frozen for d in self.decisions.values())

    @property
    def frozen(self) -> bool:
        """Whether every decision is made (a VM that found them all in the cache starts
        so)."""
        return all(d.frozen for d in self.decisions.values())

    def choices(self) -> dict[int, str]:
        """Instruction -> the variant it runs (its winner, or the one being explored)."""
        return {k: d.current() for k, (d, _) in self._of.items()}

    def report(self) -> list[dict[str, Any]]:
        """Each decision: its kind, its instructions, its tree of choices and measures."""
        rows = []
        for d in self.decisions.values():
            members = [k for k, (e, _) in self._of.items() if e is d]
            rows.append({"kind": d.kind, "instrs": members, **d.tree()})
        return rows

    def _persist(self, d: Decision) -> None:
        if self.cache is not None and d.score is not None:
            self.cache.put(d.key, d.entry())

    def _root_frozen(self) -> None:
        """A decision froze: once none is exploring, save and rebind the winners."""
        if self.tuning:
            return
        self.frozen_at = self.clock()
        if self.cache is not None:
            self.cache.save()
        if self._on_change is not None:
            self._on_change()
