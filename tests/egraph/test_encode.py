"""Encode: Graph -> egglog terms -> (no rewriting) -> extracted Graph is the same program.

Every op is encoded (multi-axis reductions without keepdims, rank-3/4
transposes as swap chains, n-ary concat, 1-d matmul operands) and decoded
back; the result must verify equivalent to the input. egglog's shape facts,
(ndim t) and (dim t axis), must match the IR shape of every node.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import eqsat_mirage as em
from eqsat_mirage.cost.per_op import Hardware
from eqsat_mirage.egraph.encode import Encoder, _swaps, encode_graph
from eqsat_mirage.egraph.extract import extract
from eqsat_mirage.egraph.rulefiles import Schema
from eqsat_mirage.egraph.saturate import Saturator
from eqsat_mirage.ir.node import Op
from eqsat_mirage.testing import programs

HW = Hardware.load("h100")
CTORS = Schema.load().constructors


# ---------------------------------------------------------------- programs over every op

def elementwise() -> em.Graph:
    g = em.Graph("elementwise")
    x = g.input("X", (2, 3, 4), dtype="float32")
    b = g.input("B", (3, 1), dtype="float32")
    pos = x * x + 1.0
    y = (em.sqrt(pos) - em.rsqrt(pos)) * em.silu(b) / (em.relu(b) + 2.0)
    g.output(-y + em.exp(b * 0.5), "O")
    return g


def reductions() -> em.Graph:
    g = em.Graph("reductions")
    x = g.input("X", (2, 3, 4, 5), dtype="float32")
    g.output(x.sum(axis=(1, 3), keepdims=False), "s13")        # (2, 4)
    g.output(x.mean(axis=(0, 2), keepdims=True), "m02")        # (1, 3, 1, 5)
    g.output(x.sum(axis=None), "s_all")                        # ()
    g.output(x.mean(axis=-1), "m_last")                        # (2, 3, 4)
    g.output(x.sum(axis=(0, 1, 2), keepdims=False), "s012")    # (5,)
    g.output(x.max(axis=(1, 3)), "x13")                        # (2, 4)
    g.output(x.max(axis=-1, keepdims=True), "x_last")          # (2, 3, 4, 1)
    return g


def transposes() -> em.Graph:
    g = em.Graph("transposes")
    x = g.input("X", (2, 3, 4, 5), dtype="float32")
    z = g.input("Z", (2, 3, 4), dtype="float32")
    g.output(x.transpose(3, 1, 0, 2), "t3102")
    g.output(x.transpose(1, 2, 3, 0), "t1230")  # a 4-cycle: three swaps
    g.output(x.transpose(), "rev4")
    g.output(z.transpose(2, 0, 1), "t201")
    g.output(z.transpose(1, 0, 2), "t102")
    g.output(z.T, "zT")
    return g


def concats() -> em.Graph:
    g = em.Graph("concats")
    a = g.input("A", (2, 3), dtype="float32")
    b = g.input("B", (2, 5), dtype="float32")
    c = g.input("C", (4, 3), dtype="float32")
    g.output(em.concat([a, b, a, em.exp(b)], axis=1), "c4")       # (2, 16)
    g.output(em.concat([a, c, a * 2.0], axis=0), "c3")              # (8, 3)
    g.output(em.concat([a], axis=0) + 1.0, "c1")
    return g


def matmuls() -> em.Graph:
    g = em.Graph("matmuls")
    x = g.input("X", (2, 3, 4, 5), dtype="float32")
    v = g.input("v", (5,), dtype="float32")
    u = g.input("u", (4,), dtype="float32")
    w = g.input("W", (3, 5, 2), dtype="float32")   # batch dims broadcast against X's
    g.output(x @ v, "mv")                   # 1-d right operand -> (2, 3, 4)
    g.output(u @ x, "vm")                   # 1-d left operand -> (2, 3, 5)
    g.output(v @ v, "dot")                  # both 1-d -> ()
    g.output(x @ w, "batched")              # (2, 3, 4, 2)
    g.output((x @ w).sum(axis=(0, 1)), "contract")      # (4, 2)
    return g


def reshapes() -> em.Graph:
    g = em.Graph("reshapes")
    x = g.input("X", (2, 3, 4), dtype="float16")
    y = x.reshape(6, 4) @ x.reshape(4, 6)
    g.output(y.reshape(36), "flat")
    g.output(y.reshape(2, 3, 6).transpose(2, 0, 1).reshape(-1, 1), "col")
    return g


def mixed() -> em.Graph:
    """GQA-like with shared subterms, two outputs and float16/bfloat16 inputs."""
    g = em.Graph("mixed")
    q = g.input("Q", (2, 8, 4), dtype="float16")
    k = g.input("K", (2, 4, 16), dtype="bfloat16")
    v = g.input("V", (2, 16, 4), dtype="float16")
    a = em.exp(q @ k)
    s = a.sum(axis=-1, keepdims=True)
    g.output((a / s) @ v, "O")
    g.output(s.mean(axis=(0, 1, 2)), "S")
    return g


def masked() -> em.Graph:
    """A causal-masked softmax, a bool mask input (its logical not, its and with the causal
    mask or a comparison: broadcast, issue 52) selecting between two values."""
    g = em.Graph("masked")
    s = g.input("S", (2, 6, 6), dtype="float32")
    m = g.input("M", (2, 6, 6), dtype="bool")
    p = em.softmax(em.where(g.causal_mask(6, 6), s, float("-inf")), axis=-1)
    g.output(em.where(m, p, s * 0.5), "P")
    g.output(em.where(~m, s, p), "N")
    g.output(em.where((m & g.causal_mask(6, 6)) | (s > 1.0), s, p), "C")
    return g


def hf_ops() -> em.Graph:
    """What Hugging Face layers add: casts, slices (RoPE's halves), tanh and erf (GELU)."""
    g = em.Graph("hf_ops")
    x = g.input("X", (2, 3, 8), dtype="float16")
    h = x.astype("float32")
    rot = em.concat([-h[..., 4:], h[..., :4]], axis=-1)
    g.output((h * 0.5 + rot).astype("float16"), "rope")
    g.output(em.gelu(h) + em.gelu(h[:, 1:], approximate="tanh").sum(axis=1, keepdims=True),
             "gelu")
    g.output(em.cos(h) * em.sin(h), "rotary")
    return g


def gates() -> em.Graph:
    """A sigmoid gate (the op added through its spec, docs/architecture.md)."""
    g = em.Graph("gates")
    x = g.input("X", (4, 8), dtype="float32")
    g.output(x * em.sigmoid(x * 1.702), "gate")
    return g


def gathers() -> em.Graph:
    """An embedding lookup (a 2-d index), an index_select along axis 1 and a
    take_along_axis along axis 1 (torch.gather; issue 52)."""
    g = em.Graph("gathers")
    table = g.input("E", (16, 8), dtype="float32")
    ids = g.input("ids", (2, 3), dtype="int64")
    cols = g.input("cols", (5,), dtype="int32")
    rows = g.input("rows", (16, 3), dtype="int64")
    g.output(em.rms_norm(em.embedding(table, ids), axis=-1), "h")
    g.output(em.exp(em.index_select(table, 1, cols)), "picked")
    g.output(em.take_along_axis(em.exp(table), rows, 1) * 2.0, "along")
    return g


def comparisons() -> em.Graph:
    """Each comparison of computed values (issue 52): a leaky ReLU by hand, a 0/1 gate, a
    threshold mask before a softmax, and eq/ne/le against a number or a broadcast row."""
    g = em.Graph("comparisons")
    x, y = g.input("X", (4, 8), dtype="float32"), g.input("Y", (1, 8), dtype="float32")
    s = x @ g.input("W", (8, 8), dtype="float32")
    g.output(em.where(s > 0, s, 0.1 * s), "leaky")
    g.output((x >= y).astype("float32") * x, "gate")
    g.output(em.softmax(em.where(em.logical_not(s < -1.0), s, float("-inf"))), "masked")
    g.output(em.where(em.eq(x, 0.5), x, y) + em.where(em.ne(x, y), y, x)
             + em.where(x <= y, x, y), "rest")
    return g


def int4_weights() -> em.Graph:
    """Packed int4 weights (issue 53): nibbles of a uint8 tensor interleaved along K,
    dequantized with a scale per group of 8 rows, read by a matmul."""
    g = em.Graph("int4_weights")
    x, wp = g.input("X", (2, 16), dtype="float16"), g.input("Wp", (8, 4), dtype="uint8")
    q = em.concat([(wp & 0xF).reshape((8, 1, 4)), (wp >> 4).reshape((8, 1, 4))], axis=1)
    w = q.reshape((2, 8, 4)).astype("float16") - 8.0
    g.output(x @ (w * g.input("s", (2, 1, 4), dtype="float16")).reshape((16, 4)), "y")
    return g


PROGRAMS = {f.__name__: f for f in (elementwise, reductions, transposes, concats, matmuls, masked,
                                    reshapes, mixed, hf_ops, gates, gathers, comparisons,
                                    int4_weights)}


def test_programs_cover_every_op():
    ops = {n.op for f in PROGRAMS.values() for n in f().nodes()}
    assert ops == set(Op)


# ---------------------------------------------------------------- helpers

def roundtrip(g: em.Graph, guards: bool = False):
    """Load ``g`` (schema + shape facts only), extract without rewriting."""
    sat = Saturator(g, [], [], guards=guards)
    data = sat.serialize()
    cands, stats = extract(data, sat.root_classes(data), g, CTORS, HW, k=2)
    return sat, data, cands, stats


def shape_facts(data: dict) -> tuple[dict[str, int], dict[str, dict[int, int]]]:
    """(class -> ndim, class -> {axis: dim}) read from the serialized e-graph."""
    nodes = data["nodes"]
    value = {n["eclass"]: int(n["op"]) for n in nodes.values()
             if n["eclass"].startswith("i64") and not n["children"]}
    ndim: dict[str, int] = {}
    dims: dict[str, dict[int, int]] = {}
    for n in nodes.values():
        if n["op"] == "ndim":
            cls = nodes[n["children"][0]]["eclass"]
            assert cls not in ndim or ndim[cls] == value[n["eclass"]]
            ndim[cls] = value[n["eclass"]]
        elif n["op"] == "dim":
            cls = nodes[n["children"][0]]["eclass"]
            axis = int(nodes[n["children"][1]]["op"])
            dims.setdefault(cls, {})[axis] = value[n["eclass"]]
    return ndim, dims


def let_classes(data: dict) -> dict[str, str]:
    """egglog global (``$tK``) -> e-class; a class may list several lets."""
    return {name.strip(): cls for cls, v in data["class_data"].items() if v.get("let")
            for name in v["let"].split(",")}


def check_facts(g: em.Graph, data: dict) -> int:
    """Assert (ndim)/(dim) of every node's e-class equal its IR shape; return nodes checked."""
    enc = Encoder()  # deterministic: the same names as the Saturator's own encoding
    for node in g.outputs.values():
        enc.encode(node)
    classes = let_classes(data)
    ndim, dims = shape_facts(data)
    checked = 0
    for node in g.nodes():
        cls = classes[enc.names[id(node)]]
        assert ndim.get(cls) == len(node.shape), (node.describe(), node.shape, ndim.get(cls))
        assert dims.get(cls, {}) == dict(enumerate(node.shape)), \
            (node.describe(), node.shape, dims.get(cls))
        checked += 1
    return checked


# ---------------------------------------------------------------- round trip

@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_roundtrip_verifies(name):
    g = PROGRAMS[name]()
    _, _, cands, stats = roundtrip(g)
    assert cands
    prog = cands[0].program
    assert list(prog.inputs) == list(g.inputs)
    assert list(prog.outputs) == list(g.outputs)
    for out, node in g.outputs.items():
        assert prog.outputs[out].shape == node.shape, out
    res = em.verify(g, prog, trials=3, seed=1)
    assert res.equivalent, (str(prog), res)
    # without rewriting, every tensor e-class holds exactly one e-node
    assert stats["tensor_enodes"] == stats["eclasses"]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_shape_facts_match_ir(name):
    g = PROGRAMS[name]()
    _, data, _, _ = roundtrip(g)
    assert check_facts(g, data) == len(g.nodes())


def test_roundtrip_with_guards_loaded():
    g = mixed()
    sat, data, cands, _ = roundtrip(g, guards=True)
    assert em.verify(g, cands[0].program).equivalent
    assert check_facts(g, data) == len(g.nodes())
    ops = {n["op"] for n in data["nodes"].values()}
    assert {"absval", "in-target", "AExp", "ASum"} <= ops
    assert [st.name for st in sat.stats] == ["guards"]


def test_identical_outputs_share_a_class():
    """Two structurally equal outputs (distinct IR nodes) land in one e-class."""
    g = em.Graph("dup")
    x = g.input("X", (3,), dtype="float32")
    g.output(-(x @ x), "O0")
    g.output(x @ x, "O1")
    sat, data, cands, _ = roundtrip(g)
    roots = sat.root_classes(data)
    assert set(roots) == {"O0", "O1"}
    assert em.verify(g, cands[0].program).equivalent


def test_extract_is_dag_in_roundtrip():
    """A shared subterm stays one node after decoding (no duplication)."""
    g = mixed()
    _, _, cands, _ = roundtrip(g)
    prog = cands[0].program
    assert sum(n.op is Op.EXP for n in prog.nodes()) == 1
    assert sum(n.op is Op.MATMUL for n in prog.nodes()) == 2


# ---------------------------------------------------------------- the encoding itself

@pytest.mark.parametrize("rank", [2, 3, 4])
def test_swaps_realise_every_permutation(rank):
    x = np.arange(np.prod(range(2, rank + 2))).reshape(tuple(range(2, rank + 2)))
    for perm in itertools.permutations(range(rank)):
        y = x
        swaps = _swaps(perm)
        assert len(swaps) <= rank - 1
        for i, j in swaps:
            y = np.swapaxes(y, i, j)
        assert np.array_equal(y, np.transpose(x, perm)), perm


def test_encoding_text():
    g = em.Graph("enc")
    x = g.input("X", (2, 3, 4, 5), dtype="float32")
    v = g.input("v", (5,), dtype="float32")
    g.output(x.sum(axis=(1, 3)), "s")
    g.output(x.transpose(1, 2, 3, 0), "t")
    g.output(em.concat([x, x, x], axis=1), "c")
    g.output(x @ v, "m")
    text, roots = encode_graph(g)
    assert set(roots) == {"s", "t", "c", "m"}
    assert '(Input "X")' in text and "(set (ndim $t0) 4)" in text
    assert "(Sum 1 $t0)" in text and "(Reshape (vec-of 2 4)" in text
    assert text.count("(Swap ") == 3
    assert text.count("(Concat 1 ") == 2
    assert "(Reshape (vec-of 5 1)" in text and "(Reshape (vec-of 2 3 4)" in text
    # each IR node is encoded once even when used many times
    assert text.count('(Input "X")') == 1


def test_constants_are_f64_literals():
    g = em.Graph("c")
    x = g.input("X", (2,), dtype="float32")
    g.output(x * 2 + 1e-6 - 3.5, "O")
    text, _ = encode_graph(g)
    assert "(Const 2.0)" in text and "(Const 1e-06)" in text and "(Const 3.5)" in text
    _, data, cands, _ = roundtrip(g)
    assert em.verify(g, cands[0].program).equivalent


# ---------------------------------------------------------------- random programs

@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs())
def test_roundtrip_random_programs(g):
    _, data, cands, _ = roundtrip(g)
    check_facts(g, data)
    res = em.verify(g, cands[0].program, trials=2, seed=0)
    assert res.equivalent, (str(g), str(cands[0].program), res)
