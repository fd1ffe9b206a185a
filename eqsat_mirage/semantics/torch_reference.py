"""A plain-torch implementation of a program: one torch op per kernel-level op.

``torch_reference(program)`` is used where a program must run as torch without
Triton: the ``torch.compile`` backend on CPU tensors (``dynamo/backend.py``), and the
"torch eager" column of ``bench/gpu_bench.py``. torch is imported on first use.

It is also the reference of the checked first launch (``runtime.check``, which takes a
plain callable): ``checked_against(run, program)`` builds it from the input program,
with the program's dtype tolerance (``program_tolerance``) and the kernels that write
each output (``writers``).

A ``MuGraph`` runs kernel by kernel: a predefined kernel as its op, a custom kernel
with a ``source`` as that kernel-level fragment, and a custom kernel without one (the
two kernels of a split reduction: partial results, then their combination) as its
block graph, tiled: every block at once (``torch.func.vmap`` over the grid), the loop
iterations in order with their accumulators and running maxima, as the generated code
runs it. Only the ``KernelGraph`` protocol of ``mugraph/kernels.py`` is read (this
stage sits below ``mugraph``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping

from ..ir.errors import MirageError
from ..ir.node import (
    BINARY,
    BIT_OPS,
    COMPARE,
    LOGIC,
    REDUCE,
    UNARY,
    Op,
    slice_index,
    tile_split,
    toposort,
)
from ..ir.node import QUANT_DTYPES as INT_VALUES
from ..ir.node import QUANT_RANGE as INT_RANGE
from ..ir.ops import SPECS
from ..runtime.check import CheckedLaunch, checked, tolerance


def torch_reference(program) -> Callable:
    """A plain torch function ``fn(**tensors) -> {output: tensor}`` computing ``program``.

    ``program`` is a kernel-level ``em.Graph`` or a ``MuGraph``. A Graph's nodes are
    walked in order with one torch op per kernel-level op; constants stay Python floats
    so tensors keep their dtype (the tensors given, not the graph's declared dtypes);
    mixed-dtype matmul and concat operands are promoted to a common dtype. A MuGraph
    runs kernel by kernel (see the module docstring); a custom kernel without a source
    computes its tiles in float32 and writes its tensors in their declared dtypes.
    """
    ops = _TorchOps()
    if hasattr(program, "kernels"):
        return _mugraph_fn(program.validate(), ops)
    nodes = program.nodes()
    outputs = dict(program.outputs)

    def fn(**tensors):
        env = ops.walk(nodes, tensors)
        return {name: env[id(n)] for name, n in outputs.items()}

    return fn


def program_tolerance(program) -> float:
    """The launch check's relative tolerance for ``program`` (a Graph or a MuGraph): that
    of its coarsest value dtype (``runtime.check.tolerance``)."""
    if hasattr(program, "kernels"):  # a MuGraph: its tensors' dtypes
        return tolerance({spec.dtype for spec in program.tensors.values()})
    return tolerance({n.dtype for n in program.nodes()})


def writers(mugraph) -> dict[str, str]:
    """Output name -> the name of the kernel of ``mugraph`` that writes it."""
    by_tensor = {}
    for k in mugraph.kernels:
        outs = [k.output] if k.kind == "predefined" else list(k.outputs)
        by_tensor.update({t: k.name for t in outs})
    return {o: by_tensor.get(t, "?") for o, t in mugraph.output_tensors.items()}


def checked_against(run: Callable, program, names: list[str] | None = None,
                    mugraph=None) -> CheckedLaunch:
    """``run`` (a compiled ``program``, e.g. ``res.compile()``'s launcher) with a checked
    first launch per input signature (``runtime.check``) against ``program`` run by torch
    (``torch_reference``); ``program``: the input program (a kernel-level Graph, or a
    MuGraph when no input program is known); ``names``: the inputs in order (default:
    ``program``'s); ``mugraph``: the program compiled, whose kernels the error names."""
    names = list(names if names is not None else program.inputs)
    kernels = writers(mugraph) if mugraph is not None else {}
    return checked(run, torch_reference(program), names, program_tolerance(program), kernels)


_INFIX = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
          "==": operator.eq, "!=": operator.ne}


class _TorchOps:
    """One torch op per kernel-level op, and the walk over a list of nodes."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        # the elementwise ops from their specs' torch functions (cast: by code, below)
        self.unary = {op: s.torch_callable() for op, s in SPECS.items()
                      if op in UNARY and op not in (Op.CAST, *BIT_OPS)}
        # the bool masks' logical not, and, or (torch.logical_*: a bool tensor)
        self.logic = {op: SPECS[op].torch_callable() for op in LOGIC}
        self.binary = {op: s.torch_callable() for op, s in SPECS.items() if op in BINARY}
        self.reduce = {op: s.torch_callable() for op, s in SPECS.items() if op in REDUCE}
        # the comparisons by their infix operators (a constant operand may come first)
        self.compare = {op: _INFIX[SPECS[op].symbol] for op in COMPARE}

    def cast(self, xs) -> list:
        """Operands of mixed dtypes promoted to a common one (torch.matmul/cat need one)."""
        dtypes = {x.dtype for x in xs}
        if len(dtypes) == 1:
            return xs
        common = dtypes.pop()
        for d in dtypes:
            common = self.torch.promote_types(common, d)
        return [x.to(common) for x in xs]

    def apply(self, n, xs: list):
        """The value of non-INPUT node ``n`` on operand values ``xs``."""
        torch = self.torch
        if n.op is Op.CONST:
            return float(n.arg)
        if n.op in self.unary:
            return self.unary[n.op](xs[0])
        if n.op in self.logic:
            return self.logic[n.op](*xs)
        if n.op in self.binary:
            return self.binary[n.op](*xs)
        if n.op in self.compare:
            out = self.compare[n.op](*xs)
            return out if isinstance(out, torch.Tensor) else torch.tensor(bool(out))
        if n.op is Op.MATMUL:
            return torch.matmul(*self.cast(xs))
        if n.op in (Op.SUM, Op.MEAN, Op.MAX):
            axes, keep = n.arg
            red = self.reduce[n.op]
            # torch reduces over every axis for dim=(): an empty reduction is the identity
            return red(xs[0], dim=tuple(axes), keepdim=bool(keep)) if axes else xs[0]
        if n.op is Op.TRANSPOSE:
            return xs[0].permute(*n.arg)
        if n.op is Op.RESHAPE:
            return xs[0].reshape(*n.arg)
        if n.op is Op.CONCAT:
            return torch.cat(self.cast(xs), dim=n.arg)
        if n.op is Op.CAST:  # (a constant, a Python float here, cast: a 0-dim tensor)
            x = xs[0] if isinstance(xs[0], torch.Tensor) else torch.tensor(xs[0])
            if n.arg in INT_VALUES and x.is_floating_point():  # integer values held as
                lo, hi = INT_RANGE[n.arg]  # floats (a tile): wrapped as an integer cast is
                x = torch.remainder(x - lo, hi - lo + 1) + lo
            return x.to(getattr(torch, n.arg))
        if n.op in BIT_OPS:  # x & mask, x >> shift (integer values held as floats: as ints)
            x = xs[0] if not xs[0].is_floating_point() else xs[0].to(torch.int64)
            return SPECS[n.op].torch_callable()(x, n.arg).to(getattr(torch, n.dtype))
        if n.op is Op.SLICE:
            return xs[0][slice_index(n.arg)]
        if n.op is Op.CAUSAL:
            return torch.ones(n.arg[:2], dtype=torch.bool).tril(n.arg[2])
        if n.op is Op.WHERE:
            return torch.where(xs[0].bool(), xs[1], xs[2])
        if n.op is Op.MASK:
            return torch.where(xs[0].bool(), xs[1], float("-inf"))
        if n.op is Op.GATHER:
            return self.gather(n, *xs)
        if n.op is Op.TAKE_ALONG_AXIS:
            return self.take_along_axis(n, *xs)
        raise MirageError(f"torch_reference: no torch op for {n.describe()}")

    def gather(self, n, table, idx):
        """GATHER by ``torch.index_select`` of the flattened indices, checked first: an
        index out of range raises ``IndexRangeError`` naming the node (never a read past
        the table, nor a device-side assert)."""
        flat = self.checked(n, table, idx.reshape(-1).long())
        return self.torch.index_select(table, n.arg, flat).reshape(n.shape)

    def take_along_axis(self, n, table, idx):
        """TAKE_ALONG_AXIS by ``torch.gather``, the indices checked first as a gather's."""
        return self.torch.gather(table, n.arg, self.checked(n, table, idx.long()))

    def checked(self, n, table, idx):
        """``idx`` (int64), or an ``IndexRangeError`` naming gather ``n`` for an index out of
        ``[0, rows)``, ``rows`` the size of the table's axis ``n.arg``."""
        from .gather import IndexRangeError

        rows = table.shape[n.arg]
        if idx.numel() and (bool((idx < 0).any()) or bool((idx >= rows).any())):
            bad = int(idx[(idx < 0) | (idx >= rows)].reshape(-1)[0])
            raise IndexRangeError(f"{n.describe()}: index {bad} is out of range for an axis "
                                  f"of {rows} (indices lie in [0, {rows}))")
        return idx

    def walk(self, nodes, leaves: Mapping, env: dict | None = None) -> dict:
        """Evaluate ``nodes`` (in order) into ``env`` (id(node) -> value); INPUT nodes are
        looked up by name in ``leaves``."""
        env = {} if env is None else env
        for n in nodes:
            env[id(n)] = leaves[n.arg] if n.op is Op.INPUT else self.apply(
                n, [env[id(s)] for s in n.srcs])
        return env


def _mugraph_fn(mg, ops: _TorchOps) -> Callable:
    """``fn(**tensors)`` running MuGraph ``mg`` kernel by kernel."""
    steps: list[Callable[[dict], dict]] = []
    for k in mg.kernels:
        if k.kind == "predefined":
            outs = {k.output: k.node}
        elif k.source is not None:
            outs = dict(k.source.outputs)
        else:
            steps.append(_tiled(k, mg.tensors, ops))
            continue
        nodes = toposort(list(outs.values()))

        def step(env: dict, nodes=nodes, outs=outs) -> dict:
            vals = ops.walk(nodes, env)
            return {t: vals[id(n)] for t, n in outs.items()}
        steps.append(step)

    def fn(**tensors):
        env = {name: tensors[name] for name in mg.inputs}
        for step in steps:
            env.update(step(env))
        return {name: env[t] for name, t in mg.output_tensors.items()}

    return fn


def _cut(x, imap: Mapping[int, int], fmap: int | None, grid: tuple[int, ...], forloop: int):
    """The tiles of ``x`` for every block: shape (*grid, [F,] *tile). A dim in both maps is
    cut by the grid first, then each block's part by the loop; a grid axis that ``x`` is
    not cut along is broadcast (every block reads the same tile)."""
    split, grid_pos, loop_pos, tile_pos = tile_split(tuple(x.shape), imap, fmap, grid, forloop)
    order = [grid_pos[a] for a in sorted(grid_pos)] + (
        [loop_pos] if loop_pos is not None else []) + tile_pos
    y = x.reshape(split).permute(order)
    ones = tuple(grid[a] if a in grid_pos else 1 for a in range(len(grid)))
    loop = (forloop,) if loop_pos is not None else ()
    tile = tuple(split[p] for p in tile_pos)
    return y.reshape(ones + loop + tile).expand(grid + loop + tile)


def _place(v, omap: Mapping[int, int], fmap: int | None, grid: tuple[int, ...], shape):
    """The device tensor of ``shape`` whose blocks' tiles are ``v``: (*grid, [F,] *tile)."""
    g, off = len(grid), (1 if fmap is not None else 0)
    perm = [a for a in range(g) if a not in omap.values()]  # size-1 axes (validated)
    for d in range(v.dim() - g - off):
        if d in omap:
            perm.append(omap[d])
        if d == fmap:
            perm.append(g)
        perm.append(g + off + d)
    return v.permute(perm).reshape(shape)


def _tiled(k, specs: Mapping, ops: _TorchOps) -> Callable[[dict], dict]:
    """A step running custom kernel ``k`` by its block graph (every block at once)."""
    torch = ops.torch
    grid, forloop = tuple(k.grid), k.forloop
    loop_outs, post_outs = dict(k.loop.outputs), dict(k.post.outputs)
    loop_nodes = k.loop.nodes()
    post_nodes = k.post.nodes() if post_outs else []
    runs = k.running_inputs()  # loop tile -> max accumulator
    rescaled = k.rescaled()  # sum accumulator -> the max accumulator that rescales it
    reads: set[int] = set()  # loop nodes reading a running maximum: after its update
    for n in loop_nodes:
        if (n.op is Op.INPUT and n.arg in runs) or any(id(s) in reads for s in n.srcs):
            reads.add(id(n))
    first = [n for n in loop_nodes if id(n) not in reads]
    rest = [n for n in loop_nodes if id(n) in reads]
    written = {t: bo for t, bo in k.outputs.items() if bo.stage == "loop"}
    tile_of = {t: k.output_node(t).shape for t in k.outputs}

    def usable(m):  # -inf (nothing kept yet) reads as 0: exp(x - m) stays 0, not NaN
        return torch.where(torch.isneginf(m), torch.zeros_like(m), m)

    def block(fixed: dict, looped: dict) -> dict:
        accs: dict = {}
        running: dict = {}
        parts: dict[str, list] = {t: [] for t in written}
        for f in range(forloop):
            tiles = {**fixed, **{name: v[f] for name, v in looped.items()}}
            env = ops.walk(first, tiles)
            before = dict(running)
            for a in k.maxima:  # m_f = max(m_{f-1}, v_f)
                v = env[id(loop_outs[a])]
                running[a] = v if a not in running else torch.maximum(running[a], v)
            for run, a in runs.items():
                tiles[run] = usable(running[a])
            ops.walk(rest, tiles, env)
            for a in k.accumulators:
                if a in k.maxima:
                    accs[a] = running[a]
                    continue
                v = env[id(loop_outs[a])]
                if f == 0:
                    accs[a] = v
                    continue
                if a in rescaled:  # acc * exp(m_{f-1} - m_f) + value_f
                    m = rescaled[a]
                    accs[a] = accs[a] * torch.exp(before[m] - usable(running[m]))
                accs[a] = accs[a] + v
            for t in written:
                parts[t].append(env[id(loop_outs[t])])
        post = ops.walk(post_nodes, {**fixed, **accs})
        out = {}
        for t, bo in k.outputs.items():
            if bo.stage == "post":
                v = post[id(post_outs[t])]
            elif bo.fmap is None:
                v = parts[t][-1]  # every iteration writes the same tile: the last one stays
            else:
                v = torch.stack([torch.as_tensor(p).expand(tile_of[t]) for p in parts[t]])
            out[t] = torch.as_tensor(v).expand(((forloop,) if bo.fmap is not None else ())
                                               + tile_of[t])
        return out

    batched = block
    for _ in grid:
        batched = torch.func.vmap(batched)

    def step(env: dict) -> dict:
        given = [env[bi.tensor] for bi in k.inputs.values()]
        dtype = torch.float64 if any(x.dtype == torch.float64 for x in given) else \
            torch.float32  # tiles in float32, as the generated code computes them
        fixed, looped = {}, {}
        for bi in k.inputs.values():
            tiles = _cut(env[bi.tensor].to(dtype), bi.imap, bi.fmap, grid, forloop)
            (looped if bi.fmap is not None else fixed)[bi.name] = tiles
        if fixed or looped:
            got = batched(fixed, looped)
        else:  # nothing to cut: one block's tiles, the same for every block
            got = {t: v.expand(grid + tuple(v.shape)) for t, v in block({}, {}).items()}
        out = {}
        for t, bo in k.outputs.items():
            spec = specs[t]
            if math.prod(spec.shape) != got[t].numel():
                raise MirageError(f"torch_reference: kernel {k.name!r} output {t!r}: "
                                  f"{tuple(got[t].shape)} tiles do not fill {spec.shape}")
            out[t] = _place(got[t], bo.omap, bo.fmap, grid, spec.shape).to(
                getattr(torch, spec.dtype))
        return out

    return step
