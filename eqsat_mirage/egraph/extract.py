"""The ``extract`` pass: DAG-aware extraction over the serialized e-graph.

egglog's own extractor pays a shared subterm once per use (tree cost). Here the
serialized e-graph is read in Python: every tensor e-class gets a representative
IR node (so its shape is known and ill-shaped e-nodes are dropped), e-node
costs come from the cost model, a greedy pass picks a tree-optimal node per
class, the choice is improved by an ILP over the DAG (scipy's HiGHS, with a
time limit) and the k best distinct candidates are produced by banning nodes
of the best one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

# imported with this module, not at the first ILP: under load the import of scipy.optimize
# takes up to 8 s, which inside a search overran extraction's share of its time limit
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from ..cost.per_op import Hardware, graph_cost_us
from ..ir.errors import MirageError, TimeLimitError
from ..ir.limits import Deadline
from ..ir.node import Node
from .encode import build_node, graph_from_outputs
from .view import EGraphView, view


def _tree_best(ev: EGraphView, banned: frozenset = frozenset(),
               deadline: Deadline | None = None) -> dict[str, str]:
    """Per class the e-node of least tree cost (Bellman-Ford style fixpoint);
    ``TimeLimitError`` if ``deadline`` passes first."""
    best: dict[str, float] = {}
    choice: dict[str, str] = {}
    changed = True
    while changed:
        if deadline is not None and deadline.expired():
            raise TimeLimitError("extraction: the cheapest-tree pass did not finish within "
                                 f"the time limit ({len(ev.nodes)} e-nodes)")
        changed = False
        for key, en in ev.nodes.items():
            if key in banned:
                continue
            kids = [c for c in en.children if isinstance(c, str) and c in ev.classes]
            if any(c not in best for c in kids):
                continue
            total = en.cost + sum(best[c] for c in set(kids))
            if total < best.get(en.eclass, float("inf")) - 1e-12:
                best[en.eclass] = total
                choice[en.eclass] = key
                changed = True
    return choice


def _selected(ev: EGraphView, choice: dict[str, str], roots) -> dict[str, str] | None:
    """The choice restricted to classes reachable from ``roots``; None if cyclic/missing."""
    out: dict[str, str] = {}
    state: dict[str, int] = {}

    def visit(c: str) -> bool:
        if state.get(c) == 2:
            return True
        if state.get(c) == 1 or c not in choice:
            return False
        state[c] = 1
        en = ev.nodes[choice[c]]
        for k in en.children:
            if isinstance(k, str) and k in ev.classes and not visit(k):
                return False
        state[c] = 2
        out[c] = choice[c]
        return True
    return out if all(visit(r) for r in roots) else None


def dag_cost(ev: EGraphView, sel: dict[str, str]) -> float:
    """Cost of a selection with every class paid once."""
    return sum(ev.nodes[k].cost for k in sel.values())


ILP_NODE_LIMIT = 2000  # branch-and-bound nodes: the ILP's work bound (its time limit is a cap)


def _ilp(ev: EGraphView, roots, warm: dict[str, str], time_limit_s: float) -> dict | None:
    """Exact DAG extraction as a MILP (HiGHS via scipy), bounded by ``ILP_NODE_LIMIT``
    branch-and-bound nodes and capped at ``time_limit_s``. The benchmarks' MILPs solve at
    the root (0 or 1 nodes, 0.05-0.2 s), so the answer does not depend on the clock."""
    reach: set[str] = set()
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c in reach:
            continue
        reach.add(c)
        for k in ev.classes.get(c, []):
            stack += [x for x in ev.nodes[k].children if isinstance(x, str) and x in ev.classes]
    keys = [k for c in sorted(reach) for k in ev.classes[c]]
    cls = sorted(reach)
    if len(keys) > 4000:
        return None
    ni, ci = {k: i for i, k in enumerate(keys)}, {c: i for i, c in enumerate(cls)}
    nn, nc = len(keys), len(cls)
    nvar = nn + 2 * nc  # x_node, y_class, order_class
    big = float(nc + 1)
    rows: list[tuple[dict[int, float], float, float]] = []
    for c in cls:  # sum of chosen nodes of a class == class used
        row = {ni[k]: 1.0 for k in ev.classes[c]}
        row[nn + ci[c]] = -1.0
        rows.append((row, 0.0, 0.0))
    for k in keys:
        en = ev.nodes[k]
        for ch in {x for x in en.children if isinstance(x, str) and x in ci}:
            rows.append(({ni[k]: 1.0, nn + ci[ch]: -1.0}, -np.inf, 0.0))  # node needs child
            # order: o_parent - o_child >= 1 - big*(1 - x)
            rows.append(({nn + nc + ci[en.eclass]: 1.0, nn + nc + ci[ch]: -1.0, ni[k]: -big},
                         1.0 - big, np.inf))
    a = lil_matrix((len(rows), nvar))
    lo, hi = np.empty(len(rows)), np.empty(len(rows))
    for r, (row, lb, ub) in enumerate(rows):
        for j, v in row.items():
            a[r, j] = v
        lo[r], hi[r] = lb, ub
    lb_var = np.zeros(nvar)
    ub_var = np.concatenate([np.ones(nn + nc), np.full(nc, big)])
    for r in roots:
        lb_var[nn + ci[r]] = 1.0
    cost = np.concatenate([[ev.nodes[k].cost for k in keys], np.zeros(2 * nc)])
    integrality = np.concatenate([np.ones(nn + nc), np.zeros(nc)])
    res = milp(cost, constraints=LinearConstraint(a.tocsr(), lo, hi), bounds=Bounds(lb_var, ub_var),
               integrality=integrality,
               options={"time_limit": time_limit_s, "node_limit": ILP_NODE_LIMIT, "disp": False})
    if res.x is None:
        return None
    choice = {ev.nodes[k].eclass: k for k in keys if res.x[ni[k]] > 0.5}
    sel = _selected(ev, {**warm, **choice}, roots)
    return sel


@dataclass
class Candidate:
    """One extracted program with its predicted cost."""

    program: object
    cost_us: float
    how: str
    keys: dict = field(default_factory=dict)  # id(node) -> the e-node key it was decoded from


def decode(ev: EGraphView, sel: dict[str, str], roots: dict[str, str], template, name: str):
    """Build the Graph a selection stands for (shared classes become shared nodes)."""
    return decode_with_keys(ev, sel, roots, template, name)[0]


def decode_with_keys(ev: EGraphView, sel: dict[str, str], roots: dict[str, str],
                     template, name: str) -> tuple[object, dict[int, str]]:
    """``decode`` plus id(node) -> the key of the e-node each graph node was built from."""
    built: dict[str, Node] = {}
    inputs = template.inputs

    def node(c: str) -> Node:
        if c not in built:
            en = ev.nodes[sel[c]]
            args = [node(x) if isinstance(x, str) and x in ev.classes else x
                    for x in en.children]
            built[c] = build_node(en.ctor, args, inputs)
        return built[c]
    graph = graph_from_outputs(template, {o: node(c) for o, c in roots.items()}, name)
    return graph, {id(n): sel[c] for c, n in built.items()}


def extract(data: dict, roots: dict[str, str], template, ctors, hw: Hardware, k: int = 4,
            ilp_time_s: float = 60.0, encoder=None, deadline: Deadline | None = None
            ) -> tuple[list[Candidate], dict]:
    """The k best distinct candidates (cheapest first) and extraction stats.

    With the ``encoder`` that loaded ``template``, the input program decoded
    from its own terms is appended as a last candidate (how "input"). Under a
    ``deadline`` the ILP and the alternatives stop at it (stats "extract_stop"),
    and a ``TimeLimitError`` is raised if not even the greedy pass finished.
    """
    start = time.perf_counter()
    deadline = deadline or Deadline(None)
    ev = view(data, ctors, template.inputs, hw, deadline)
    root_list = list(roots.values())
    missing = [o for o, c in roots.items() if c not in ev.reps]
    if missing:
        raise MirageError(f"extraction: no well-shaped term for outputs {missing}")
    stats = {"tensor_enodes": len(ev.nodes), "eclasses": len(ev.classes)}
    greedy = _selected(ev, _tree_best(ev, deadline=deadline), root_list)
    found: list[tuple[float, str, dict]] = []
    if greedy is not None:
        found.append((dag_cost(ev, greedy), "greedy-dag", greedy))
    t_ilp = time.perf_counter()
    ilp_s = min(ilp_time_s, deadline.remaining())
    best = _ilp(ev, root_list, greedy or {}, ilp_s) if ilp_s > 0.05 else None
    stats["ilp_seconds"] = time.perf_counter() - t_ilp
    if best is not None:
        found.append((dag_cost(ev, best), "ilp", best))
    if not found:
        raise MirageError("extraction found no acyclic program for the outputs")
    found.sort(key=lambda t: t[0])
    base = found[0][2]
    for key in base.values():  # alternatives: ban one chosen node at a time
        if len(found) >= 4 * k:
            break
        if deadline.expired():
            stats["extract_stop"] = "time limit"
            break
        try:
            alt = _selected(ev, _tree_best(ev, frozenset({key}), deadline), root_list)
        except TimeLimitError:
            stats["extract_stop"] = "time limit"
            break
        if alt is not None:
            found.append((dag_cost(ev, alt), "greedy-dag (alternative)", alt))
    out: list[Candidate] = []
    seen: set[str] = set()
    for _cost, how, sel in sorted(found, key=lambda t: t[0]):
        prog, keys = decode_with_keys(ev, sel, roots, template, f"{template.name}_opt")
        text = str(prog)
        if text in seen:
            continue
        seen.add(text)
        out.append(Candidate(prog, graph_cost_us(prog, hw), how, keys))
        if len(out) >= k:
            break
    out.sort(key=lambda c: c.cost_us)
    if encoder is not None:
        from .boundaries import input_selection

        sel = input_selection(ev, data, encoder)
        if sel is not None:
            prog, keys = decode_with_keys(ev, sel, roots, template, f"{template.name}_opt")
            out.append(Candidate(prog, graph_cost_us(prog, hw), "input", keys))
    stats["extract_seconds"] = time.perf_counter() - start
    return out, stats
