"""The partition pass (pipeline step 2, docs/architecture.md): any program split into Lax pieces.

The verifier decides equivalence only for Lax programs: exp at most once on
any input-to-output path, and masked values (-inf where masked) used only in
ways it follows (``ir.check``). The search handles programs of a few dozen ops
within its limits. ``partition`` cuts a program into pieces that are both:

1. **exp layers.** Each exp's layer is the number of exps on the longest path
   to it (``ir.check.exp_depth``). Between layers k and k+1 the program is cut
   at the cheapest place (``mincut.cheapest_cut``: least bytes written and read
   back) that has every exp of layer <= k before it and every later exp after
   it. Inside each piece no path takes exp twice.
2. **size.** A piece with more than ``max_ops`` ops is cut again at its
   cheapest place between its first and last quarter, recursively.

Cuts avoid two kinds of tensor:

- **attention** (priced 1000x): the score tensor an exp reads (back to its
  matmul) and every value after the exp up to the next matmul (the weights,
  their sum and the normalization), so an attention's two matmuls, its exp and
  its normalization stay in one piece;
- **masked values** (never cut): ``where(mask, x, -inf)`` until an exp or max
  consumes it, since a piece cannot take -inf as an input.

Constants and causal masks are leaves: each piece that reads one recomputes it.
Each ``Piece`` is a ``Graph`` with canonical names (inputs ``in0, in1, ...`` in
order of first use, outputs ``out0, ...``), so pieces that are equal up to
renaming have equal programs and are searched once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..frontend.graph import Graph
from ..ir.check import exp_depth, masked_fact
from ..ir.errors import LaxError
from ..ir.node import ITEMSIZE, Node, Op
from .mincut import INF, cheapest_cut

DEFAULT_PIECE_OPS = 24  # ops per piece: what the search handles within its default limits
ATTENTION_PRICE = 1000.0  # how much dearer it is to cut inside an attention
LEAVES = frozenset({Op.INPUT, Op.CONST, Op.CAUSAL})  # read (or recomputed) by every piece


@dataclass
class Piece:
    """One Lax piece of a partitioned program.

    ``graph`` computes it with canonical names; ``inputs`` maps each of its input
    names to the node of the whole program it reads (a program input, or an op of
    an earlier piece); ``outputs`` maps each output name to the op it returns.
    """

    index: int
    graph: Graph
    ops: list[Node]
    inputs: dict[str, Node] = field(default_factory=dict)
    outputs: dict[str, Node] = field(default_factory=dict)

    def op_names(self) -> list[str]:
        """The ops of the piece, as short names (``matmul``, ``exp``, ...)."""
        return [n.op.name.lower() for n in self.ops]


def compute_ops(graph: Graph) -> list[Node]:
    """The nodes of ``graph`` that are ops (not inputs, constants or causal masks)."""
    return [n for n in graph.nodes() if n.op not in LEAVES]


def needs_partition(graph: Graph, max_ops: int = DEFAULT_PIECE_OPS) -> bool:
    """Whether ``graph`` is larger than one piece, or takes exp twice on a path."""
    depth = exp_depth(graph)
    return len(compute_ops(graph)) > max_ops or max(depth.values(), default=0) > 1


def _prices(ops: list[Node]) -> dict[int, float]:
    """Bytes of each op's tensor; dearer inside attentions; infinite for masked values."""
    price = {id(n): float(math.prod(n.shape) * ITEMSIZE[n.dtype]) for n in ops}
    users: dict[int, list[Node]] = {}
    for n in ops:
        for s in n.srcs:
            users.setdefault(id(s), []).append(n)
    inside: set[int] = set()
    for e in (n for n in ops if n.op is Op.EXP):
        todo = [e]  # forward: the weights, their sums and normalization, to the next matmul
        while todo:
            n = todo.pop()
            if id(n) in inside or (n.op is Op.EXP and n is not e):
                continue
            inside.add(id(n))
            if n.op is not Op.MATMUL:
                todo += users.get(id(n), [])
        todo = list(e.srcs)  # backward: the scores, back to their matmul
        while todo:
            n = todo.pop()
            if n.op in LEAVES or id(n) in inside or id(n) not in price or n.op is Op.EXP:
                continue
            inside.add(id(n))
            if n.op is not Op.MATMUL:
                todo += list(n.srcs)
    masked: dict[int, bool] = {}
    for n in ops:
        try:
            masked[id(n)] = masked_fact(n, [masked.get(id(s), False) for s in n.srcs])
        except LaxError:
            masked[id(n)] = False  # reported by the piece's own Lax check
    for n in ops:
        if masked[id(n)]:
            price[id(n)] = INF
        elif id(n) in inside:
            price[id(n)] *= ATTENTION_PRICE
    return price


def _cut(ops: list[Node], price: dict, first: list[Node], rest: list[Node]) -> set[int]:
    """Ids of the ops before the cheapest cut with ``first`` before it and ``rest`` after."""
    ids = [id(n) for n in ops]
    operands = {id(n): [id(s) for s in n.srcs] for n in ops}
    before, _ = cheapest_cut(ids, operands, price, [id(n) for n in first],
                             [id(n) for n in rest], latest=True)
    return before


def _by_layer(ops: list[Node], price: dict, depth: dict[int, int]) -> list[list[Node]]:
    """The ops cut into exp layers: no path inside a group takes exp twice."""
    top = max((depth[id(n)] for n in ops if n.op is Op.EXP), default=0)
    if top <= 1:
        return [ops]
    groups, done = [], set()
    for k in range(1, top):
        first = [n for n in ops if n.op is Op.EXP and depth[id(n)] <= k]
        rest = [n for n in ops if n.op is Op.EXP and depth[id(n)] > k]
        before = _cut(ops, price, first, rest) | done
        groups.append([n for n in ops if id(n) in before and id(n) not in done])
        done = before
    groups.append([n for n in ops if id(n) not in done])
    return [g for g in groups if g]


def _by_size(ops: list[Node], price: dict, max_ops: int) -> list[list[Node]]:
    """``ops`` (operands first) cut until no group has more than ``max_ops`` ops (a group
    that cannot be cut without cutting a masked value stays whole)."""
    if len(ops) <= max_ops:
        return [ops]
    quarter = max(1, len(ops) // 4)
    before = _cut(ops, price, ops[:quarter], ops[-quarter:])
    head = [n for n in ops if id(n) in before]
    tail = [n for n in ops if id(n) not in before]
    if not head or not tail:  # no finite cut between the quarters: the most central prefix
        ok = [i for i in range(1, len(ops)) if _finite_prefix(ops, i, price)]
        if not ok:
            return [ops]
        half = min(ok, key=lambda i: abs(2 * i - len(ops)))
        head, tail = ops[:half], ops[half:]
    return _by_size(head, price, max_ops) + _by_size(tail, price, max_ops)


def _finite_prefix(ops: list[Node], i: int, price: dict) -> bool:
    """Whether cutting after ``ops[:i]`` reads back no masked value."""
    head = {id(n) for n in ops[:i]}
    return all(price[id(s)] < INF for n in ops[i:] for s in n.srcs if id(s) in head)


def partition(graph: Graph, max_ops: int = DEFAULT_PIECE_OPS) -> list[Piece]:
    """``graph`` cut into Lax pieces of at most ``max_ops`` ops, in execution order."""
    ops = compute_ops(graph)
    price = _prices(ops)
    depth = exp_depth(graph)
    groups = [g for layer in _by_layer(ops, price, depth)
              for g in _by_size(layer, price, max_ops)]
    where = {id(n): i for i, g in enumerate(groups) for n in g}
    read_later = {id(s) for n in ops for s in n.srcs if id(s) in where and
                  where[id(s)] != where[id(n)]}
    read_later |= {id(n) for n in graph.outputs.values()}
    return [_piece(i, g, graph.name, read_later) for i, g in enumerate(groups)]


def _piece(index: int, ops: list[Node], name: str, read_later: set[int]) -> Piece:
    """The canonical Graph of one group of ops."""
    g = Graph(f"{name}_piece")
    mine = {id(n) for n in ops}
    env: dict[int, Node] = {}
    piece = Piece(index, g, ops)
    for n in ops:
        srcs = []
        for s in n.srcs:
            if id(s) not in env and id(s) not in mine:
                if s.op in (Op.CONST, Op.CAUSAL):
                    env[id(s)] = s
                else:
                    inp = f"in{len(g.inputs)}"
                    env[id(s)] = Node(Op.INPUT, (), inp, s.shape, s.dtype, s.loc)
                    g.inputs[inp] = env[id(s)]
                    piece.inputs[inp] = s
            srcs.append(env[id(s)])
        env[id(n)] = Node(n.op, tuple(srcs), n.arg, n.shape, n.dtype, n.loc)
    for n in ops:
        if id(n) in read_later:
            out = f"out{len(g.outputs)}"
            g.outputs[out] = env[id(n)]
            piece.outputs[out] = n
    return piece
