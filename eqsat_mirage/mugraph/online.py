"""Running maxima in the tiled interpreter: the online softmax, for every backend.

A custom kernel's max accumulator ``m`` (``CustomKernel.accumulate(v, "m", how="max")``)
holds the running maximum of its loop value; the loop reads it after this iteration's
update as the tile ``m_run``. Each iteration therefore runs in two parts: the nodes that
read no running maximum (among them the maxima's own values), then the update
``m_f = max(m_{f-1}, v_f)``, then the rest. A sum accumulator whose loop value reads
``m_run`` is rescaled before each addition: ``acc = acc * exp(m_{f-1} - m_f) + value_f``.

The update and the rescale go through the semantics table like every other op (a max over
a stacked pair, a sub, an exp and a mul), so over the finite field the running maximum is
a chain of random row functions and the rescale is ``omega ** (m_{f-1} - m_f)``: exact, so a
rescale that does not cancel (missing, wrong sign, stale) shows up as a difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.node import Node, Op, toposort


@dataclass
class Online:
    """A kernel's running maxima in its vectorised loop program."""

    runs: dict[str, str]  # loop tile name -> max accumulator
    rescaled: dict[str, str]  # sum accumulator -> max accumulator
    first: list[Node]  # loop nodes that read no running maximum, in order
    rest: list[Node]  # the others, in order
    combine: dict[str, Node] = field(default_factory=dict)  # max acc -> MAX over a pair
    scale: dict[str, tuple[Node, Node, Node]] = field(default_factory=dict)  # sub, exp, mul

    def synthetic(self) -> list[Node]:
        """The nodes the update and the rescales evaluate (for the field's part analyses)."""
        return list(self.combine.values()) + [n for t in self.scale.values() for n in t]


def plan_online(k, loop) -> Online | None:
    """The running-maximum plan of kernel ``k`` over its vectorised loop program ``loop``
    (None when the kernel has no max accumulator)."""
    if not k.maxima:
        return None
    runs = k.running_inputs()
    nodes = loop.nodes()
    reads: set[int] = set()
    for n in nodes:
        if (n.op is Op.INPUT and n.arg in runs) or any(id(s) in reads for s in n.srcs):
            reads.add(id(n))
    on = Online(runs, k.rescaled(), [n for n in nodes if id(n) not in reads],
                [n for n in nodes if id(n) in reads])
    for a in k.maxima:
        v = loop.outputs[a]
        pair = Node(Op.INPUT, (), f"{a}\0pair", v.shape + (2,), v.dtype)
        on.combine[a] = Node(Op.MAX, (pair,), ((len(v.shape),), False), v.shape, v.dtype)
    for acc, m in on.rescaled.items():
        mv, av = loop.outputs[m], loop.outputs[acc]
        sub = Node(Op.SUB, (mv, mv), None, mv.shape, "float32")
        ex = Node(Op.EXP, (sub,), None, mv.shape, "float32")
        on.scale[acc] = (sub, ex, Node(Op.MUL, (av, ex), None, av.shape, "float32"))
    return on


def walk(nodes: list[Node], table: Mapping, ctx: Any, leaves: Mapping[str, Any],
         env: dict[int, Any]) -> None:
    """Evaluate ``nodes`` (in order) into ``env``; INPUT nodes are looked up in ``leaves``."""
    for n in nodes:
        if n.op is Op.INPUT:
            env[id(n)] = leaves[n.arg]
        else:
            env[id(n)] = table[n.op](ctx, n, *(env[id(s)] for s in n.srcs))


def _stack(a: Any, b: Any, pairs: bool) -> Any:
    if pairs:
        return tuple(None if x is None or y is None else np.stack(np.broadcast_arrays(x, y),
                                                                  axis=-1)
                     for x, y in zip(a, b))
    return np.stack(np.broadcast_arrays(a, b), axis=-1)


def usable(m: Any, pairs: bool) -> Any:
    """The running maximum the loop subtracts: -inf (a row with nothing kept yet) reads as 0,
    so exp(x - m) and the rescale stay 0 instead of NaN (as FlashAttention does). Field
    values have no -inf: unchanged."""
    if pairs or not np.any(np.isneginf(m)):
        return m
    return np.where(np.isneginf(m), 0.0, m)


def iteration(on: Online, loop, table: Mapping, ctx: Any, tiles: dict[str, Any],
              running: dict[str, Any], pairs: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """One loop iteration with running maxima: returns the loop outputs (a max accumulator's
    entry is its running value) and the running values before this iteration's update."""
    env: dict[int, Any] = {}
    walk(on.first, table, ctx, tiles, env)
    before = dict(running)
    for run, a in on.runs.items():
        value = env[id(loop.outputs[a])]
        if a in running:
            value = table[Op.MAX](ctx, on.combine[a], _stack(running[a], value, pairs))
        running[a] = value
        tiles[run] = usable(value, pairs)
    for a in set(loop.outputs) & set(on.combine) - set(on.runs.values()):
        value = env[id(loop.outputs[a])]  # a maximum nothing in the loop reads
        running[a] = value if a not in running else table[Op.MAX](
            ctx, on.combine[a], _stack(running[a], value, pairs))
    walk(on.rest, table, ctx, tiles, env)
    vals = {name: env[id(n)] for name, n in loop.outputs.items()}
    vals.update({a: running[a] for a in on.combine})
    return vals, before


def rescale(on: Online, table: Mapping, ctx: Any, acc: str, total: Any,
            before: Mapping[str, Any], running: Mapping[str, Any]) -> Any:
    """``total * exp(m_old - m_new)`` for a rescaled sum accumulator (m: its maximum)."""
    m = on.rescaled[acc]
    sub, ex, mul = on.scale[acc]
    factor = table[Op.EXP](ctx, ex, table[Op.SUB](ctx, sub, before[m],
                                                   usable(running[m], isinstance(total, tuple))))
    return table[Op.MUL](ctx, mul, total, factor)


def running_nodes(k, loop) -> list[Node]:
    """The loop nodes whose both parts the field must compute for the running maxima."""
    return toposort([loop.outputs[a] for a in k.maxima]) if k.maxima else []


# -- skipping the tiles a causal mask empties -----------------------------------------------

_KEEPS_ZERO = (Op.TRANSPOSE, Op.RESHAPE)


def causal_skip(k, causal: Mapping[str, tuple],
                runtime_loop: bool = False) -> tuple[Any, tuple] | None:
    """(block input, (rows, cols, offset)) when kernel ``k`` may stop its loop at the last
    tile its causal mask keeps anything of: the mask's columns are the loop (fmap 1), its
    rows are not, and every accumulator's loop value is 0 (a sum) or -inf (a max) wherever
    the mask holds nowhere, so a fully masked tile changes nothing (a max stays, alpha is 1).
    None otherwise. ``causal`` maps the causal mask tensors to their (rows, cols, offset);
    ``runtime_loop``: the loop count is a launch argument (a shape family's kernel), so a
    loop of one iteration at this size still gets the skip."""
    if (k.forloop < 2 and not runtime_loop) or any(bo.stage == "loop" for bo in k.outputs.values()):
        return None
    found = [bi for bi in k.inputs.values() if bi.tensor in causal]
    if len(found) != 1 or found[0].fmap != 1:
        return None
    bi = found[0]
    state: dict[int, str] = {id(k.loop.inputs[bi.name]): "mask"}
    for n in k.loop.nodes():
        kinds = [state.get(id(s)) for s in n.srcs]
        if not any(kinds):
            continue
        state[id(n)] = _masked_state(n, kinds)
    for a in k.accumulators:
        want = "ninf" if a in k.maxima else "zero"
        if state.get(id(k.loop.outputs[a])) != want:
            return None
    return bi, causal[bi.tensor]


def _masked_state(n: Node, kinds: list) -> str:
    """What ``n`` is where the mask holds nowhere: "ninf", "zero", or "" (unknown)."""
    tainted = [x for x in kinds if x]
    if n.op is Op.MASK and kinds[0] == "mask" and not kinds[1]:
        return "ninf"
    if len(tainted) != 1 or "" in tainted or "mask" in tainted:
        return ""
    t = tainted[0]
    if n.op in (Op.SUB, Op.ADD) and t == "ninf" and (n.op is Op.ADD or kinds[0] == "ninf"):
        return "ninf"
    if n.op is Op.EXP and t == "ninf":
        return "zero"
    if n.op is Op.MAX and t == "ninf":
        return "ninf"
    if t == "zero" and (n.op in (Op.MUL, Op.MATMUL, Op.SUM) or n.op in _KEEPS_ZERO or (
            n.op is Op.DIV and kinds[0] == "zero")):
        return "zero"
    if t == "ninf" and n.op in _KEEPS_ZERO:
        return "ninf"
    return ""


def kept_iterations(k, bi, arg: tuple, row_block: int, col_block: int) -> int:
    """Iterations of ``k``'s loop that keep something of the causal mask for the block at
    ``row_block``/``col_block`` of the grid axes mapping the mask's rows and columns."""
    rows_tile, cols_tile = k.loop.inputs[bi.name].shape[:2]
    last_row = row_block * rows_tile + rows_tile - 1 + arg[2]
    first_col = col_block * cols_tile * k.forloop
    return max(0, min(k.forloop, (last_row - first_col) // cols_tile + 1))
