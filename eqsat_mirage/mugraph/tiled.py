"""The tiled interpreter: a MuGraph's meaning, executed for real and vectorised across blocks.

One interpreter for every backend: it takes a semantics table (``FLOAT_SEMANTICS``
or ``FIELD_SEMANTICS``, unchanged) and a context, so a wrong tiling gives wrong
values over the finite field exactly as over floats.

- Predefined kernels run their op with the table.
- A custom kernel runs all its blocks at once. Each block input is cut into
  tiles: every grid-mapped dim becomes (grid size, tile) and the grid axes
  move to the front, giving an array (G0, [G1, [G2,]] tile...) (replicated
  dims stay whole and are broadcast over the grid axes they do not use); an
  fmap dim becomes (F, tile) and iteration f takes slice f (a dim in both maps
  becomes (grid size, F, tile): the loop cuts each block's part). The block graph is
  *vectorised*: every tile op is rebuilt with the grid dims prepended to its
  shape, and its reduction / transpose / concat axes and reshape targets
  shifted past them, so matmuls batch over the grid and the table's ops apply
  unchanged (``interp.run``). Accumulators are summed over the F iterations
  with the table's ADD; a matmul accumulator, over the field and in float64, as one
  matmul over the whole loop (``joins.py``). Outputs are written back by omap (the inverse
  reshape/transpose); validation guarantees that every element of an output
  tensor is written by exactly one block.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..ir.limits import fixed_fact
from ..ir.node import (
    BINARY,
    COMPARE,
    LOGIC,
    LOGIC_BINARY,
    REDUCE,
    UNARY,
    Node,
    Op,
    make,
    tile_split,
    toposort,
)
from ..ir.ops import SPECS
from ..semantics.field import FIELD_SEMANTICS, MaskedPair
from ..semantics.floating import FLOAT_SEMANTICS, float_ctx, round_to, uniform
from ..semantics.interp import Outputs, Table, run
from .joins import FloatJoin, joined
from .kernels import CustomKernel, KernelGraph, MuGraphError, PredefinedKernel, TensorSpec
from .online import Online, iteration, plan_online, rescale
from .parts import needs_p, needs_q


def _lift(v: Node, prefix: tuple[int, ...], rank: int, gridded: bool) -> Node:
    """Give ``v`` ``rank`` tile dims (ones in front of its own) after the grid dims."""
    g = len(prefix)
    tile = v.shape[g:] if gridded else v.shape
    if len(tile) >= rank or (not gridded and not v.shape):
        return v
    lead = prefix if gridded else (1,) * g  # a value computed without tiles: the same in all
    return make(Op.RESHAPE, (v,), lead + (1,) * (rank - len(tile)) + tile)


def vectorise(outputs: Mapping[str, Node], prefix: tuple[int, ...]) -> tuple[Outputs, dict]:
    """The block-graph stage with outputs ``outputs``, rebuilt over all blocks at once.

    Every node that depends on a tile gets shape ``prefix + tile shape``
    (``prefix`` is the grid); constant-only nodes are kept. Returns the
    vectorised program (same output names) and the map id(old node) -> new node.
    """
    g = len(prefix)
    new: dict[int, Node] = {}
    gridded: set[int] = set()
    for node in toposort(list(outputs.values())):
        srcs = [new[id(s)] for s in node.srcs]
        on = [id(s) in gridded for s in srcs]
        if node.op is Op.INPUT:
            v = Node(Op.INPUT, (), node.arg, prefix + node.shape, node.dtype)
        elif not any(on):
            v = node
        else:
            op, arg = node.op, node.arg
            if op in BINARY | COMPARE | LOGIC_BINARY or op in (Op.WHERE, Op.MASK):
                srcs = [_lift(s, prefix, len(node.shape), o) for s, o in zip(srcs, on)]
            elif op is Op.MATMUL:
                rank = max(len(s.shape) for s in node.srcs)
                srcs = [_lift(s, prefix, rank, o) for s, o in zip(srcs, on)]
            elif op in REDUCE:
                arg = (tuple(a + g for a in arg[0]), arg[1])
            elif op is Op.TRANSPOSE:
                arg = tuple(range(g)) + tuple(a + g for a in arg)
            elif op is Op.RESHAPE:
                arg = prefix + tuple(arg)
            elif op is Op.CONCAT:
                srcs = [_lift(s, prefix, len(node.shape), o) for s, o in zip(srcs, on)]
                arg = arg + g
            elif op is Op.SLICE:
                arg = (arg[0] + g, arg[1], arg[2])
            elif op not in UNARY | LOGIC:
                raise MuGraphError(f"block op {node.describe()} cannot be vectorised")
            v = make(op, tuple(srcs), arg, node.loc)
            if v.shape != prefix + node.shape:
                raise MuGraphError(f"block op {node.describe()}: vectorised shape {v.shape} is "
                                   f"not grid {prefix} + tile {node.shape}")
        if node.op is Op.INPUT or any(on):
            gridded.add(id(v))
        new[id(node)] = v
    return Outputs({name: new[id(n)] for name, n in outputs.items()}), new


# -- cutting tiles and writing them back ----------------------------------------------------


def _each(value: Any, fn: Callable, pairs: bool) -> Any:
    """Apply an array function to a float value, or to both parts of a field pair."""
    if pairs:
        out = tuple(fn(v) if v is not None else None for v in value)
        return MaskedPair.of(*out, fn(value.keep)) if isinstance(value, MaskedPair) else out
    return fn(value)


def cut(x: np.ndarray, imap: Mapping[int, int], fmap: int | None, grid: tuple[int, ...],
        forloop: int) -> np.ndarray:
    """Tiles of ``x`` for every block: shape ([F,] *grid, *tile), iteration axis first."""
    x = np.asarray(x)
    split, grid_pos, loop_pos, tile_pos = tile_split(x.shape, imap, fmap, grid, forloop)
    lead = [loop_pos] if loop_pos is not None else []
    y = x.reshape(split).transpose(lead + [grid_pos[a] for a in sorted(grid_pos)] + tile_pos)
    loop = (forloop,) if loop_pos is not None else ()
    tile = tuple(split[p] for p in tile_pos)
    ones = tuple(grid[a] if a in grid_pos else 1 for a in range(len(grid)))
    return np.broadcast_to(y.reshape(loop + ones + tile), loop + grid + tile)


def place(v: np.ndarray, omap: Mapping[int, int], fmap: int | None, grid: tuple[int, ...],
          forloop: int, shape: tuple[int, ...]) -> np.ndarray:
    """The device tensor of ``shape`` whose blocks' tiles are ``v``: ([F,] *grid, *tile)."""
    if uniform(v):  # one value everywhere (a constant draw of the float checks): stays a view
        return np.broadcast_to(np.asarray(v).reshape(-1)[:1].reshape(()), shape)
    off, g = (1 if fmap is not None else 0), len(grid)
    perm = [off + a for a in range(g) if a not in omap.values()]  # size-1 axes (validated)
    for d in range(np.ndim(v) - off - g):
        if d in omap:
            perm.append(off + omap[d])
        if d == fmap:
            perm.append(0)
        perm.append(off + g + d)
    return np.ascontiguousarray(np.transpose(v, perm)).reshape(shape)


# -- execution ------------------------------------------------------------------------------


@dataclass
class _Plan:
    kernel: CustomKernel
    loop: Outputs
    post: Outputs
    loop_map: dict
    post_map: dict
    adds: dict[str, Node]  # accumulator -> the ADD node used to sum it (dtype float32)
    # exact backends: accumulators that sum a matmul are one matmul over the whole loop
    # (sum_f L_f @ R_f = [L_0 .. L_F-1] @ [R_0; ..; R_F-1]); the loop then yields L_f and R_f
    fused: dict[str, Node] = field(default_factory=dict)
    fused_loop: Outputs | None = None
    online: Online | None = None  # running maxima (online softmax), see online.py
    # "exact" evaluations: accumulators whose loop value is a partial sum (a matmul's or a
    # reduction's, ``_lone_sums``), kept in float64 over the loop and rounded once after it,
    # as the input program's sums are: rounded each step, a tiled form of the input's own
    # algebra lost 1.1 bits on average at a common offset of 65536
    summed: tuple[str, ...] = ()


def _lone_sums(k: CustomKernel, loop: Outputs) -> dict[str, Node]:
    """The sum accumulators of ``k`` (not a running maximum nor rescaled by one: those are
    summed one step at a time) whose loop value is read by nothing else in the loop, not
    written by the loop and not another accumulator's too: each is a sum over the loop of
    partial values, which may be summed in any grouping."""
    readers: dict[int, int] = {}
    for n in loop.nodes():
        for src in n.srcs:
            readers[id(src)] = readers.get(id(src), 0) + 1
    loop_outs = {t for t, bo in k.outputs.items() if bo.stage == "loop"}
    outs = list(loop.outputs.values())
    online = set(k.maxima) | set(k.rescaled())  # summed with a rescale: one at a time
    return {a: loop.outputs[a] for a in k.accumulators
            if a not in loop_outs and a not in online
            and not readers.get(id(loop.outputs[a])) and outs.count(loop.outputs[a]) == 1}


def _fuse_matmuls(loop: Outputs, lone: dict[str, Node]
                  ) -> tuple[dict[str, Node], Outputs | None]:
    """The accumulators of ``lone`` (``_lone_sums``) whose loop value is a matmul, and the
    loop program that yields their operands instead (None: no such one)."""
    fused = {a: n for a, n in lone.items() if n.op is Op.MATMUL}
    if not fused:
        return {}, None
    rest = {t: n for t, n in loop.outputs.items() if t not in fused}
    for a, m in fused.items():
        rest[f"{a}\0lhs"], rest[f"{a}\0rhs"] = m.srcs
    return fused, Outputs(rest)


def plans(mg: KernelGraph) -> list:
    """Each kernel's program as the interpreter runs it: a predefined kernel's one node, a
    custom kernel's loop, epilogue and (field) fused-loop stages."""
    plans: list = []
    for k in mg.kernels:
        if isinstance(k, PredefinedKernel):
            plans.append(Outputs({k.output: k.node}))
            continue
        loop, loop_map = vectorise(k.loop.outputs, k.grid)
        post, post_map = vectorise(k.post.outputs, k.grid)
        adds = {a: Node(Op.ADD, (loop.outputs[a],) * 2, None, loop.outputs[a].shape, "float32")
                for a in k.accumulators}
        lone = _lone_sums(k, loop)
        summed = tuple(a for a, n in lone.items() if SPECS[n.op].accumulates)
        plans.append(_Plan(k, loop, post, loop_map, post_map, adds, *_fuse_matmuls(loop, lone),
                           plan_online(k, loop), summed))
    return plans


def validated_plans(mg: KernelGraph) -> list:
    """``mg.validate()`` (its errors raised), then ``plans(mg)``; within
    ``limits.programs_fixed`` (a verification: its programs only read) done once per
    MuGraph, its plans shared by every run (they are read, never written)."""
    def make():
        mg.validate()
        return plans(mg)
    return fixed_fact(mg, "validated plans", make)


def _with_leaves(table: Table, leaves: Mapping[str, Any]) -> dict:
    """``table`` with INPUT nodes looked up by name in ``leaves``."""
    return {**table, Op.INPUT: lambda ctx, n: leaves[n.arg]}


def _run_custom(plan: _Plan, table: Table, ctx: Any, env: Mapping[str, Any],
                specs: Mapping[str, TensorSpec], pairs: bool,
                keep: Collection[int] = ()) -> dict[str, Any]:
    k = plan.kernel
    grid, f_range = k.grid, k.forloop
    native = getattr(ctx, "mode", None) == "native"
    if native:  # as the generated code: tiles computed in float32, rounded when stored
        ctx = replace(ctx, mode="float32")
    summed = plan.summed if native and getattr(ctx, "exact", False) and f_range > 1 else ()
    if summed:  # "exact": a sum split over the loop is one sum, rounded once (after it)
        ctx = replace(ctx, unrounded=frozenset(
            id(n) for a in summed for n in (plan.loop.outputs[a], plan.adds[a])))
    fixed, looped = {}, {}
    for bi in k.inputs.values():
        value = _each(env[bi.tensor], lambda x, bi=bi: cut(x, bi.imap, bi.fmap, grid, f_range),
                      pairs)
        (looped if bi.fmap is not None else fixed)[bi.name] = value
    accs: dict[str, Any] = {}
    loop_outs = {t: bo for t, bo in k.outputs.items() if bo.stage == "loop"}
    written: dict[str, list] = {t: [] for t in loop_outs}
    saved = getattr(ctx, "limb_cache", None)
    # exact: every matmul accumulator joined; float64: those whose operands are views of the
    # tiles (``joins.FloatJoin``), unless a caller reads the per-iteration product (``keep``)
    joins = f_range > 1 and plan.online is None and (
        pairs or getattr(ctx, "mode", "") is None and not any(id(m) in keep
                                                               for m in plan.fused.values()))
    fused = plan.fused if joins else {}
    operands: dict[str, list] = {a: [] for a in fused}
    floats = None if pairs or not fused else FloatJoin(
        plan, table, ctx, accs, [env[bi.tensor] for bi in k.inputs.values()])
    running: dict[str, Any] = {}  # max accumulator -> its running value
    try:
        for f in range(f_range):
            tiles = {**fixed, **{n: _each(v, lambda x, f=f: x[f], pairs)
                                 for n, v in looped.items()}}
            if saved is not None:
                ctx.limb_cache = None  # tiles are fresh each iteration: nothing to reuse
            if plan.online is not None:
                vals, before = iteration(plan.online, plan.loop, table, ctx, tiles, running,
                                         pairs)
            else:
                vals = run(plan.fused_loop if fused else plan.loop, _with_leaves(table, tiles),
                           ctx)
            for a in fused:
                if floats is not None:
                    floats.take(a, vals[f"{a}\0lhs"], vals[f"{a}\0rhs"])
                else:
                    operands[a].append((vals[f"{a}\0lhs"], vals[f"{a}\0rhs"]))
            for t in loop_outs:
                vals[t] = _each(vals[t], lambda x, t=t: np.broadcast_to(
                    x, grid + k.output_node(t).shape), pairs)
            for a in k.accumulators:
                if a in fused:
                    continue
                if f == 0 or a in k.maxima:  # a maximum's value is already the running one
                    accs[a] = vals[a]
                    continue
                if plan.online is not None and a in plan.online.rescaled:
                    accs[a] = rescale(plan.online, table, ctx, a, accs[a], before, running)
                accs[a] = table[Op.ADD](ctx, plan.adds[a], accs[a], vals[a])
            for t, bo in loop_outs.items():
                if bo.fmap is None:
                    written[t] = [vals[t]]  # every iteration writes the same tile: last one stays
                else:
                    written[t].append(vals[t])
    finally:
        if saved is not None:
            ctx.limb_cache = saved
    for a in summed:
        accs[a] = round_to(accs[a], "float32")
    for a, m in fused.items():  # operands broadcast over a grid axis on both sides: back
        if floats is not None:
            floats.finish(a)
            continue
        accs[a] = _each(table[Op.MATMUL](ctx, m, *joined(operands[a], m)),
                        lambda x, m=m: x if np.shape(x) == m.shape else np.broadcast_to(
                            x, m.shape), pairs)
    post_vals = run(plan.post, _with_leaves(table, {**fixed, **accs}), ctx) if k.post.outputs \
        else {}
    out = {}
    for t, bo in k.outputs.items():
        if bo.stage == "post":
            value = _each(post_vals[t], lambda x, t=t: np.broadcast_to(
                x, grid + k.output_node(t).shape), pairs)
        elif bo.fmap is None:
            value = written[t][0]
        else:
            parts = written[t]
            value = tuple(None if parts[0][i] is None else np.stack([p[i] for p in parts])
                          for i in (0, 1)) if pairs else np.stack(parts)
            if pairs and isinstance(parts[0], MaskedPair):  # a masked tile stays masked
                value = MaskedPair.of(*value, np.stack([p.keep for p in parts]))
        out[t] = _each(value, lambda x, bo=bo, t=t: place(
            x, bo.omap, bo.fmap, grid, f_range, specs[t].shape), pairs)
        if native:
            out[t] = round_to(out[t], specs[t].dtype)
    return out


def execute(mg: KernelGraph, plans: list, table: Table, ctx: Any, pairs: bool,
            keep: Collection[int] = ()) -> dict[str, Any]:
    """Run every kernel in order; returns the values of all device tensors by name. Each
    input is read (``table[Op.INPUT]``: a float64 conversion) just before the first kernel
    that reads it, and dropped after the last, as every other tensor. ``keep``: ids of
    vectorised loop nodes whose per-iteration values a caller reads (``node_samples``):
    their kernels' loops are run step by step in float64."""
    env: dict[str, Any] = {}
    first = input_first_reads(mg)
    specs = mg.tensors
    last = tensor_last_reads(mg)
    for i, (k, plan) in enumerate(zip(mg.kernels, plans)):
        for t in first.get(i, ()):
            env[t] = table[Op.INPUT](ctx, mg.inputs[t])
        if isinstance(k, PredefinedKernel):
            env.update(run(plan, _with_leaves(table, env), ctx))
        else:
            env.update(_run_custom(plan, table, ctx, env, specs, pairs, keep))
        for t in last.get(i, ()):
            env.pop(t, None)  # no later kernel reads it: its memory goes back now
    for t in mg.output_tensors.values():  # an input that is an output, read by no kernel
        if t in mg.inputs and t not in env:
            env[t] = table[Op.INPUT](ctx, mg.inputs[t])
    return env


def input_first_reads(mg: KernelGraph) -> dict[int, list[str]]:
    """Kernel position -> the input tensors first read there (``execute`` reads each input
    there; the memory estimate of lazily read inputs holds it from there)."""
    first: dict[int, list[str]] = {}
    seen: set[str] = set()
    for i, k in enumerate(mg.kernels):
        for t in k.reads():
            if t in mg.inputs and t not in seen:
                seen.add(t)
                first.setdefault(i, []).append(t)
    return first


def tensor_last_reads(mg: KernelGraph) -> dict[int, list[str]]:
    """Kernel position -> the device tensors last read there (never an output tensor)."""
    outs = set(mg.output_tensors.values())
    last: dict[str, int] = {}
    for i, k in enumerate(mg.kernels):
        for t in k.reads():
            last[t] = i
    done: dict[int, list[str]] = {}
    for t, i in last.items():
        if t not in outs:
            done.setdefault(i, []).append(t)
    return done


def evaluate_float(mg: KernelGraph, inputs: Mapping[str, Any], dtype: str | None = None,
                   rounded: bool = False) -> dict:
    """``em.evaluate`` for a MuGraph: float64 (``dtype=None``), "native", "exact" or a dtype
    name; ``rounded`` as in ``semantics.floating.evaluate``."""
    staged = validated_plans(mg)
    ctx = float_ctx(mg, inputs, dtype, rounded)
    with np.errstate(all="ignore"):
        env = execute(mg, staged, FLOAT_SEMANTICS, ctx, pairs=False)
    return {name: np.asarray(env[t], dtype=np.float64) for name, t in mg.output_tensors.items()}


def node_samples(mg: KernelGraph, inputs: Mapping[str, Any], wanted: set[int],
                 pick: Callable[[Any], Any], outputs: dict | None = None) -> dict[int, Any]:
    """``pick(value)`` of the float64 value of each node whose id is in ``wanted``: a
    block-graph node of a custom kernel (over all blocks at once, grid dims first; a loop
    node in the first iteration), a predefined kernel's node or an input tensor's node
    (the verifier's static float-safety checks inside kernels read these). ``outputs``:
    filled with the run's outputs by name (``evaluate_float``'s values, not run again)."""
    staged = validated_plans(mg)
    got = {id(n): pick(np.asarray(inputs[name])) for name, n in mg.inputs.items()
           if id(n) in wanted}
    block: dict[int, int] = {}  # id(vectorised node) -> id(block node)
    for k, plan in zip(mg.kernels, staged):
        if isinstance(k, PredefinedKernel):
            block.update({id(n): id(n) for n in plan.nodes()})
        else:
            for table in (plan.loop_map, plan.post_map):
                block.update({id(new): old for old, new in table.items()})
    want = {v for v, old in block.items() if old in wanted}

    def record(fn):
        def apply(ctx, n, *xs):
            value = fn(ctx, n, *xs)
            if id(n) in want and block[id(n)] not in got:
                got[block[id(n)]] = pick(value)
            return value
        return apply

    table = {op: record(fn) for op, fn in FLOAT_SEMANTICS.items()}
    with np.errstate(all="ignore"):
        env = execute(mg, staged, table, float_ctx(mg, inputs, None, False), pairs=False,
                      keep=want)
    if outputs is not None:
        outputs.update({name: np.asarray(env[t], dtype=np.float64)
                        for name, t in mg.output_tensors.items()})
    return got


def evaluate_field(mg: KernelGraph, ctx) -> dict[str, tuple]:
    """Run ``mg`` over Z_p x Z_q with the trial ``ctx`` (inputs already set); pairs by output."""
    mg.check_lax()
    staged = validated_plans(mg)
    ctx.needs_q = needs_q(mg, staged)
    ctx.needs_p = needs_p(mg, staged, ctx.needs_q)
    env = execute(mg, staged, FIELD_SEMANTICS, ctx, pairs=True)
    return {name: env[t] for name, t in mg.output_tensors.items()}
