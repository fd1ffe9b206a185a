"""``em.optimize`` on a shape family (a program with an ``em.Dim``): one search, every size.

What feeds the search; the family's own steps are the ``family`` stage's:

1. ``family.padding``: the family as one padded, masked program at Lp0 (the hint rounded
   up to a tile), length masks where reductions would see the padding.
2. The usual search on it, with schedules that read a dynamic dim whole refused
   (``cost.tiles.dynamic_dims``): their tiles would grow with the size.
3. ``family.sizes``: which grids and loops of a plan grow with the size
   (``family.scale``), and the verification at six sizes, run inside the search on
   each plan verified at the hint (``SizeGate``): a plan failing at a size sends the
   search to its next; when none of the first three plans checked passes (or the search
   has no more), one kernel per op serves the family.
   The gated search is not cached on its own (the family's entry is).
4. ``FamilyResult``: the plan at the hint, its costs at several sizes, and ``compile()``,
   a callable that reads the size from its inputs (``family.runner``). It is stored in
   the results cache under the family's own key (its program, sizes and options); a hit
   tagged by this user skips the search and the verification at sizes, as a static
   program's hit does.
"""

from __future__ import annotations

import dataclasses
import time
import warnings

from ..cost.tiles import dynamic_dims
from ..family.padding import padded_graph, plan_masks, planned_size
from ..family.runner import FamilyRunner
from ..family.scale import Scaling, scaling
from ..family.sizes import SizeGate, check_sizes, family_costs, family_rows
from ..ir.check import check_lax
from ..ir.dims import DynamicShapeError
from ..ir.errors import LaxError
from .cache import lookup, make_key, open_cache, program_text, store_result
from .options import SearchOptions
from .result import OptimizeResult
from .search import search


class FamilyResult(OptimizeResult):
    """``em.optimize`` of a shape family: ``program`` is the plan at the hint, ``scaling``
    serves every size, ``stats["family"]`` says which sizes were verified and the cost at
    several; ``compile()`` runs any size."""

    scaling: Scaling | None = None
    family: object = None

    def __str__(self) -> str:
        fam = self.stats.get("family") or {}
        name = fam.get("dim", "L").split("(")[0]
        note = (f"(a shape family: the listing below is the plan at {name} = "
                f"{fam.get('planned_at')}; res.at({name}) gives it at any size, and "
                "res.compile() runs every size)")
        return "\n".join([*family_rows(fam), note, super().__str__()])

    def at(self, size: int):
        """The plan (a MuGraph) serving size ``size``."""
        return self.scaling.at(self.family.dims[self.scaling.dim].check(size))

    def triton_source(self, reuse_outputs: bool = False, length: int | None = None) -> str:
        """The family's Triton module: one module serving every size (its launcher reads L
        from the inputs and computes the padded size, grids, loop counts and shapes from
        it); ``reuse_outputs`` as for ``compile``. Where the launcher cannot be written so
        (a warning says why), the module serving ``length``'s padded size (default: the
        hint's), which refuses the others; ``compile()`` picks the right one for any
        size."""
        dim = self.family.dims[self.scaling.dim]
        length = dim.check(dim.hint if length is None else length)
        return FamilyRunner(self.family, self.scaling, reuse_outputs=bool(reuse_outputs),
                            check=False).source(length)

    def compile(self, cuda_graph: bool = False, reuse_outputs: bool = False,
                check: bool = True):
        """A callable on torch tensors of any size of the family (by position or name).
        ``cuda_graph`` is not supported for a family yet (a warning says so; it runs
        plain launches). ``check``: the first call per input signature is checked against
        the family's program at that size run by torch (``OptimizeResult.compile``)."""
        if cuda_graph:
            warnings.warn(f"shape family {self.family.name!r}: cuda_graph=True is not "
                          "supported for shape families yet; the kernels run as plain "
                          "launches", stacklevel=2)
        return FamilyRunner(self.family, self.scaling, reuse_outputs=reuse_outputs,
                            check=check)


def _family_entry(graph, padded, options: SearchOptions, cache) -> tuple:
    """The results cache and this family's key in it (None, None: no cache). The key
    covers the padded program (so the padded size and the masks), the family's own
    program and sizes, and every option."""
    store = open_cache(cache) if cache is not None and cache is not False else None
    if store is None:
        return None, None
    opts = options.resolved().key_data()
    opts.update(family=program_text(graph), dims=[
        str(d) for d in graph.dims.values()], dynamic=sorted(
            (n, sorted(ax.items())) for n, ax in graph.dynamic.items()))
    return store, make_key(padded, opts)


def _from_hit(hit, graph, dim, lp0: int) -> FamilyResult | None:
    """The FamilyResult of a cache hit (the stored plan at ``lp0`` and its family record;
    JSON made the sizes strings), or None when the record does not fit."""
    fam = dict(hit.stats["family"])
    try:
        for name in ("verified_sizes", "bounds", "cost_us", "over_budget"):
            fam[name] = {int(k): v for k, v in fam.get(name, {}).items()}
        sc = scaling(hit.program, graph.dynamic, dim.name, lp0)
    except (ValueError, TypeError, AttributeError, DynamicShapeError):
        return None
    if not fam["verified_sizes"] or not all(fam["verified_sizes"].values()):
        return None
    out = FamilyResult(program=sc.mg, cost_us=hit.cost_us,
                       baseline_cost_us=hit.baseline_cost_us, verified=hit.verified,
                       stats={**hit.stats, "family": fam}, source=graph,
                       roofline_us=hit.roofline_us)
    out.scaling, out.family = sc, graph
    return out


def optimize_family(graph, options: SearchOptions, progress=None, cache=True) -> FamilyResult:
    """``em.optimize`` of family ``graph`` (see the module docstring) with ``options``,
    through the results cache ``cache``."""
    start = time.perf_counter()
    say = progress or (lambda msg: None)
    if len(graph.dims) != 1:
        raise DynamicShapeError(f"graph {graph.name!r} has {len(graph.dims)} symbolic sizes "
                                f"({', '.join(graph.dims)}); one per program is supported")
    (dim,) = graph.dims.values()
    try:  # before any search: the verifier would refuse the program after it
        check_lax(graph, "shape family")
    except LaxError as exc:
        raise LaxError(f"{exc}. A shape family is searched as one Lax piece (it is not cut "
                       "into pieces yet): optimize each attention as a family of its own, or "
                       "run the model through torch.compile(backend=em.backend), which cuts "
                       "it into runs") from None
    plan = plan_masks(graph)
    lp0 = planned_size(plan, dim)
    padded = padded_graph(plan, {dim.name: lp0}, {dim.name: dim.hint})
    say(f"family {graph.name!r}: size {dim}, planned at {dim.name}={lp0} with "
        f"{len(plan.masks)} length mask(s)")
    store, key = _family_entry(graph, padded, options, cache)
    if store is not None:
        hit = lookup(store, padded, key)  # an entry not tagged by this user is dropped
        if hit is not None and "family" in hit.stats:
            out = _from_hit(hit, graph, dim, lp0)
            if out is not None:
                say(f"family {graph.name!r}: cache hit ({key[:12]}), verified at "
                    f"{', '.join(str(s) for s in out.stats['family']['verified_sizes'])}")
                return out
    axes = {n: {a for a, d in ax.items() if d == dim.name} for n, ax in graph.dynamic.items()}
    opts = dict(trials=options.trials, seed=options.seed, max_bound=options.max_bound)
    # each plan's size checks have the search's time limit again (at most SizeGate.TRIES
    # plans): a cap, and a check past it never passes (the family is then not served)
    gate = SizeGate(graph, dim, lp0, opts, say, options.limit_for(padded))
    with dynamic_dims(axes, lp0):  # a plan failing at a size: the search's next (``gate``)
        res = search(padded, options, progress=progress, cache=cache, gate=gate)
    checked = check_sizes(graph, padded, res.program, dim, lp0, opts, say, gate.clock(), gate)
    sc, verdicts, ok = checked.scaling, checked.verdicts, checked.ok
    costs = family_costs(sc, dim, options.target)
    stats = dict(res.stats)
    if checked.timed_out:
        stats["note"] = f"shape family {graph.name!r}: {checked.timed_out}; not served"
        stats["time_limited"] = True
    stats["family"] = checked.record(dim, lp0, len(plan.masks), costs,
                                     time.perf_counter() - start)
    out = FamilyResult(program=sc.mg, cost_us=costs[dim.hint],
                       baseline_cost_us=res.baseline_cost_us, verified=checked.verdict,
                       stats=stats, candidates=res.candidates, source=graph,
                       roofline_us=res.roofline_us, plan=res.plan)
    out.scaling, out.family = sc, graph
    if store is not None and ok:  # JSON keys are text: the sizes are written as such
        stored = dataclasses.replace(out, stats={
            **out.stats, "family": {k: {str(s): x for s, x in v.items()} if
                                    isinstance(v, dict) and k != "grows" else v
                                    for k, v in stats["family"].items()}})
        store_result(store, key, stored, graph.name)
        out.record(cache="miss", cache_key=key[:12])
    if ok:
        say(f"family {graph.name!r}: verified at {dim.name} = "
            f"{', '.join(str(s) for s in verdicts)}; cost " + ", ".join(
                f"{c:.2f} us at {s}" for s, c in costs.items()))
    elif not checked.timed_out:  # a cut check said so already (``check_sizes``)
        say(f"family {graph.name!r}: not served: {checked.verdict}")
    return out
