"""A layered layout of a ``Scene`` and its drawing with matplotlib (no Graphviz needed).

Layout (in points, y growing downwards), cluster by cluster from the inside out:
the direct items of a cluster (nodes, and sub-clusters already laid out as one
box) get topological levels by longest path over the edges between them (top
to bottom). An edge that skips levels gets a thin dummy item in every level it
crosses (as in Sugiyama's method), so it bends around the items in between
instead of crossing them; so does an edge entering a cluster below its top row
or leaving it above its bottom row. Each level is ordered by the barycenter of
where its items' incoming edges leave their predecessors, spread horizontally
without overlap and centred under them; a row of sources (the inputs) is then
centred over its successors. Items that edges enter from outside their cluster
are ordered by where those edges come from in the previous pass (one pass per
level of cluster nesting). A cluster's box is its content plus padding and its
title. Panels sit side by side under the scene's title, the legend below them.

Text is measured for DejaVu Sans Mono (matplotlib's bundled monospace font), so
boxes fit their labels without asking a renderer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .scene import CLUSTERS, KINDS, Scene, SCluster, SEdge, SNode

FONT = 7.5  # points
CHAR_EM = 0.602  # DejaVu Sans Mono's advance width, in ems
LINE_EM = 1.3
LINE_H = LINE_EM * FONT
PAD_X, PAD_Y = 5.0, 3.5  # inside a node
H_GAP, V_GAP = 14.0, 26.0  # between items, between levels (room for an edge label)
C_PAD = 8.0  # inside a cluster
PANEL_GAP = 36.0
DUMMY_W = 8.0  # the width a level-skipping edge takes in each level it crosses
MONO = ["DejaVu Sans Mono", "monospace"]  # SVG viewers without DejaVu: any monospace


def text_size(lines: list[str], font: float = FONT) -> tuple[float, float]:
    """Width and height in points of ``lines`` in the monospace font at ``font`` points."""
    return (max((len(s) for s in lines), default=0) * CHAR_EM * font,
            max(len(lines), 1) * LINE_EM * font)


@dataclass
class Layout:
    """Absolute boxes (x, y, w, h) of nodes and clusters, and the whole size."""

    nodes: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    clusters: list[tuple[SCluster, float, float, float, float, int]] = field(default_factory=list)
    routes: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    legend: list[tuple[float, float, tuple[str, str, str, bool]]] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0


Point = tuple[float, float]


@dataclass
class _Box:
    """A laid-out item: size, and what is inside it relative to its top-left corner.

    Edges that skip levels bend around the items between (one bend point per
    level row crossed, top and bottom). ``routes``: the bend points of edges
    with both ends inside; ``enter`` and ``leave``: those of edges coming in
    from outside (from the top to the target's row) and going out (from the
    source's row to the bottom). All by (src, dst) node ids.
    """

    w: float
    h: float
    nodes: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    clusters: list[tuple[SCluster, float, float, float, float, int]] = field(default_factory=list)
    routes: dict[tuple[str, str], list[Point]] = field(default_factory=dict)
    enter: dict[tuple[str, str], list[Point]] = field(default_factory=dict)
    leave: dict[tuple[str, str], list[Point]] = field(default_factory=dict)

    def moved(self, dx: float, dy: float) -> _Box:
        """The same box with everything inside shifted by (dx, dy)."""
        def mv(r: dict) -> dict:
            return {k: [(x + dx, y + dy) for x, y in pts] for k, pts in r.items()}
        return _Box(self.w, self.h,
                    {k: (x + dx, y + dy, w, h) for k, (x, y, w, h) in self.nodes.items()},
                    [(c, x + dx, y + dy, w, h, d) for c, x, y, w, h, d in self.clusters],
                    mv(self.routes), mv(self.enter), mv(self.leave))


def _node_box(n: SNode) -> _Box:
    w, h = text_size(n.lines)
    w, h = w + 2 * PAD_X, h + 2 * PAD_Y
    return _Box(w, h, {n.id: (0.0, 0.0, w, h)})


def _levels(n: int, succ: list[set[int]]) -> list[int]:
    """Longest-path levels of a graph on ``range(n)``; cycles broken at the lowest index."""
    indeg = [0] * n
    for s in succ:
        for j in s:
            indeg[j] += 1
    level, done = [0] * n, [False] * n
    ready = [i for i in range(n) if indeg[i] == 0]
    for _ in range(n):
        if not ready:  # a cycle: take the lowest remaining item
            ready = [min(i for i in range(n) if not done[i])]
        i = min(ready)
        ready.remove(i)
        done[i] = True
        for j in succ[i]:
            if done[j]:
                continue
            level[j] = max(level[j], level[i] + 1)
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return level


def _place_level(items: list[int], want: dict[int, float], widths: list[float]) -> dict[int, float]:
    """Left x of each item: as near ``want`` (its wanted centre) as no overlap allows."""
    xs: dict[int, float] = {}
    right = 0.0
    for i in items:
        x = want[i] - widths[i] / 2
        if xs:
            x = max(x, right + H_GAP)
        xs[i] = x
        right = x + widths[i]
    shift = sum(want[i] - (xs[i] + widths[i] / 2) for i in items) / len(items)
    return {i: x + shift for i, x in xs.items()}


def _order_and_place(rows: list[list[int]], pred: list[dict[int, list[float]]],
                     widths: list[float], rank: dict[int, int]) -> dict[int, float]:
    """Order each row by the barycenter of where its items' incoming edges leave their
    predecessors (``pred``: item -> predecessor -> x offsets in it), place it; left x."""
    left: dict[int, float] = {}
    for row in rows:
        bary: dict[int, float | None] = {}
        for i in row:
            ps = [left[p] + off for p, offs in pred[i].items() if p in left for off in offs]
            bary[i] = sum(ps) / len(ps) if ps else None
        known = [b for b in bary.values() if b is not None]
        fallback = sum(known) / len(known) if known else 0.0
        row.sort(key=lambda i: (bary[i] if bary[i] is not None else fallback, rank.get(i, i)))
        want, run = {}, fallback - (sum(widths[i] for i in row) + H_GAP * (len(row) - 1)) / 2
        for i in row:
            want[i] = bary[i] if bary[i] is not None else run + widths[i] / 2
            run += widths[i] + H_GAP
        for i, x in _place_level(row, want, widths).items():
            left[i] = x
    return left


class _Items:
    """A cluster's direct items (``boxes``) on levels, with a thin dummy item (index ``n``
    on) in every level a long edge crosses: ``chains`` for an edge between items, ``ends``
    for an edge entering the cluster below its top row or leaving it above its bottom row.
    ``pred`` / ``succ_at``: where edges leave an item's predecessors / enter its successors."""

    def __init__(self, boxes: list[_Box], edges: list[SEdge]) -> None:
        self.boxes = boxes
        owner = {nid: i for i, b in enumerate(boxes) for nid in b.nodes}
        n = self.n = len(boxes)
        self.succ: list[set[int]] = [set() for _ in range(n)]
        self.inner: dict[tuple[int, int], list[tuple[str, str]]] = {}
        # ("in"/"out", item) -> edges crossing the cluster's border there
        self.crossing: dict[tuple[str, int], list[tuple[str, str]]] = {}
        for e in edges:
            i, j = owner.get(e.src), owner.get(e.dst)
            if i is not None and j is not None and i != j:
                self.succ[i].add(j)
                self.inner.setdefault((i, j), []).append((e.src, e.dst))
            elif j is not None and i is None:
                self.crossing.setdefault(("in", j), []).append((e.src, e.dst))
            elif i is not None and j is None:
                self.crossing.setdefault(("out", i), []).append((e.src, e.dst))
        self.level = _levels(n, self.succ)
        self.top = max(self.level, default=0)
        self.widths = [b.w for b in boxes]
        self.pred: list[dict[int, list[float]]] = [{} for _ in range(n)]
        self.succ_at: list[dict[int, list[float]]] = [{} for _ in range(n)]
        self.chains: dict[tuple[int, int], list[int]] = {}  # long edge -> its dummies, in order
        self.ends: dict[tuple[str, int], list[int]] = {}
        self._link_all()

    def at(self, i: int, pairs: list[tuple[str, str]], end: int) -> list[float]:
        """x offsets in item ``i`` of the sources (end 0) or targets (end 1) of ``pairs``."""
        return [self.boxes[i].nodes[p[end]][0] + self.boxes[i].nodes[p[end]][2] / 2
                for p in pairs]

    def link(self, a: int | None, b: int | None, leave: list[float],
             enter: list[float]) -> None:
        """An edge from item ``a`` (leaving at ``leave``) to ``b`` (entering at ``enter``)."""
        if a is not None and b is not None:
            self.pred[b].setdefault(a, []).extend(leave)
            self.succ_at[a].setdefault(b, []).extend(enter)

    def chain(self, first: int, last: int) -> list[int]:
        """New dummy items on levels ``first`` to ``last``, linked one to the next."""
        widths = self.widths
        ds = list(range(len(widths), len(widths) + max(0, last - first + 1)))
        for lv in range(first, last + 1):
            widths.append(DUMMY_W)
            self.level.append(lv)
            self.pred.append({})
            self.succ_at.append({})
        for a, b in zip(ds, ds[1:]):
            self.link(a, b, [DUMMY_W / 2], [DUMMY_W / 2])
        return ds

    def _link_all(self) -> None:
        level, at, link, mid = self.level, self.at, self.link, [DUMMY_W / 2]
        for i in range(self.n):
            for j in sorted(self.succ[i]):
                pairs = self.inner[i, j]
                ds = self.chains[i, j] = self.chain(level[i] + 1, level[j] - 1)
                link(i, ds[0] if ds else j, at(i, pairs, 0), mid if ds else at(j, pairs, 1))
                if ds:
                    link(ds[-1], j, mid, at(j, pairs, 1))
        for (way, i), pairs in sorted(self.crossing.items()):
            if way == "in" and level[i] > 0:
                ds = self.ends[way, i] = self.chain(0, level[i] - 1)
                link(ds[-1], i, mid, at(i, pairs, 1))
            elif way == "out" and level[i] < self.top:
                ds = self.ends[way, i] = self.chain(level[i] + 1, self.top)
                link(i, ds[0], at(i, pairs, 0), mid)

    def rows(self) -> list[list[int]]:
        """The items (dummies included) level by level."""
        rows: list[list[int]] = [[] for _ in range(max(self.level, default=-1) + 1)]
        for i, lv in enumerate(self.level):
            rows[lv].append(i)
        return rows


def _order_items(items: _Items, rows: list[list[int]],
                 hints: dict[str, float]) -> dict[int, float]:
    """Each item's left x (``rows`` sorted in place): by barycenter, the items entered from
    outside in the order of their outside sources (``hints``), a row of sources only (the
    inputs) each above its successors."""
    pred, succ_at, widths = items.pred, items.succ_at, items.widths
    hinted = {}
    for (way, i), pairs in items.crossing.items():
        xs = [hints[u] for u, _ in pairs if u in hints]
        if way == "in" and xs:
            hinted[items.ends[way, i][0] if (way, i) in items.ends else i] = sum(xs) / len(xs)
    slots = sorted(hinted)
    rank = dict(zip(sorted(hinted, key=lambda i: (hinted[i], i)), slots))
    left = _order_and_place(rows, pred, widths, rank)
    for row in rows:  # a row of sources only (the inputs): each above its successors
        if any(pred[i] for i in row) or not any(succ_at[i] for i in row):
            continue
        want = {}
        for i in row:
            xs = [left[t] + off for t, offs in succ_at[i].items() for off in offs]
            want[i] = sum(xs) / len(xs) if xs else left[i] + widths[i] / 2
        if not any(i in hinted for i in row):  # else keep the order of the outside sources
            row.sort(key=lambda i: (want[i], i))
        left.update(_place_level(row, want, widths))
    return left


def _stack(cl: SCluster, items: _Items, rows: list[list[int]], left: dict[int, float],
           depth: int) -> _Box:
    """``cl``'s box: its items moved to their rows under its title, the edges' routes
    through the dummies' rows."""
    boxes, widths, n = items.boxes, items.widths, items.n
    x0 = min(left.values(), default=0.0)
    content_w = max((left[i] + widths[i] for i in left), default=0.0) - x0
    tw, th = text_size(cl.title, FONT + 0.5)
    width = max(content_w, tw) + 2 * C_PAD
    offset_x = C_PAD - x0 + (width - 2 * C_PAD - content_w) / 2
    y = C_PAD + th + 4.0
    out = _Box(width, 0.0)
    spans: dict[int, tuple[float, float]] = {}  # dummy -> its row's top and bottom
    moved: list[_Box] = [boxes[0]] * n
    for row in rows:
        row_h = max((boxes[i].h for i in row if i < n), default=0.0)
        for i in row:
            if i >= n:
                spans[i] = (y, y + row_h)
                continue
            dy = y if isinstance(cl.items[i], SCluster) else y + (row_h - boxes[i].h) / 2
            moved[i] = b = boxes[i].moved(left[i] + offset_x, dy)
            out.nodes.update(b.nodes)
            out.clusters.extend(b.clusters)
            out.routes.update(b.routes)
        y += row_h + V_GAP

    def points(ds: list[int]) -> list[Point]:
        return [(left[d] + offset_x + DUMMY_W / 2, yy) for d in ds for yy in spans[d]]

    for (i, j), pairs in items.inner.items():
        for key in pairs:
            out.routes[key] = (moved[i].leave.get(key, []) + points(items.chains[i, j])
                               + moved[j].enter.get(key, []))
    for (way, i), pairs in items.crossing.items():
        pts = points(items.ends.get((way, i), []))
        for key in pairs:
            if way == "in":
                out.enter[key] = pts + moved[i].enter.get(key, [])
            else:
                out.leave[key] = moved[i].leave.get(key, []) + pts
    out.h = y - V_GAP + C_PAD if rows else y + C_PAD
    out.clusters.insert(0, (cl, 0.0, 0.0, out.w, out.h, depth))
    return out


def _layout_cluster(cl: SCluster, edges: list[SEdge], depth: int,
                    hints: dict[str, float]) -> _Box:
    """Lay out ``cl`` (see the module docstring); ``hints``: node x centres from an earlier
    pass, which order the items that edges enter from outside ``cl``."""
    boxes = [_layout_cluster(it, edges, depth + 1, hints) if isinstance(it, SCluster)
             else _node_box(it) for it in cl.items]
    items = _Items(boxes, edges)
    rows = items.rows()
    left = _order_items(items, rows, hints)
    return _stack(cl, items, rows, left, depth)


def layout(scene: Scene) -> Layout:
    """Absolute positions of every node and cluster of ``scene`` (title and legend included)."""
    _, title_h = text_size([scene.title], FONT + 3)
    top = 10.0 + title_h + 8.0
    hints: dict[str, float] = {}
    depth = max((c.clusters_depth() for c in scene.panels), default=0)
    for _ in range(min(depth, 3) + 1):  # each pass orders entered items by the last positions
        lay = _panels(scene, top, hints)
        hints = {k: x + w / 2 for k, (x, _, w, _) in lay.nodes.items()}
    lay.width = max(lay.width, text_size([scene.title], FONT + 3)[0] + 20.0, 560.0)
    # the legend under the panels, wrapped to the picture's width
    y = lay.height + 14.0 + LINE_H + 4.0
    x = 10.0
    for entry in _legend_entries(scene):
        w = 22.0 + text_size([entry[0]])[0] + 14.0
        if x > 10.0 and x + w > lay.width:
            x, y = 10.0, y + LINE_H * 1.3 + 6.0
        lay.legend.append((x, y, entry))
        x += w
    lay.height = y + LINE_H * 1.3 + 10.0
    return lay


def _panels(scene: Scene, top: float, hints: dict[str, float]) -> Layout:
    lay, x = Layout(), 10.0
    for panel in scene.panels:
        box = _layout_cluster(panel, scene.edges, 0, hints).moved(x, top)
        lay.nodes.update(box.nodes)
        lay.clusters.extend(box.clusters)
        lay.routes.update(box.routes)
        x += box.w + PANEL_GAP
        lay.height = max(lay.height, top + box.h)
    lay.width = x - PANEL_GAP + 10.0
    return lay


def _legend_entries(scene: Scene) -> list[tuple[str, str, str, bool]]:
    kinds, clusters = scene.kinds()
    return ([(KINDS[k][0], KINDS[k][1], KINDS[k][2], False) for k in kinds]
            + [(CLUSTERS[c][0], CLUSTERS[c][1], CLUSTERS[c][2], CLUSTERS[c][3])
               for c in clusters])


# -- drawing ----------------------------------------------------------------------------------


def _spread(box, k: int, m: int) -> float:
    """The x of the k-th of m edge ends along a side of ``box``."""
    x, _, w, _ = box
    step = min(w * 0.8 / max(m - 1, 1), 12.0)
    return x + w / 2 + (k - (m - 1) / 2) * step


def edge_paths(scene: Scene, lay: Layout) -> list[tuple[SEdge, list[Point]]]:
    """Each drawable edge's polyline: from its source's bottom, through the bend points of
    its route, into its target's top; ends spread along the sides in the order they go."""
    paths, ends_out, ends_in = [], {}, {}
    for e in scene.edges:
        a, b = lay.nodes.get(e.src), lay.nodes.get(e.dst)
        if a is None or b is None:
            continue
        mid = lay.routes.get((e.src, e.dst), [])
        nxt = mid[0] if mid else (b[0] + b[2] / 2, b[1])
        prv = mid[-1] if mid else (a[0] + a[2] / 2, a[1] + a[3])
        down = b[1] >= a[1] + a[3] - 1
        paths.append((e, a, b, mid, down))
        if down:
            ends_out.setdefault(e.src, []).append((nxt[0], len(paths) - 1))
            ends_in.setdefault(e.dst, []).append((prv[0], len(paths) - 1))
    start: dict[int, float] = {}
    finish: dict[int, float] = {}
    for ends, into in ((ends_out, start), (ends_in, finish)):
        for nid, lst in ends.items():
            lst.sort()
            for k, (_, idx) in enumerate(lst):
                into[idx] = _spread(lay.nodes[nid], k, len(lst))
    out = []
    for idx, (e, a, b, mid, down) in enumerate(paths):
        if down:
            pts = [(start[idx], a[1] + a[3]), *mid, (finish[idx], b[1])]
        else:  # side by side or upwards: centre to centre, from the sides
            right = b[0] > a[0]
            pts = [(a[0] + a[2] if right else a[0], a[1] + a[3] / 2), *mid,
                   (b[0] if right else b[0] + b[2], b[1] + b[3] / 2)]
        out.append((e, pts))
    return out


def draw(scene: Scene, path: Path, fmt: str) -> None:
    """Draw ``scene`` with matplotlib (Agg, no display) to ``path`` in format ``fmt``."""
    # the Agg canvas directly, not pyplot: no display, and the user's backend is left alone
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    from matplotlib.path import Path as MplPath

    lay = layout(scene)
    fig = Figure(figsize=(lay.width / 72, lay.height / 72))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, lay.width)
    ax.set_ylim(lay.height, 0)
    ax.axis("off")
    ax.text(10, 10, scene.title, fontsize=FONT + 3, fontweight="bold", va="top", family=MONO)
    for cl, x, y, w, h, depth in sorted(lay.clusters, key=lambda c: c[5]):
        _, fill, border, dashed = CLUSTERS[cl.kind]
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=6",
                                    facecolor=fill, edgecolor=border, linewidth=1.0,
                                    linestyle="--" if dashed else "-", zorder=1 + depth * 0.01))
        ax.text(x + C_PAD, y + C_PAD - 2, "\n".join(cl.title), fontsize=FONT + 0.5, va="top",
                family=MONO, color=border if cl.kind != "panel" else "#222222",
                fontweight="bold", zorder=1.5)
    labelled: set[tuple[str, str]] = set()
    for e, pts in edge_paths(scene, lay):
        ax.add_patch(FancyArrowPatch(path=MplPath(pts), arrowstyle="-|>", mutation_scale=7,
                                     linewidth=0.7, color="#555555", zorder=2))
        if e.label and (e.src, e.label) not in labelled:
            # a tensor's shape once, just under the op that makes it
            labelled.add((e.src, e.label))
            a = lay.nodes[e.src]
            ax.text(a[0] + a[2] / 2, a[1] + a[3] + V_GAP * 0.38, e.label, fontsize=FONT - 1.5,
                    ha="center", va="center", family=MONO, color="#333333", zorder=4,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                          "alpha": 0.85})
    for p in scene.panels:
        for n in p.nodes():
            x, y, w, h = lay.nodes[n.id]
            _, fill, border = KINDS[n.kind]
            ax.add_patch(FancyBboxPatch((x, y), w, h, facecolor=fill, edgecolor=border,
                                        boxstyle=f"round,pad=0,rounding_size="
                                                 f"{6 if n.kind == 'dram' else 1.5}",
                                        linewidth=1.2 if n.kind == "dram" else 0.9, zorder=3))
            ax.text(x + w / 2, y + h / 2, "\n".join(n.lines), fontsize=FONT, ha="center",
                    va="center", family=MONO, zorder=4, linespacing=1.15)
    _draw_legend(ax, lay)
    dpi = min(110.0, 12000.0 * 72 / max(lay.width, lay.height))
    with rc_context({"svg.fonttype": "none", "pdf.fonttype": 42}):
        fig.savefig(path, format=fmt, dpi=dpi)


def _draw_legend(ax, lay: Layout) -> None:
    from matplotlib.patches import FancyBboxPatch

    if lay.legend:
        ax.text(10, lay.legend[0][1] - 3, "legend:", fontsize=FONT, va="bottom", family=MONO,
                color="#444444")
    for x, y, (text, fill, border, dashed) in lay.legend:
        ax.add_patch(FancyBboxPatch((x, y), 16, LINE_H * 1.3, facecolor=fill, edgecolor=border,
                                    boxstyle="round,pad=0,rounding_size=2", linewidth=1.0,
                                    linestyle="--" if dashed else "-", zorder=3))
        ax.text(x + 20, y + LINE_H * 0.65, text, fontsize=FONT, va="center", family=MONO)
