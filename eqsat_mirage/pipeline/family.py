"""``em.optimize`` on a shape family (a program with an ``em.Dim``): one search, every size.

1. ``dynamic.padding``: the family as one padded, masked program at Lp0 (the hint rounded
   up to a tile), length masks where reductions would see the padding.
2. The usual search on it, with schedules that read a dynamic dim whole refused
   (``cost.tiles.dynamic_dims``): their tiles would grow with the size.
3. ``dynamic.scale``: which grids and loops of the chosen plan grow with the size.
4. Verification at several sizes (the hint, hint +/- 1, a prime, one below a tile, the
   largest tested): the plan at each, zero-padded and cut, against the family's program
   at that size, finite-field trials and float checks each. A family that fails at any
   size falls back to one kernel per op (verified the same way). When the memory budget
   refuses the largest size, the largest verified moves halfway to the hint until it fits
   (``stats["family"]["over_budget"]`` names each refused size).
5. ``FamilyResult``: the plan at the hint, its costs at several sizes, and ``compile()``,
   a callable that reads the size from its inputs. It is stored in the results cache
   under the family's own key (its program, sizes and options); a hit tagged by this
   user skips the search and the verification at sizes, as a static program's hit does.
"""

from __future__ import annotations

import copy
import math
import time
import warnings

from ..cost.gpucost import mugraph_cost
from ..cost.tiles import dynamic_dims
from ..dynamic.padding import padded_graph, plan_masks
from ..dynamic.runner import FamilyRunner
from ..dynamic.scale import FamilyMember, NotScalableError, Scaling, scaling
from ..ir.check import check_lax
from ..ir.dims import DynamicShapeError
from ..ir.errors import BudgetError, LaxError
from ..mugraph.program import from_graph
from ..verifier.verify import verify
from .cache import lookup, make_key, open_cache, program_text, store_result
from .optimize import search as optimize_piece
from .options import SearchOptions
from .result import OptimizeResult

PAD_QUANTUM = 64  # the hint is padded up to a multiple of this (16 below it)


def padded_hint(hint: int) -> int:
    """The padded size the search plans at: the hint rounded up to a tile."""
    q = PAD_QUANTUM if hint >= PAD_QUANTUM else 16
    return -(-hint // q) * q


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, math.isqrt(n) + 1))


def test_sizes(dim, granule: int) -> list[int]:
    """The sizes a family is verified at: the hint, hint - 1 and + 1, a prime, one size
    below a tile (the plan's granule), and the largest (``max``, or 2 hint + 1)."""
    h = dim.hint
    prime = next(p for p in range(h + 2, 4 * h + 8) if _is_prime(p))
    top = dim.max if dim.max is not None else 2 * h + 1
    small = max(dim.min, min(granule - 1, h) if granule > 1 else 1)
    sizes = [h, h - 1, h + 1, prime, small, top]
    return sorted({s for s in sizes if dim.min <= s and (dim.max is None or s <= dim.max)},
                  key=sizes.index)


def cost_sizes(dim) -> list[int]:
    """Sizes the report prices the plan at: the hint and a few around and above it."""
    h = dim.hint
    sizes = [h, h + 1, h + h // 64 + 1, 2 * h]
    return [s for s in dict.fromkeys(sizes) if dim.max is None or s <= dim.max]


def family_rows(fam: dict | None) -> list[str]:
    """The report of a shape family (``stats["family"]``): where it was planned, which
    sizes were verified and what it costs at several."""
    if not fam:
        return []
    name = fam["dim"].split("(")[0]
    sizes = ", ".join(str(n) for n, ok in fam["verified_sizes"].items() if ok)
    rows = [f"family       {fam['dim']}: planned at {name} = {fam['planned_at']} "
            f"({fam['masks']} length mask(s)), granule {fam['granule']}; "
            + (f"fell back to one kernel per op: {fam['fallback']}; " if fam["fallback"]
               else "")
            + f"verified at {name} = {sizes} (bound <= "
            f"{max(fam['bounds'].values(), default=1.0):.1e})",
            "  cost at    " + ", ".join(f"{name} = {n}: {c:.2f} us"
                                        for n, c in fam["cost_us"].items())]
    if fam.get("over_budget"):
        rows.append(f"  not verified (memory budget): {name} = "
                    + ", ".join(str(n) for n in fam["over_budget"]))
    return rows


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


def _verify_sizes(graph, sc: Scaling, dim, opts: dict, refused: dict) -> tuple[dict, object]:
    """Verify the plan at each of ``test_sizes``; the largest, when the memory budget
    refuses it, moves halfway to the hint until it fits (``refused`` records each)."""
    verdicts, hint_verdict = {}, None
    sizes = test_sizes(dim, sc.granule)
    top = max(sizes)
    for size in sizes:
        while True:
            ref = graph.at({dim.name: size})
            member = FamilyMember(sc, size, ref.inputs, ref.outputs)
            try:
                v = verify(ref, member, **opts)
                break
            except BudgetError as exc:
                lower = (size + dim.hint) // 2
                if size != top or lower <= dim.hint + 1:
                    raise
                refused[size] = str(exc)
                size = top = lower
        verdicts[size] = v
        if size == dim.hint:
            hint_verdict = v
        if not v.equivalent:
            break
    return verdicts, hint_verdict


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
    out = FamilyResult(sc.mg, hit.cost_us, hit.baseline_cost_us, hit.verified,
                       {**hit.stats, "family": fam}, [], graph, hit.roofline_us)
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
    lp0 = padded_hint(dim.hint)
    fixed = {n for node in graph.nodes() for a, n in enumerate(node.shape)
             if a not in plan.axes.get(id(node), {})}
    while lp0 in fixed:  # the padded size names the dynamic dims of intermediates
        lp0 += PAD_QUANTUM if dim.hint >= PAD_QUANTUM else 16
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
    with dynamic_dims(axes, lp0):
        res = optimize_piece(padded, options, progress=progress, cache=cache)
    fallback = ""
    try:
        sc = scaling(res.program if hasattr(res.program, "kernels") else from_graph(
            res.program), graph.dynamic, dim.name, lp0)
    except NotScalableError as exc:
        fallback = f"the plan does not scale ({exc})"
    opts = dict(trials=options.trials, seed=options.seed, max_bound=options.max_bound)
    refused: dict[int, str] = {}
    if not fallback:
        verdicts, hint_v = _verify_sizes(graph, sc, dim, opts, refused)
        bad = [s for s, v in verdicts.items() if not v.equivalent]
        if bad:
            fallback = f"the plan fails at {dim.name}={bad[0]}: {verdicts[bad[0]]}"
    if fallback:
        say(f"family {graph.name!r}: {fallback}; one kernel per op instead")
        sc = scaling(from_graph(padded), graph.dynamic, dim.name, lp0)
        refused.clear()
        verdicts, hint_v = _verify_sizes(graph, sc, dim, opts, refused)
    costs = {s: mugraph_cost(sc.at(s), options.target).total_us for s in cost_sizes(dim)}
    stats = dict(res.stats)
    stats["family"] = {
        "dim": str(dim), "planned_at": lp0, "granule": sc.granule,
        "masks": len(plan.masks), "fallback": fallback,
        "verified_sizes": {s: bool(v.equivalent) for s, v in verdicts.items()},
        "bounds": {s: v.false_positive_bound for s, v in verdicts.items()},
        "over_budget": dict(refused),  # sizes the memory budget refused (a smaller one ran)
        "cost_us": costs,
        "grows": {k: sorted(a) for k, a in sc.grid.items() if a} | {
            k: ["loop"] for k in sc.loop},
        "seconds": time.perf_counter() - start}
    ok = all(v.equivalent for v in verdicts.values())
    out = FamilyResult(sc.mg, costs[dim.hint], res.baseline_cost_us,
                       hint_v if ok else next(v for v in verdicts.values() if not v.equivalent),
                       stats, res.candidates, graph, res.roofline_us, res.plan)
    out.scaling, out.family = sc, graph
    if store is not None and ok:  # JSON keys are text: the sizes are written as such
        stored = copy.copy(out)
        stored.stats = {**out.stats, "family": {k: {str(s): x for s, x in v.items()} if
                                                 isinstance(v, dict) and k != "grows" else v
                                                 for k, v in stats["family"].items()}}
        store_result(store, key, stored, graph.name)
        out.stats.update(cache="miss", cache_key=key[:12])
    say(f"family {graph.name!r}: verified at {dim.name} = "
        f"{', '.join(str(s) for s in verdicts)}; cost " + ", ".join(
            f"{c:.2f} us at {s}" for s, c in costs.items()))
    return out
