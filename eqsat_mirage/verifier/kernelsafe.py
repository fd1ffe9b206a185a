"""The static float-safety checks inside a MuGraph's kernels (docs/verifier.md, section 5).

``floatsafe`` compares two Graphs value by value. A MuGraph candidate computes its values
in kernels: predefined kernels (one op over device tensors) and custom kernels, whose
block graphs compute tiles in float32 registers and round where the generated code
rounds: a cast to a half type (``.to(tl.float16)``), a tensor-core matmul's operands (read
in the matmul's dtype), and a store into a device tensor of a half dtype. The two checks
of ``floatsafe`` are made there:

- **narrowing**: each rounding point to float16 or bfloat16 is put in correspondence with
  the input program's values by its float64 value on one draw (both programs evaluated
  in float64, the MuGraph through the tiled interpreter; samples of up to seven nonzero
  elements of the rounded tile, found, relative 1e-9, among the values of an input
  program node that depends on the same inputs); a value the input computes must be
  rounded to a dtype at least as wide as one the input computes it in; a value it does
  not compute, to one at least as wide as some dtype the input computes in on the same
  inputs. An input tensor rounded to its own dtype needs no search.
- **unguarded exp**: every exp of the MuGraph (predefined or in a block graph) whose
  inputs overlap those of a max-subtracted exp of the input program must be
  max-subtracted too, following block inputs to the kernels that wrote their tensors and
  running maxima (``CustomKernel.running``) to their max.

``kernel_check`` returns the reason for a refusal naming the kernel and the op, or "".
"""

from __future__ import annotations

import numpy as np

from ..ir.node import Node, Op
from ..semantics.floating import FLOAT_SEMANTICS, float_ctx
from ..semantics.interp import run
from .floatsafe import at_least, guarded, input_deps

_HALF = ("float16", "bfloat16")
_SAMPLES = 7
_MATCH = 1e-9  # relative: tiled sums in float64 differ from the input's in the last bits
_SKIP = {Op.INPUT, Op.CONST, Op.CAUSAL, Op.MASK, Op.WHERE}


class _Producers:
    """Each MuGraph node that stands for another value (a block input tile, an
    accumulator read after the loop, a running maximum, a predefined kernel's operand),
    mapped to the node that computes it, with the kernel and stage of every node."""

    def __init__(self, mg) -> None:
        self.given = {id(n): name for name, n in mg.inputs.items()}
        tensor: dict[str, Node] = dict(mg.inputs)
        self.map: dict[int, Node] = {}
        self.where: dict[int, tuple[str, str]] = {}
        for k in mg.kernels:
            if k.kind == "predefined":
                for n in _nodes([k.node]):
                    if n.op is Op.INPUT:
                        self.map[id(n)] = tensor[n.arg]
                    else:
                        self.where[id(n)] = (k.name, "kernel")
                tensor[k.output] = k.node
                continue
            runs = k.running_inputs()
            for stage, graph in (("loop", k.loop), ("post", k.post)):
                for n in graph.nodes():
                    if n.op is not Op.INPUT:
                        self.where[id(n)] = (k.name, stage)
                    elif n.arg in k.inputs:
                        self.map[id(n)] = tensor[k.inputs[n.arg].tensor]
                    elif n.arg in runs:
                        self.map[id(n)] = k.loop.outputs[runs[n.arg]]
                    elif n.arg in k.accumulators:
                        self.map[id(n)] = k.loop.outputs[n.arg]
            for t in k.outputs:
                tensor[t] = k.output_node(t)

    def resolve(self, n: Node) -> Node:
        """The node computing the value ``n`` stands for (``n`` itself when it computes)."""
        while id(n) in self.map:
            n = self.map[id(n)]
        return n

    def deps(self, n: Node, memo: dict) -> frozenset:
        """The MuGraph inputs ``n`` depends on."""
        stack = [n]
        while stack:
            m = self.resolve(stack[-1])
            if id(m) in memo:
                memo[id(stack.pop())] = memo[id(m)]
                continue
            if id(m) in self.given:
                memo[id(m)] = frozenset((self.given[id(m)],))
                continue
            todo = [s for s in m.srcs if id(self.resolve(s)) not in memo]
            if todo:
                stack.extend(todo)
                continue
            memo[id(m)] = frozenset().union(*(memo[id(self.resolve(s))] for s in m.srcs))
        return memo[id(self.resolve(n))]


def _nodes(roots: list[Node]) -> list[Node]:
    out, seen, stack = [], set(), list(roots)
    while stack:
        n = stack.pop()
        if id(n) not in seen:
            seen.add(id(n))
            out.append(n)
            stack.extend(n.srcs)
    return out


def _all_nodes(mg) -> list[tuple[Node, str, str]]:
    """(node, kernel name, stage) of every op node of the MuGraph's kernels."""
    out = []
    for k in mg.kernels:
        if k.kind == "predefined":
            out += [(n, k.name, "kernel") for n in _nodes([k.node]) if n.op is not Op.INPUT]
        else:
            out += [(n, k.name, stage) for stage, g in (("loop", k.loop), ("post", k.post))
                    for n in g.nodes() if n.op is not Op.INPUT]
    return out


def _describe(n: Node, kernel: str, stage: str) -> str:
    loc = f" (from {n.loc})" if n.loc else ""
    return f"kernel {kernel!r}, {stage} op {n.op.name.lower()} {tuple(n.shape)}{loc}"


def unguarded_exp(a, mg, prod: _Producers) -> str:
    """Why the MuGraph ``mg`` takes an exp without the max subtraction the input program
    ``a`` has, or ""."""
    da = input_deps(a)
    safe = [da[id(n)] for n in a.nodes() if n.op is Op.EXP and guarded(n.srcs[0])]
    bare = [da[id(n)] for n in a.nodes() if n.op is Op.EXP and not guarded(n.srcs[0])]
    if not safe:
        return ""
    memo: dict = {}
    for n, kernel, stage in _all_nodes(mg):
        if n.op is Op.EXP and not guarded(n.srcs[0], prod.resolve):
            d = prod.deps(n, memo)
            if any(s & d for s in safe) and not any(s & d for s in bare):
                return (f"{_describe(n, kernel, stage)} takes an argument that is not "
                        "max-subtracted where the input program subtracts the row max "
                        "(exp(s - max s)): it overflows for large s")
    return ""


def _rounding_points(mg) -> list[tuple[Node, str, str, str, str]]:
    """(value node, dtype, kernel, stage, what) for every place the MuGraph's code rounds a
    value to a half dtype: casts, tensor-core matmul operands, stores, predefined ops."""
    out = []
    for k in mg.kernels:
        if k.kind == "predefined":
            for n in _nodes([k.node]):
                if n.op not in _SKIP and n.dtype in _HALF:
                    out.append((n, n.dtype, k.name, "kernel", n.op.name.lower()))
            continue
        specs = k.output_specs()
        for stage, g in (("loop", k.loop), ("post", k.post)):
            for n in g.nodes():
                if n.op is Op.CAST and n.arg in _HALF:
                    out.append((n, n.arg, k.name, stage, f"cast to {n.arg}"))
                elif n.op is Op.MATMUL and n.dtype in _HALF:
                    out += [(s, n.dtype, k.name, stage, f"matmul operand read as {n.dtype}")
                            for s in n.srcs if s.op is not Op.CONST]
        for t in k.outputs:
            if specs[t].dtype in _HALF:
                out.append((k.output_node(t), specs[t].dtype, k.name, k.outputs[t].stage,
                            f"store to {t!r} as {specs[t].dtype}"))
    return out


def _pick(value) -> np.ndarray:
    """Up to ``_SAMPLES`` finite nonzero elements of a value, evenly spaced."""
    v = np.asarray(value)
    if v.size > 4096:  # positions picked without flattening (tiles are broadcast views)
        v = v[np.unravel_index(np.linspace(0, v.size - 1, 4096).astype(np.int64), v.shape)]
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    v = v[np.isfinite(v) & (v != 0.0)]
    if v.size <= _SAMPLES:
        return v
    return v[np.linspace(0, v.size - 1, _SAMPLES).astype(np.int64)]


_MATCH_CHUNK = 1 << 16  # elements of a value searched at a time (``_hits``)


def _hits(uniq: np.ndarray, value) -> set[int]:
    """The indices of the sorted finite values ``uniq`` that some element of ``value``
    equals within ``_MATCH`` (relative). The elements are searched in their memory order
    (a transposed weight's too), ``_MATCH_CHUNK`` at a time in float64, until every value
    is found: the temporaries stay in cache (a 4096 x 11008 weight: one pass, where the
    whole array's copies took 1.2 s). An inf or NaN element matches nothing."""
    v = np.asarray(value)
    if not v.flags.c_contiguous:
        v = v.T if v.T.flags.c_contiguous else np.ascontiguousarray(v)
    flat, hit = v.reshape(-1), set()
    for at in range(0, flat.size, _MATCH_CHUNK):
        part = flat[at:at + _MATCH_CHUNK].astype(np.float64, copy=False)
        i = np.searchsorted(uniq, part)
        for j in (np.minimum(i, uniq.size - 1), np.maximum(i - 1, 0)):
            near = uniq[j]
            with np.errstate(invalid="ignore"):
                ok = np.abs(near - part) <= _MATCH * np.abs(near)
            if ok.any():
                hit.update(np.unique(j[ok]).tolist())
        if len(hit) == uniq.size:
            break
    return hit


def _threatened(a, da: dict, deps: frozenset, dtype: str) -> bool:
    """Whether a node of the input program with inputs ``deps`` has a dtype that ``dtype``
    does not hold (only then can a value rounded to ``dtype`` be found narrowed)."""
    return any(da[id(n)] == deps and n.op is not Op.CONST and n.dtype != "bool"
               and not at_least(dtype, n.dtype) for n in a.nodes())


def _found(a, inputs: dict, groups: list[np.ndarray], deps: list[frozenset],
           dtypes: list[str], outputs: dict | None = None) -> list[set[int]]:
    """For each group of values (rounded to ``dtypes``), the ids of the input program's
    nodes that depend on the same inputs (``deps``: a node computing the same function of
    the inputs does) and hold all of them; the input program is run once in float64, and
    each node's values are searched as they are computed, only for the groups with its
    inputs (the large weights of a benchmark are searched only where a rounded value is
    a function of them alone). A group is not searched for when no node with its inputs
    has a dtype wider than (or incomparable with) its own: whatever is found, nothing is
    refused (an all-float16 program's float16 kernels cost no search). ``outputs``: filled
    with ``a``'s outputs when it ran."""
    da = input_deps(a)
    by_deps: dict[frozenset, list[int]] = {}
    for i, (g, d, dt) in enumerate(zip(groups, deps, dtypes)):
        if len(g) and _threatened(a, da, d, dt):
            by_deps.setdefault(d, []).append(i)
    sets = {}
    for d, idx in by_deps.items():
        uniq, inverse = np.unique(np.concatenate([groups[i] for i in idx]), return_inverse=True)
        sets[d] = (uniq, idx, np.split(inverse, np.cumsum([len(groups[i]) for i in idx])[:-1]))
    out: list[set[int]] = [set() for _ in groups]

    def match(n: Node, value) -> None:
        if n.op is Op.CONST or n.dtype == "bool" or da[id(n)] not in sets:
            return
        uniq, idx, members = sets[da[id(n)]]
        hit = _hits(uniq, value)
        for g, m in zip(idx, members):
            if hit.issuperset(int(x) for x in m):
                out[g].add(id(n))

    def record(fn):
        def apply(ctx, n, *xs):
            value = fn(ctx, n, *xs)
            match(n, value)
            return value
        return apply

    if sets:
        table = {op: record(fn) for op, fn in FLOAT_SEMANTICS.items()}
        with np.errstate(all="ignore"):
            got = run(a, table, float_ctx(a, inputs, None, False))
        if outputs is not None:
            outputs.update(got)
    return out


def narrowing(a, mg, inputs: dict, prod: _Producers, sink: dict | None = None) -> str:
    """Why the MuGraph ``mg`` rounds a value to a narrower dtype than the input program
    ``a`` computes it in, or "" (``inputs``: one float64 draw). ``sink``: its "a" and "b"
    dicts are filled with the outputs of the programs' float64 runs on ``inputs``, where
    they ran (the float64 check on the same draw reads them instead of running again)."""
    sink = sink if sink is not None else {}
    memo: dict = {}
    points = []
    for v, dtype, kernel, stage, what in _rounding_points(mg):
        r = prod.resolve(v)
        if id(r) in prod.given and at_least(dtype, a.inputs[prod.given[id(r)]].dtype):
            continue  # an input rounded to its own dtype: the input program has it so
        points.append((r, prod.deps(v, memo), v, dtype, kernel, stage, what))
    if not points:
        return ""
    da = input_deps(a)
    wanted = {id(r) for r, d, _, dtype, *_ in points if _threatened(a, da, d, dtype)}
    got = mg.node_samples(inputs, wanted, _pick, sink.get("b")) if wanted else {}
    found = _found(a, inputs, [got.get(id(r), np.zeros(0)) for r, *_ in points],
                   [d for _, d, *_ in points], [p[3] for p in points], sink.get("a"))
    by_id = {id(n): n for n in a.nodes()}
    for (_, d, v, dtype, kernel, stage, what), same in zip(points, found):
        where = f"kernel {kernel!r}, {stage}: {what} ({v.op.name.lower()} {tuple(v.shape)}" + (
            f" from {v.loc})" if v.loc else ")")
        if same:
            dts = {by_id[i].dtype for i in same}
            if not any(at_least(dtype, e) for e in dts):
                return (f"{where} rounds to {dtype} a value the input program computes "
                        f"in {', '.join(sorted(dts))}")
            continue
        floor = {n.dtype for n in a.nodes() if n.dtype != "bool" and da[id(n)] & d}
        if floor and not any(at_least(dtype, e) for e in floor):
            return (f"{where} rounds to {dtype}, narrower than every dtype the input program "
                    f"computes in on its inputs ({', '.join(sorted(floor))})")
    return ""


def kernel_check(a, mg, inputs: dict, sink: dict | None = None) -> str:
    """The static float-safety checks of the MuGraph ``mg`` against the Graph ``a`` inside
    its kernels (module docstring): the reason for a refusal, or "" (``sink``: as in
    ``narrowing``)."""
    prod = _Producers(mg)
    return unguarded_exp(a, mg, prod) or narrowing(a, mg, inputs, prod, sink)
