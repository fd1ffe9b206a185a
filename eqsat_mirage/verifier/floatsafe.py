"""The static float-safety checks of ``em.verify`` (docs/verifier.md, section 5).

Two things equal over the reals can differ in floating point, and two of them are seen
from the programs' structure alone:

- **narrowing**: a value of the candidate computed in a narrower dtype than the input
  program computes it (a cast the input did not have: ``x.astype(f16)`` in a float32
  program, ``(x * x)`` squared in float16 where the input upcast first). Values are put
  in correspondence by their float64 values on one random draw (both programs evaluated
  node by node; casts are the identity in float64): a candidate value that the input
  also computes must be in a dtype at least as wide as one the input computes it in; a
  value the input does not compute, at least as wide as some dtype the input program
  computes in on the same inputs. A MuGraph candidate is checked through its device
  tensors: none narrower than every dtype of the input program.
- **unguarded exp**: an exp whose argument the input program max-subtracts
  (``exp(s - max(s))``, softmax) must stay max-subtracted in the candidate (checked on a
  Graph candidate; a MuGraph's running max is left to the float draws).

``static_check`` returns the reason for a refusal, or "".
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.node import VIEWS, Node, Op
from ..semantics.floating import FLOAT_SEMANTICS, float_ctx
from ..semantics.interp import run

# (wider, narrower): float32 holds every float16 and bfloat16 value; those two are
# incomparable (float16 has the bits, bfloat16 the range)
_WIDER = {("float32", "float16"), ("float32", "bfloat16")}
_SKIP = {Op.INPUT, Op.CONST, Op.CAUSAL, Op.MASK, Op.WHERE}
_MOVE = {Op.TRANSPOSE, Op.RESHAPE, Op.CAST, Op.SLICE}


def at_least(d: str, e: str) -> bool:
    """Whether dtype ``d`` holds every value of dtype ``e`` (bool masks: always)."""
    return d == e or (d, e) in _WIDER or "bool" in (d, e)


def is_graph(program) -> bool:
    """A kernel-level Graph (a MuGraph evaluates itself)."""
    return not hasattr(program, "evaluate") and hasattr(program, "nodes")


def input_deps(program) -> dict[int, frozenset]:
    """The input names each node of ``program`` depends on (by ``id`` of the node)."""
    out: dict[int, frozenset] = {}
    for n in program.nodes():
        out[id(n)] = (frozenset((n.arg,)) if n.op is Op.INPUT
                      else frozenset().union(*(out[id(s)] for s in n.srcs)))
    return out


def _sample(value, shape) -> np.ndarray:
    """Seven elements of a node's value at fixed positions, non-finite values clamped."""
    v = np.broadcast_to(np.asarray(value, dtype=np.float64), shape)
    n = v.size
    if n == 0:
        return np.zeros(0)
    flat = np.unique(np.linspace(0, n - 1, 7).astype(np.int64))
    picked = v[np.unravel_index(flat, shape)] if shape else v.reshape(1)
    return np.nan_to_num(picked, nan=0.0, posinf=1e300, neginf=-1e300)


def fingerprints(program, inputs: dict, outputs: dict | None = None
                 ) -> list[tuple[Node, np.ndarray, frozenset]]:
    """(node, sampled float64 value, input names) of every node of a Graph on ``inputs``;
    ``outputs``: filled with the program's outputs by name (``evaluate``'s values)."""
    deps = input_deps(program)
    with np.errstate(all="ignore"):
        env = run(program, FLOAT_SEMANTICS, float_ctx(program, inputs, None, False),
                  outputs=False)
        out = [(n, _sample(env[id(n)], n.shape), deps[id(n)]) for n in program.nodes()]
    if outputs is not None:
        outputs.update({name: env[id(n)] for name, n in program.outputs.items()})
    env.clear()
    return out


def unsampled(program) -> list[tuple[Node, None, frozenset]]:
    """``fingerprints`` without values: (node, None, input names) of every node, with no
    run of the program. All that ``static_check`` reads of the input program when the
    other is not a Graph (a MuGraph's device tensors are compared by dtype: ``narrowing``
    with ``fb`` None)."""
    deps = input_deps(program)
    return [(n, None, deps[id(n)]) for n in program.nodes()]


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    mag = max(float(np.max(np.abs(x), initial=0.0)), float(np.max(np.abs(y), initial=0.0)))
    return mag > 0.0 and x.shape == y.shape and bool(
        np.all(np.abs(x - y) <= 1e-6 * mag))


def _name(n: Node) -> str:
    return f"{n.op.name.lower()} {tuple(n.shape)}" + (f" at {n.loc}" if n.loc else "")


def narrowing(fa: list, b, fb: list | None) -> str:
    """Why ``b`` computes a value in a narrower dtype than the input program, or ""."""
    floor_all = {n.dtype for n, _, _ in fa if n.dtype != "bool"}
    if fb is None:  # a MuGraph: the tensors it computes against every dtype of the input
        given = set(getattr(b, "inputs", ()))  # its inputs are given, not computed
        for name, spec in getattr(b, "tensors", {}).items():
            if name in given or spec.dtype == "bool":
                continue
            if not any(at_least(spec.dtype, e) for e in floor_all):
                return (f"device tensor {name!r} is {spec.dtype}, narrower than every dtype "
                        f"the input program computes in ({', '.join(sorted(floor_all))})")
        return ""
    by_shape: dict = {}
    for n, v, d in fa:
        if n.dtype != "bool":
            by_shape.setdefault(n.shape, []).append((n, v, d))
    for n, v, d in fb:
        # a view holds its source's values in its dtype: the source is what is checked (a
        # transpose of a bfloat16 cast of a float16 input matched the input's samples)
        if n.op in _SKIP or n.op in VIEWS or n.dtype == "bool" or not d:
            continue
        same = [m for m, w, _ in by_shape.get(n.shape, ()) if _same(v, w)]
        if same:
            if not any(at_least(n.dtype, m.dtype) for m in same):
                return (f"{_name(n)} is computed in {n.dtype}; the input program computes "
                        f"the same value in {', '.join(sorted({m.dtype for m in same}))}")
            continue
        floor = {m.dtype for m, _, e in fa if m.dtype != "bool" and e & d}
        if floor and not any(at_least(n.dtype, e) for e in floor):
            return (f"{_name(n)} is computed in {n.dtype}, narrower than every dtype the "
                    f"input program computes in on its inputs ({', '.join(sorted(floor))})")
    return ""


def _strip(n: Node, resolve=None) -> tuple[Node, int]:
    """``n`` through movement, casts, negation and scaling by a constant (and ``resolve``: a
    MuGraph's block inputs to the values they read), with the sign they multiply it by
    (1 or -1; 0 where a constant's sign is not known: a tensor, zero or nan)."""
    sign = 1
    while True:
        if resolve is not None:
            n = resolve(n)
        if n.op in _MOVE:
            n = n.srcs[0]
        elif n.op is Op.NEG:
            n, sign = n.srcs[0], -sign
        elif n.op in (Op.MUL, Op.DIV) and any(s.op is Op.CONST for s in n.srcs):
            if n.op is Op.DIV and n.srcs[0].op is Op.CONST or all(  # c / x: not a scaling
                    s.op is Op.CONST for s in n.srcs):  # of x; c1 * c2: a constant
                return n, sign
            c = next(s for s in n.srcs if s.op is Op.CONST)
            try:
                value = float(c.arg)
            except (TypeError, ValueError):  # not one number
                value = math.nan
            sign = sign * (1 if value > 0 else -1 if value < 0 else 0)
            n = next(s for s in n.srcs if s.op is not Op.CONST)
        else:
            return n, sign


def guarded(arg: Node, resolve=None) -> bool:
    """Whether an exp argument is max-subtracted: ``(s - max(...))`` or ``s + (-max(...))``
    (or ``-(max(...) - s)``: the max enters with a minus sign, whatever the form), through
    movement, casts, constant scaling and masks. ``resolve`` maps a node to the value it
    stands for (a MuGraph's block input tile to the node that wrote its device tensor, a
    running maximum to its max; ``kernelsafe``), or None."""
    return _guarded(arg, resolve, 1)


def _guarded(arg: Node, resolve, outer: int) -> bool:
    """``guarded`` of ``arg`` times the sign ``outer``."""
    n, sign = _strip(arg, resolve)
    sign *= outer
    if n.op is Op.MASK:  # -inf where masked: the kept values are what matter
        n, inner = _strip(next((s for s in n.srcs if s.dtype != "bool"), n.srcs[-1]), resolve)
        sign *= inner
    elif n.op is Op.WHERE:
        return sign != 0 and all(_guarded(s, resolve, sign) for s in n.srcs[1:]
                                 if s.op is not Op.CONST)
    if n.op not in (Op.SUB, Op.ADD) or sign == 0:
        return False
    terms = [(_strip(t, resolve), 1 if i == 0 or n.op is Op.ADD else -1)
             for i, t in enumerate(n.srcs)]
    # a max that enters the argument negated: s - max, s + (-max), -(max - s)
    return any(m.op is Op.MAX and sign * s * how == -1 for (m, s), how in terms)


def unguarded_exp(a, b) -> str:
    """Why ``b`` takes an exp without the max subtraction the input program has, or ""."""
    da, db = input_deps(a), input_deps(b)
    safe = [da[id(n)] for n in a.nodes() if n.op is Op.EXP and guarded(n.srcs[0])]
    bare = [da[id(n)] for n in a.nodes() if n.op is Op.EXP and not guarded(n.srcs[0])]
    if not safe:
        return ""
    for n in b.nodes():
        if n.op is Op.EXP and not guarded(n.srcs[0]):
            d = db[id(n)]
            if any(s & d for s in safe) and not any(s & d for s in bare):
                return (f"exp {tuple(n.shape)}{f' at {n.loc}' if n.loc else ''} takes an "
                        "argument that is not max-subtracted where the input program "
                        "subtracts the row max (exp(s - max s)): it overflows for large s")
    return ""


def static_check(a, b, fa: list | None, fb: list | None) -> str:
    """The reason ``b`` is refused statically, or "" (``fa``/``fb``: ``fingerprints`` of
    the programs, None for a MuGraph)."""
    if fa is None:  # the input program is not a Graph: nothing to compare with
        return ""
    why = narrowing(fa, b, fb)
    if not why and is_graph(b):
        why = unguarded_exp(a, b)
    return why
