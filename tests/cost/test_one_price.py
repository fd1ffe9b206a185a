"""One cost model: the same op has the same price in extraction, fusion and the baseline."""

from __future__ import annotations

import pytest

import eqsat_mirage as em
from bench.programs import cases, program
from eqsat_mirage.cost.gpucost import kernel_cost, mugraph_cost, op_cost
from eqsat_mirage.cost.per_op import Hardware, graph_cost_us, node_cost_us
from eqsat_mirage.cost.profile import GPUProfile
from eqsat_mirage.mugraph.kernels import PredefinedKernel
from eqsat_mirage.mugraph.program import MuGraph, from_graph


@pytest.mark.parametrize("target", ["h100", "a100"])
@pytest.mark.parametrize("name,batch", list(cases()))
def test_the_one_kernel_per_op_baseline_is_one_number(name, batch, target):
    g = program(name, batch)
    hw = Hardware.load(target)
    extraction = graph_cost_us(g, hw)
    fusion = mugraph_cost(from_graph(g), target).total_us
    assert extraction == pytest.approx(fusion, rel=1e-12)


@pytest.mark.parametrize("name,batch", [("gqa", 1), ("rmsnorm", 1)])
def test_every_op_is_priced_alike_by_extraction_and_the_planner(name, batch):
    g = program(name, batch)
    prof = GPUProfile.load("h100")
    hw = Hardware.load(prof)
    for n in g.nodes():
        if n.srcs:
            k = PredefinedKernel(n, "out", "k")
            assert node_cost_us(n, hw) == kernel_cost(k, MuGraph(), prof).time_us \
                == op_cost(n, prof).time_us


def test_optimize_reports_the_same_baseline_at_both_levels():
    g = program("lora", 1)
    a = em.optimize(g, level="kernel", cache=False)
    b = em.optimize(g, cache=False)
    assert a.baseline_cost_us == pytest.approx(b.baseline_cost_us, rel=1e-12)
    assert b.baseline_cost_us == pytest.approx(graph_cost_us(g, Hardware.load("h100")))
