"""Pictures of programs and of benchmark results.

``render(program, path)`` draws a kernel-level ``Graph`` (ops as boxes, tensors
as edges labelled with their shapes) or a ``MuGraph`` (each kernel a box; a
custom kernel a cluster holding its block graph: block inputs with imap/fmap,
the forloop with its range and accumulators, post-loop ops, thread graphs
grouped, outputs with omap; grid and loop range in the kernel's title). With
``source=`` the input program and the MuGraph are drawn side by side. Colours
tell device-memory tensors, shared-memory tiles and register values apart (see
``scene.KINDS``), with a legend. With ``cost=`` each kernel shows its
predicted time.

Backends: ``graphviz`` (the ``graphviz`` package and Graphviz's ``dot``
executable) or ``matplotlib`` (its own layered layout, ``layout.py``);
``auto`` takes Graphviz when ``dot`` is on the PATH, matplotlib otherwise.
``to_dot`` gives the Graphviz source without needing ``dot``.

``render_bench_chart(rows, path)`` draws a grouped bar chart of the cost-model
times of ``bench/mugraph_bench.py``'s rows.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..cost.gpucost import MuGraphCost, mugraph_cost
from ..cost.profile import GPUProfile
from ..frontend.graph import Graph
from ..ir.errors import MirageError
from ..mugraph.program import MuGraph, from_graph
from .scene import CLUSTERS, KINDS, Scene, SEdge, graph_panel, mugraph_panel

__all__ = ["RenderError", "build_scene", "render", "render_bench_chart", "to_dot"]

FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf"}
BACKENDS = ("auto", "graphviz", "matplotlib")


class RenderError(MirageError):
    """A picture that cannot be drawn: bad path suffix, missing backend, bad arguments."""


def _format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise RenderError(f"cannot draw to {str(path)!r}: unsupported suffix "
                          f"{path.suffix or '(none)'!r}; use one of {', '.join(FORMATS)}")
    return fmt


def _has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _has_graphviz() -> bool:
    return importlib.util.find_spec("graphviz") is not None and shutil.which("dot") is not None


def _backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise RenderError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "graphviz" and not _has_graphviz():
        missing = ("the Graphviz 'dot' executable is not on the PATH (install Graphviz, e.g. "
                   "apt-get install graphviz)" if importlib.util.find_spec("graphviz")
                   else "the 'graphviz' Python package is not installed (pip install graphviz)")
        raise RenderError(f"backend='graphviz' asked for, but {missing}; or use "
                          "backend='matplotlib'")
    if backend == "matplotlib" and not _has_matplotlib():
        raise RenderError("backend='matplotlib' asked for, but matplotlib is not installed "
                          "(pip install matplotlib)")
    if backend == "auto":
        if _has_graphviz():
            return "graphviz"
        if not _has_matplotlib():
            raise RenderError("no drawing backend: install matplotlib (pip install "
                              "matplotlib) or Graphviz (the 'dot' executable)")
        return "matplotlib"
    return backend


# -- the scene ----------------------------------------------------------------------------------


def _costs(cost: Any) -> tuple[MuGraphCost | None, GPUProfile | None]:
    """(a given MuGraphCost, or a profile to compute costs with)."""
    if cost is None or cost is False:
        return None, None
    if isinstance(cost, MuGraphCost):
        return cost, None
    if cost is True:
        cost = "h100"
    if isinstance(cost, GPUProfile | str | Path):
        return None, GPUProfile.load(cost)
    raise RenderError(f"cost= must be a gpucost.MuGraphCost, a profile (a name such as "
                      f"'h100', a path, a GPUProfile) or True, not {type(cost).__name__}")


def _panel(program: Graph | MuGraph, pid: str, given: MuGraphCost | None,
           prof: GPUProfile | None) -> tuple[Any, list[SEdge]]:
    if isinstance(program, MuGraph):
        program.validate()
        cost = given if given is not None else (mugraph_cost(program, prof) if prof else None)
        return mugraph_panel(program, pid, cost)
    if isinstance(program, Graph):
        program.check()
        base = from_graph(program)
        cost = mugraph_cost(base, prof) if prof is not None else given
        ops = len(base.kernels)
        if cost is not None and len(cost.kernels) != ops:
            raise RenderError(f"cost= has {len(cost.kernels)} kernels but program "
                              f"{program.name!r} has {ops} ops (give the cost of its "
                              "one-kernel-per-op program, or a profile)")
        note = (f"one kernel per op: {sum(k.time_us for k in cost.kernels):.2f} us on "
                f"{cost.target}" if cost is not None else "")
        return graph_panel(program, pid, [k.time_us for k in cost.kernels] if cost else None,
                           note)
    raise RenderError(f"cannot draw a {type(program).__name__}: give an em.Graph or an "
                      "em.MuGraph")


def build_scene(program: Graph | MuGraph, *, source: Graph | MuGraph | None = None,
                title: str | None = None, cost: Any = None) -> Scene:
    """The backend-independent scene ``render`` draws (``source``: a left-hand panel)."""
    given, prof = _costs(cost)
    panels, edges = [], []
    if source is not None:
        # a given MuGraphCost belongs to ``program``; the source's costs need a profile
        p, e = _panel(source, "src", None, prof)
        panels.append(p)
        edges += e
    p, e = _panel(program, "prog", given, prof)
    panels.append(p)
    edges += e
    if title is None:
        title = program.name if source is None else f"{source.name} -> {program.name}"
    return _clean_scene(Scene(title, panels, edges))


def _clean(text: str) -> str:
    """``text`` with the characters an SVG (XML 1.0) cannot hold made ``?`` (control
    characters but tab and newline, surrogates, U+FFFE and U+FFFF): a name is drawn as
    text, escaped by the backends, and never breaks the file."""
    return "".join("?" if (ord(c) < 32 and c not in "\t\n") or 0xD800 <= ord(c) <= 0xDFFF
                   or c in "\ufffe\uffff" else c for c in str(text))


def _clean_scene(scene: Scene) -> Scene:
    from .scene import SCluster

    def walk(cl) -> None:
        cl.title = [_clean(t) for t in cl.title]
        for it in cl.items:
            if isinstance(it, SCluster):
                walk(it)
            else:
                it.lines = [_clean(t) for t in it.lines]

    scene.title = _clean(scene.title)
    for panel in scene.panels:
        walk(panel)
    for e in scene.edges:
        e.label = _clean(e.label)
    return scene


# -- Graphviz -----------------------------------------------------------------------------------


class _DotIds(dict):
    """Scene ids -> short DOT ids (n0, n1, ...), never colliding."""

    def __missing__(self, key: str) -> str:
        self[key] = f"n{len(self)}"
        return self[key]


def _dot_cluster(parent, cl, ids: _DotIds) -> None:
    from graphviz import nohtml

    from .scene import SCluster

    _, fill, border, dashed = CLUSTERS[cl.kind]
    with parent.subgraph(name="cluster_" + ids[cl.id]) as sub:
        sub.attr(label=nohtml("\\n".join(cl.title)), style="rounded,filled" + (",dashed" if dashed
                                                                         else ""),
                 fillcolor=fill, color=border, fontname="DejaVu Sans Mono", fontsize="10",
                 labeljust="l")
        for it in cl.items:
            if isinstance(it, SCluster):
                _dot_cluster(sub, it, ids)
            else:
                _, nfill, nborder = KINDS[it.kind]
                sub.node(ids[it.id], "\\n".join(it.lines), shape="box",
                         style="rounded,filled" if it.kind == "dram" else "filled",
                         fillcolor=nfill, color=nborder, fontname="DejaVu Sans Mono",
                         fontsize="9", penwidth="1.4" if it.kind == "dram" else "1")


def to_dot(program: Graph | MuGraph, *, source: Graph | MuGraph | None = None,
           title: str | None = None, cost: Any = None) -> str:
    """The Graphviz (DOT) source of ``render``'s picture; needs no ``dot`` executable."""
    return _digraph(build_scene(program, source=source, title=title, cost=cost)).source


def _digraph(scene: Scene):
    try:
        import graphviz
    except ImportError:
        raise RenderError("the 'graphviz' Python package is not installed "
                          "(pip install graphviz)") from None
    dot = graphviz.Digraph("mirage")
    dot.attr(label=graphviz.nohtml(scene.title), labelloc="t", fontname="DejaVu Sans Mono",
             fontsize="14",
             rankdir="TB", newrank="true", compound="true")
    ids = _DotIds()
    for panel in scene.panels:
        _dot_cluster(dot, panel, ids)
    for e in scene.edges:
        dot.edge(ids[e.src], ids[e.dst], **({"label": e.label} if e.label else {}),
                 fontsize="8", fontname="DejaVu Sans Mono")
    kinds, clusters = scene.kinds()
    with dot.subgraph(name="cluster_legend") as leg:
        leg.attr(label="legend", style="rounded", color="#bbbbbb", fontname="DejaVu Sans Mono")
        for k in kinds:
            text, fill, border = KINDS[k]
            leg.node("legend_" + k, text, shape="box", style="rounded,filled", fillcolor=fill,
                     color=border, fontname="DejaVu Sans Mono", fontsize="9")
        for c in clusters:
            text, fill, border, dashed = CLUSTERS[c]
            leg.node("legend_" + c, text, shape="box", fillcolor=fill, color=border,
                     style="rounded,filled" + (",dashed" if dashed else ""),
                     fontname="DejaVu Sans Mono", fontsize="9")
    return dot


# -- the public entry points ----------------------------------------------------------------------


def render(program: Graph | MuGraph, path: str | Path, *, source: Graph | MuGraph | None = None,
           title: str | None = None, cost: Any = None, backend: str = "auto") -> Path:
    """Draw ``program`` (an ``em.Graph`` or ``em.MuGraph``) to ``path`` and return the path.

    The format follows the suffix: ``.svg``, ``.png`` or ``.pdf``. ``source``: the
    input program, drawn on the left of ``program``. ``title``: the picture's title
    (default: the program's name). ``cost``: a ``gpucost.MuGraphCost`` of ``program``,
    or a hardware profile (``"h100"``, a path, a ``GPUProfile``; ``True`` means
    ``"h100"``) to predict each kernel's time with ``gpucost.mugraph_cost`` (a Graph's
    ops are costed as one library kernel each). ``backend``: ``"auto"``,
    ``"graphviz"`` (needs the ``dot`` executable) or ``"matplotlib"``. Raises
    ``RenderError`` (a ``MirageError``) for a bad suffix or a missing backend.
    """
    path = Path(path)
    fmt = _format(path)
    which = _backend(backend)
    scene = build_scene(program, source=source, title=title, cost=cost)
    path.parent.mkdir(parents=True, exist_ok=True)
    if which == "graphviz":
        path.write_bytes(_digraph(scene).pipe(format=fmt))
    else:
        from .layout import draw

        draw(scene, path, fmt)
    return path


# bench row keys: the first present of each tuple (bench/mugraph_bench.py uses the last ones)
ROW_KEYS = {"name": ("name", "benchmark"), "batch": ("batch", "b"),
            "chosen": ("chosen_us", "chosen", "cost"), "baseline": ("baseline_us", "baseline",
                                                                   "base"),
            "roofline": ("roofline_us", "roofline", "roof")}
SERIES = (("chosen", "chosen MuGraph", "#3d85c6"),
          ("baseline", "baseline (one kernel per op)", "#cccccc"),
          ("roofline", "roofline lower bound", "#6aa84f"))


def _row_value(row: Mapping, key: str) -> Any:
    for k in ROW_KEYS[key]:
        if k in row and row[k] is not None:
            return row[k]
    return None


def render_bench_chart(rows: Iterable[Mapping], path: str | Path, *,
                       title: str | None = None) -> Path:
    """Draw a grouped bar chart of cost-model times per benchmark to ``path`` (.svg/.png/.pdf).

    Each row is a dict such as ``bench/mugraph_bench.py`` produces: the benchmark's
    ``name`` (or ``benchmark``), its ``batch`` (or ``b``, optional), and the times in
    microseconds ``chosen_us``/``cost``, ``baseline_us``/``base`` and
    ``roofline_us``/``roof`` (missing or infinite values draw no bar). The y axis is
    logarithmic when the times span more than a factor of 20.
    """
    path = Path(path)
    fmt = _format(path)
    rows = list(rows)
    if not rows:
        raise RenderError("render_bench_chart: no rows to draw")
    if not _has_matplotlib():
        raise RenderError("render_bench_chart needs matplotlib (pip install matplotlib)")
    labels, values = [], {key: [] for key, _, _ in SERIES}
    for r in rows:
        name = _row_value(r, "name")
        if name is None:
            raise RenderError(f"render_bench_chart: row {dict(r)!r} has no 'name' or "
                              "'benchmark'")
        batch = _row_value(r, "batch")
        labels.append(f"{name}\nb={batch}" if batch is not None else str(name))
        for key, _, _ in SERIES:
            v = _row_value(r, key)
            values[key].append(float(v) if v is not None else math.nan)
    # the Agg canvas directly, not pyplot: no display, and the user's backend is left alone
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.0, 0.75 * len(rows) + 2.0), 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.27
    finite = [v for vs in values.values() for v in vs if math.isfinite(v) and v > 0]
    for j, (key, label, colour) in enumerate(SERIES):
        xs = [i + (j - 1) * width for i in range(len(rows))]
        ys = [v if math.isfinite(v) else 0.0 for v in values[key]]
        bars = ax.bar(xs, ys, width, label=label, color=colour, edgecolor="#444444",
                      linewidth=0.5)
        for b, v in zip(bars, values[key]):
            if not math.isnan(v):
                ax.annotate(f"{v:.1f}" if math.isfinite(v) else "inf",
                            (b.get_x() + b.get_width() / 2, max(b.get_height(), 1e-9)),
                            ha="center", va="bottom", fontsize=6, rotation=90,
                            xytext=(0, 2), textcoords="offset points")
    if finite and max(finite) / min(finite) > 20:
        ax.set_yscale("log")
        ax.set_ylim(min(finite) / 1.5, max(finite) * 4)
    elif finite:
        ax.set_ylim(0, max(finite) * 1.25)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("cost-model time (us)")
    ax.set_title(title or "Cost-model time per benchmark: chosen vs baseline vs roofline",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", linewidth=0.3, alpha=0.6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with rc_context({"svg.fonttype": "none", "pdf.fonttype": 42}):
        fig.savefig(path, format=fmt, dpi=120)
    return path
