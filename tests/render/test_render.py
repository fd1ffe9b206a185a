"""Pictures: ``render`` (Graph, MuGraph, side by side), ``to_dot``, ``render_bench_chart``.

MuGraphs come from ``fusion.plan`` (fast), not ``em.optimize``. The matplotlib
backend runs everywhere; the Graphviz backend is tested with ``dot`` faked.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import eqsat_mirage as em
from bench.programs import BENCHMARKS, program
from eqsat_mirage.cost.gpucost import mugraph_cost
from eqsat_mirage.fusion.planner import plan
from eqsat_mirage.mugraph.kernels import axis_name
from eqsat_mirage.render import draw as render_mod
from eqsat_mirage.render.draw import RenderError, build_scene, render, render_bench_chart, to_dot
from eqsat_mirage.render.layout import layout

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LEGEND = ("device-memory (DRAM) tensor", "shared-memory tile",
          "register value (loop stage / thread graph)")


@pytest.fixture(scope="module")
def planned():
    """(input Graph, planned MuGraph) per benchmark at b = 1, planned once."""
    cache: dict[str, tuple[em.Graph, em.MuGraph]] = {}

    def get(name: str) -> tuple[em.Graph, em.MuGraph]:
        if name not in cache:
            g = program(name, 1)
            cache[name] = (g, plan(g).mugraph)
        return cache[name]
    return get


@pytest.fixture(autouse=True)
def no_dot(monkeypatch):
    """Graphviz's ``dot`` is absent unless a test says otherwise (auto -> matplotlib)."""
    monkeypatch.setattr(render_mod.shutil, "which", lambda name: None)


def grid_text(k: em.CustomKernel) -> str:
    grid = ", ".join(f"{axis_name(i)}={g}" for i, g in enumerate(k.grid))
    return f"grid=({grid}) [{math.prod(k.grid)} blocks]"


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_side_by_side_svg_names_kernels_grids_loops_and_costs(planned, tmp_path, name):
    g, mg = planned(name)
    out = render(mg, tmp_path / f"{name}.svg", source=g, cost="h100")
    assert out == tmp_path / f"{name}.svg" and out.stat().st_size > 5000
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    costs = {k.name: k for k in mugraph_cost(mg, "h100").kernels}
    for k in mg.kernels:
        assert f"{k.name}: " in svg
        assert f"{costs[k.name].time_us:.2f} us" in svg
        if k.kind == "custom":
            assert grid_text(k) in svg and f"forloop={k.forloop}" in svg
            for bi in k.inputs.values():
                assert "imap={" in svg and bi.name in svg
            assert "omap={" in svg
            if k.accumulators:
                assert f"forloop x{k.forloop}" in svg and "iterations" in svg
            if k.threads:
                assert "thread graph" in svg
        else:
            assert "library kernel" in svg
    custom = [k for k in mg.kernels if k.kind == "custom"]
    assert LEGEND[0] in svg and (LEGEND[1] in svg) == bool(custom)
    in_regs = any(k.threads or k.accumulators for k in custom)
    assert (LEGEND[2] in svg) == in_regs
    assert "input program" in svg and "%0 = " in svg  # the left-hand panel
    for n in g.inputs:
        assert f"{n} (input)" in svg


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_png_of_graph_and_mugraph(planned, tmp_path, name):
    g, mg = planned(name)
    data = render(mg, tmp_path / f"{name}.png", source=g).read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 20_000


def test_layout_boxes_do_not_overlap(planned):
    for name in BENCHMARKS:
        g, mg = planned(name)
        lay = layout(build_scene(mg, source=g, cost="h100"))
        boxes = list(lay.nodes.values())
        for i, (x, y, w, h) in enumerate(boxes):
            assert 0 <= x and x + w <= lay.width and 0 <= y and y + h <= lay.height
            for x2, y2, w2, h2 in boxes[i + 1:]:
                assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y, name


def test_graph_panel_labels_edges_with_shapes(tmp_path):
    g = program("gqa", 1)
    svg = render(g, tmp_path / "g.svg", title="attention").read_text()
    assert "attention" in svg and "f16[2, 256, 4096]" in svg and "sum axis=[2] keepdims" in svg
    assert "device-memory (DRAM) tensor" in svg and "op / library kernel" in svg
    assert render(g, tmp_path / "g.pdf").read_bytes()[:5] == b"%PDF-"


def test_one_kernel_per_op_and_given_cost(planned, tmp_path):
    g, mg = planned("lora")
    base = em.from_graph(g)
    svg = render(base, tmp_path / "base.svg", cost=mugraph_cost(base)).read_text()
    assert svg.count(">library kernel<") == len(base.kernels)
    cost = mugraph_cost(mg)
    svg = render(mg, tmp_path / "mg.svg", cost=cost).read_text()
    assert f"{cost.total_us:.2f} us" in svg and "h100" in svg
    with pytest.raises(RenderError, match="kernels but program"):
        render(g, tmp_path / "bad.svg", cost=cost)


def test_bad_arguments_raise_clear_errors(planned, tmp_path):
    g, mg = planned("gqa")
    with pytest.raises(RenderError, match=r"unsupported suffix '\.jpg'.*\.svg"):
        render(mg, tmp_path / "x.jpg")
    with pytest.raises(em.MirageError, match="suffix"):
        render(mg, tmp_path / "noext")
    with pytest.raises(RenderError, match="unknown backend"):
        render(mg, tmp_path / "x.svg", backend="tikz")
    with pytest.raises(RenderError, match="em.Graph or an em.MuGraph"):
        render("not a program", tmp_path / "x.svg")
    with pytest.raises(RenderError, match="cost= must be"):
        render(mg, tmp_path / "x.svg", cost=3.5)
    assert not list(tmp_path.iterdir())


def test_graphviz_backend_without_dot_is_a_clear_error(planned, tmp_path):
    _, mg = planned("gqa")
    with pytest.raises(RenderError, match="'dot' executable.*backend='matplotlib'"):
        render(mg, tmp_path / "x.svg", backend="graphviz")
    out = render(mg, tmp_path / "auto.svg")  # auto falls back to matplotlib
    assert "matplotlib" in out.read_text()[:2000]


def test_graphviz_backend_with_dot(planned, tmp_path, monkeypatch):
    graphviz = pytest.importorskip("graphviz")
    g, mg = planned("rmsnorm")
    monkeypatch.setattr(render_mod.shutil, "which", lambda name: f"/usr/bin/{name}")
    seen = {}

    def pipe(self, format=None, **kw):
        seen["source"], seen["format"] = self.source, format
        return b"<svg>drawn by dot</svg>"
    monkeypatch.setattr(graphviz.Digraph, "pipe", pipe)
    out = render(mg, tmp_path / "dot.svg", source=g, cost="h100")  # auto picks graphviz
    assert out.read_bytes() == b"<svg>drawn by dot</svg>" and seen["format"] == "svg"
    src = seen["source"]
    k = next(k for k in mg.kernels if k.kind == "custom" and k.forloop > 1)
    assert src.count("subgraph cluster_") >= 5 and f"forloop x{k.forloop}" in src
    assert "thread graph" in src and "shared-memory tile" in src
    assert f"grid=(x={k.grid[0]}) [{k.grid[0]} blocks]" in src


def test_to_dot_needs_no_dot(planned):
    pytest.importorskip("graphviz")
    g, mg = planned("gatedmlp")
    src = to_dot(mg, source=g)
    assert src.startswith("digraph") and src.count("{") == src.count("}")
    assert "k0: custom kernel" in src and "imap={1: x} fmap=0" in src and "omap={1: x}" in src
    assert "cluster_" in src and "legend" in src and "f16[4096, 4096]" in src


# -- the benchmark chart ----------------------------------------------------------------------

def bench_rows() -> list[dict]:
    """Rows shaped like bench/mugraph_bench.py's (name, batch, cost, base, roof)."""
    times = {"gqa": 15.4, "qknorm": 15.4, "rmsnorm": 22.8, "lora": 3.8, "gatedmlp": 25.4,
             "ntrans": 3.3}
    return [{"name": n, "batch": b, "cost": t * b, "base": 2 * t * b, "roof": 0.6 * t * b}
            for n, t in times.items() for b in (1, 8)]


def test_bench_chart_svg_names_benchmarks(tmp_path):
    svg = render_bench_chart(bench_rows(), tmp_path / "chart.svg").read_text()
    for name in BENCHMARKS:
        assert f">{name}<" in svg
    assert "b=8" in svg and "roofline" in svg and "baseline (one kernel per op)" in svg


def test_bench_chart_alias_keys_png_and_errors(tmp_path):
    rows = [{"benchmark": "gqa", "b": 1, "chosen_us": 10.0, "baseline_us": 20.0,
             "roofline_us": 5.0},
            {"benchmark": "lora", "chosen_us": math.inf, "baseline_us": 8.0}]
    data = render_bench_chart(rows, tmp_path / "chart.png").read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000
    with pytest.raises(RenderError, match="no rows"):
        render_bench_chart([], tmp_path / "c.svg")
    with pytest.raises(RenderError, match="has no 'name'"):
        render_bench_chart([{"cost": 1.0}], tmp_path / "c.svg")
    with pytest.raises(RenderError, match="suffix"):
        render_bench_chart(bench_rows(), tmp_path / "c.gif")


def test_mugraph_bench_chart_option(tmp_path, monkeypatch):
    from bench import mugraph_bench

    def fake(name, batch, time_limit_s):
        row = next(r for r in bench_rows() if r["name"] == name and r["batch"] == batch)
        return {**row, "saturate": 0.1, "extract": 0.1, "fusion": 0.1, "verify": 0.1, "on": 10,
                "off": 20, "off_s": 0.1, "kernels": 1, "custom": 1, "verified": True,
                "total": 0.5, "regions": [], "program": ""}
    monkeypatch.setattr(mugraph_bench, "run_case", fake)
    chart = tmp_path / "costs.svg"
    assert mugraph_bench.main(["--names", "gqa", "lora", "--batches", "1",
                               "--chart", str(chart)]) == 0
    svg = chart.read_text()
    assert ">gqa<" in svg and ">lora<" in svg


def test_result_render_draws_both_programs(tmp_path):
    res = em.optimize(program("lora", 1), trials=1, cache=False)
    out = res.render(tmp_path / "lora.svg")
    text = Path(out).read_text()
    assert "lora_b1" in text and "custom kernel" in text and "grid=" in text
