"""The cheapest cut of a program's op DAG: a minimum s-t cut over tensor bytes.

A cut splits the ops of a DAG into a first part ``D`` (closed under
producers: every operand of an op in ``D`` is in ``D``) and the rest. Its price
is the bytes of the tensors made in ``D`` and read outside it: each one makes a
round trip through device memory. ``cheapest_cut`` finds the ``D`` of least
price that holds every op of ``first`` and none of ``rest``.

The classic construction (each op split into an in and an out vertex joined by
an edge of the op's price, infinite edges from an op's out vertex to its
consumers' in vertices and back from each consumer to its producers) turns it
into a maximum flow. Augmenting paths are found breadth first (Edmonds-Karp);
the graphs here have hundreds of vertices at most. Of all cheapest cuts the
one with the smallest ``D`` is returned (the vertices the source still reaches
in the residual graph), or with ``latest`` the one with the largest (those that cannot
reach the sink); either way cuts for growing ``first`` sets are nested.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping

INF = float("inf")


def cheapest_cut(ops: Iterable[Hashable], operands: Mapping[Hashable, Iterable[Hashable]],
                 price: Mapping[Hashable, float], first: Iterable[Hashable],
                 rest: Iterable[Hashable], latest: bool = False) -> tuple[set, float]:
    """(``D``, its price): the cheapest producer-closed set of ``ops`` holding ``first``
    and none of ``rest``. ``operands[op]`` lists the op's operands among ``ops`` (others
    are ignored); ``price[op]`` is what it costs for op's tensor to leave ``D``. The price
    is infinite when no such cut exists (an op of ``rest`` feeds one of ``first``). Of the
    cheapest cuts, the one with the smallest ``D``, or with ``latest`` the largest.
    """
    ops = list(ops)
    members = set(ops)
    cap: dict[tuple, dict[tuple, float]] = {}

    def edge(a: tuple, b: tuple, c: float) -> None:
        cap.setdefault(a, {})
        cap.setdefault(b, {})
        cap[a][b] = cap[a].get(b, 0.0) + c
        cap[b].setdefault(a, 0.0)

    src, dst = ("s",), ("t",)
    for op in ops:
        edge(("in", op), ("out", op), float(price[op]))
        for x in operands.get(op, ()):
            if x in members:
                edge(("out", x), ("in", op), INF)  # op's tensor read outside D: pay price[x]
                edge(("in", op), ("in", x), INF)  # op in D -> its operands in D
    for op in first:
        edge(src, ("in", op), INF)
    for op in rest:
        edge(("in", op), dst, INF)
    if src not in cap or dst not in cap:
        return {op for op in ops if ("in", op) in _reach(cap, src)}, 0.0
    total = 0.0
    while True:
        parent = _path(cap, src, dst)
        if parent is None:
            break
        flow, v = INF, dst
        while v != src:
            u = parent[v]
            flow = min(flow, cap[u][v])
            v = u
        if flow == INF:
            return set(), INF
        v = dst
        while v != src:
            u = parent[v]
            cap[u][v] -= flow
            cap[v][u] += flow
            v = u
        total += flow
    if latest:  # everything that cannot reach the sink in the residual graph
        back = {u: {v: cap[v][u] for v in cap[u]} for u in cap}
        gone = _reach(back, dst)
        return {op for op in ops if ("in", op) not in gone}, total
    seen = _reach(cap, src)
    return {op for op in ops if ("in", op) in seen}, total


def _path(cap: dict, src: tuple, dst: tuple) -> dict | None:
    """Parents along a shortest augmenting path from ``src`` to ``dst``, None if none."""
    parent = {src: src}
    queue = deque([src])
    while queue:
        u = queue.popleft()
        for v, c in cap[u].items():
            if c > 1e-9 and v not in parent:
                parent[v] = u
                if v == dst:
                    return parent
                queue.append(v)
    return None


def _reach(cap: dict, src: tuple) -> set:
    """Vertices reachable from ``src`` over edges with capacity left."""
    seen = {src}
    queue = deque([src])
    while queue:
        u = queue.popleft()
        for v, c in cap.get(u, {}).items():
            if c > 1e-9 and v not in seen:
                seen.add(v)
                queue.append(v)
    return seen
