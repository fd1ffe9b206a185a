"""optimize's compile check: each candidate MuGraph built for the target before it is verified.

``Builder.clean(plan, ...)`` runs ``codegen.tune`` on the plan's MuGraph (every custom
kernel compiled for the target; spilling kernels rebuilt at other warp counts); with the
compile check off (``build=False``) it only writes the plan's Triton source, and a kernel
the Triton backend refuses (a ``CodegenError``) is refused the same way. A plan
with a kernel that cannot build cleanly is dropped, and its candidate program is planned
again with every refused schedule priced as infeasible (the refusals become facts of the
kernel planner, ``KernelPlanner.refuse``, read by every later plan); the new plan joins the
queue in cost order. The work is bounded (the candidates and at most ``MAX_REPLANS``
re-plans), and the deadline optimize gives it is the search's own cap: which plans are
built and refused does not depend on the clock below it (at a deadline of 70% of the
time limit, Phi-3's float16 layer had 46 or 64 of 64 ops optimized depending on when a
build finished). Past the deadline a plan is verified without being built, and counted as
skipped, and so is a plan whose build or warp retries the deadline cut short (``tune``'s
``cut_short``: a build stops between kernels, ``compile_report``); the search has then
reached its cap, and says so. A plan refused only because its kernels spill a little at
their best warp count (``tune.SMALL_SPILL``) is kept aside: when no plan builds cleanly, the
search verifies the cheapest of them (``last_resort``) rather than run the piece one kernel
per op. ``report()`` is its ``CompileRecord``
(``res.stats["compiled"]`` is its ``as_stats()``).
"""

from __future__ import annotations

import bisect
import subprocess

from ..codegen.concat import CodegenError
from ..codegen.tune import TuneResult, tune
from ..cost.gpucost import mugraph_cost
from ..cost.tiles import structure_key, tile_key, tiles_key
from ..ir.errors import MirageError, unexpected
from .records import CompileRecord

MAX_REPLANS = 4  # re-plans per optimize call after refusals (each re-prices the candidate)


class Builder:
    """The compile check of one optimize call (see the module docstring)."""

    def __init__(self, prof, kernels, todo: list, deadline, progress=None,
                 build: bool = True) -> None:
        # kernels: the fusion.forms.KernelPlanner that planned the forms of ``todo``;
        # build: compile every kernel for the target (False: write the Triton source only);
        # deadline: until when plans are built and refused candidates planned again
        self.prof, self.kernels, self.todo, self.build = prof, kernels, todo, build
        self.deadline, self.progress = deadline, progress
        self.refused: dict = {}
        self.replans = 0
        self.builds: list[str] = []
        self.compiles, self.seconds, self.skipped = 0, 0.0, 0
        self.spilling: list[tuple] = []  # plans refused only for small spills (``last_resort``)

    def clean(self, p, i: int, how: str, entry: dict, queue: list) -> bool:
        """Whether plan ``p`` (candidate ``i``) builds cleanly; pins retuned warps on it and
        fixes its cost. When not, queues a re-plan of the candidate and returns False."""
        custom = [k for k in p.mugraph.kernels if k.kind == "custom"]
        known = {key: self.refused[key] for k in custom for key in (tile_key(k), tiles_key(k),
                 structure_key(k)) if key in self.refused}
        if known:  # a schedule refused before: no need to build it again
            result = TuneResult(self.prof.name, refused=known)
        elif not self.build:  # compile check off: the source is still written (fast)
            why, keys = self._written(p.mugraph, custom)
            if why is None:
                return True
            if not keys:  # the module refused, no custom kernel to re-plan around: dropped
                entry["compiled"] = why
                return False
            result = TuneResult(self.prof.name, refused=dict.fromkeys(keys, why))
        elif self.deadline.expired():  # past its share of the time limit: verify unbuilt
            entry["compiled"] = "not built: the search's time limit ran out"
            self.skipped += 1
            return True
        else:
            try:
                result = tune(p.mugraph, self.prof.name, self.deadline)
            except CodegenError as exc:  # the backend cannot lower it: that kernel's structure
                why = f"the target's compiler failed on it: {exc}"[:500]
                bad = [k for k in custom if k is exc.kernel] or custom
                result = TuneResult(self.prof.name, refused={
                    key: why for k in bad for key in (tile_key(k), structure_key(k))})
            except (subprocess.SubprocessError, OSError) as exc:
                why = f"the target's compiler failed on it: {exc}"[:500]
                result = TuneResult(self.prof.name, refused={tile_key(k): why for k in custom})
            except Exception as exc:  # a bug on this one candidate: refused, the search goes on
                if unexpected(exc):
                    raise
                why = f"code generation failed on it: {type(exc).__name__}: {exc}"[:500]
                result = TuneResult(self.prof.name, refused={tile_key(k): why for k in custom})
        self.compiles, self.seconds = self.compiles + result.compiles, self.seconds + result.seconds
        if result.cut_short:  # the deadline came between warp counts: verified as planned
            entry["compiled"] = ("not built cleanly before the search's time limit ran out: "
                                 f"{result.summary()}")
            self.skipped += 1
            return True
        if result.ok:
            entry["compiled"] = result.summary()
            if result.retuned:
                p.cost_us = entry["cost_us"] = mugraph_cost(p.mugraph, self.prof).total_us
            self.builds.append(f"{how}: {result.summary()}")
            return True
        if result.small_spills_only:  # kept aside: the last resort when nothing builds clean
            self.spilling.append((i, how, p, dict(result.spills)))
        self.refused.update(result.refused)
        self.kernels.refuse(result.refused)
        entry["compiled"] = "; ".join(dict.fromkeys(result.refused.values()))
        if self.progress:
            what = "refused by the compile check: " if self.build else ""
            self.progress(f"MuGraph from {how} {what}{entry['compiled']}")
        if self.replans >= MAX_REPLANS or self.deadline.expired():
            return False
        self.replans += 1
        try:
            again = self.kernels.replan(self.todo[i], self.deadline)
        except Exception as exc:  # the planner refused the program (a bug too, outside
            if unexpected(exc):   # strict mode: the candidate is dropped, the search goes on)
                raise
            why = str(exc) if isinstance(exc, MirageError) else f"{type(exc).__name__}: {exc}"
            entry["compiled"] += f"; re-planning failed: {why}"
            return False
        if again.cost_us < float("inf"):
            bisect.insort(queue, (again.cost_us, i, f"{how} (re-planned)", again),
                          key=lambda x: (x[0], x[1]))
        return False

    def last_resort(self) -> tuple | None:
        """The cheapest plan refused only because its kernels spill a little
        (``tune.SMALL_SPILL`` bytes a thread at their best warp count), with those warps
        pinned and its cost priced again (the model charges nothing for the spills):
        (cost, candidate, how, plan, what it spills), or None. A search takes it only when
        no plan verified, and tries only this one: a few spilled registers cost less than
        running the piece one kernel per op."""
        if not self.spilling:
            return None
        for _, _, p, spills in self.spilling:  # each priced with its best warps pinned
            for k in p.mugraph.kernels:
                if k.name in spills:
                    k.num_warps = spills[k.name][0]
            p.cost_us = mugraph_cost(p.mugraph, self.prof).total_us
        i, how, p, spills = min(self.spilling, key=lambda x: (x[2].cost_us, x[0]))
        self.spilling.clear()
        said = ", ".join(f"{n} {b} B a thread at {w} warps" for n, (w, b) in spills.items())
        note = f"built with small spills ({said}): no plan built cleanly and verified"
        self.builds.append(f"{how} (spilling): {note}")
        return p.cost_us, i, how, p, note

    def _written(self, mugraph, custom: list) -> tuple[str | None, list]:
        """(None, []) when the Triton backend writes ``mugraph``'s source, else why not and
        the keys to refuse: the refused kernel's tile and structure keys, or every custom
        kernel's tile key when the whole module was refused (none: nothing to re-plan)."""
        from ..codegen.source import triton_source

        try:
            triton_source(mugraph)
        except CodegenError as exc:
            why = f"refused by the Triton backend: {exc}"[:500]
            bad = [k for k in custom if k is exc.kernel]
            keys = ([key for k in bad for key in (tile_key(k), structure_key(k))]
                    or [tile_key(k) for k in custom])
            return why, keys
        return None, []

    def report(self) -> CompileRecord:
        """What the check did: builds, refusals, re-plans, compiles and seconds
        (``as_stats()`` is ``res.stats["compiled"]``)."""
        return CompileRecord(self.prof.name, list(self.builds),
                             list(dict.fromkeys(self.refused.values())),
                             self.replans, self.compiles, round(self.seconds, 2), self.skipped)
