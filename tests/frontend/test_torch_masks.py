"""frontend/torch_masks.py: constant bool masks (causal recognition), negation, select,
the guard on folded buffers and the sources that feed mask inputs (issue 31)."""

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.node import Op

torch = pytest.importorskip("torch")

from eqsat_mirage.frontend.torch_masks import (  # noqa: E402
    BoolMask,
    Snapshot,
    constant_mask,
    select,
    source_value,
)


def _maker(made):
    def make(name, shape, dtype, source):
        made.append((name, shape, dtype, source))
        return em.Graph("m").input(name, shape, dtype)
    return make


@pytest.mark.parametrize("rows,cols,offset", [(8, 8, 0), (8, 8, 1), (8, 8, -1), (4, 6, 2),
                                              (6, 4, -2), (5, 5, 4), (5, 5, -5)])
@pytest.mark.parametrize("negated", [False, True])
def test_a_tril_plane_is_the_causal_mask_from_positions(rows, cols, offset, negated):
    plane = torch.ones(rows, cols, dtype=torch.bool).tril(offset)
    value = (~plane if negated else plane).view(1, 1, rows, cols)
    made = []
    m = constant_mask(em.Graph("g"), value, "bias", _maker(made))
    assert made == []  # nothing read from memory
    assert m.base.node.op is Op.CAUSAL and m.shape == (1, 1, rows, cols)
    r, c = np.indices((rows, cols))  # an all-True plane is also "nothing masked": either way
    got = (c <= r + m.base.node.arg[2]) ^ m.negated
    assert np.array_equal(got, value.view(rows, cols).numpy())
    if 0 < int(plane.sum()) < rows * cols:
        assert m.negated is negated


def test_other_constant_masks_are_bool_inputs_fed_from_their_value():
    value = torch.ones(2, 6, 6, dtype=torch.bool).tril()  # a leading axis of 2: not causal
    made = []
    m = constant_mask(em.Graph("g"), value, "mask", _maker(made))
    ((name, shape, dtype, (kind, held)),) = made
    assert (shape, dtype, kind) == ((2, 6, 6), "bool", "const") and torch.equal(held, value)
    band = torch.ones(6, 6, dtype=torch.bool).triu(-1).tril(1)
    made = []
    m = constant_mask(em.Graph("g"), band, "band", _maker(made))
    assert len(made) == 1 and not m.negated and (~m).negated and (~m).base is m.base


def test_select_puts_minus_inf_last_and_keeps_the_masks_rank():
    g = em.Graph("g")
    s = g.input("s", (2, 8, 8), "float32")
    causal = BoolMask(g.causal_mask(8, 8), (1, 1, 8, 8))
    # masked_fill(~causal, -inf): -inf where the complement holds -> mask(causal, s)
    out = select(~causal, float("-inf"), s, "masked_fill")
    assert out.node.op is Op.RESHAPE and out.shape == (1, 2, 8, 8)  # torch's broadcast rank
    assert out.node.srcs[0].op is Op.MASK
    # -inf where a computed mask holds: kept where its logical not holds (issue 52: refused)
    neg = select(causal, float("-inf"), s, "masked_fill").node.srcs[0]
    assert neg.op is Op.MASK and neg.srcs[0].op is Op.NOT and neg.srcs[0].srcs[0].op is Op.CAUSAL
    finite = select(causal, -1e4, s, "masked_fill")
    assert finite.node.srcs[0].op is Op.WHERE


def test_a_snapshot_sees_in_place_writes_and_accepts_equal_tensors():
    buf = torch.ones(4, 4).tril()
    snap = Snapshot(buf)
    assert snap.holds(buf)
    assert snap.holds(buf.clone())  # another tensor, the same values
    buf[0, 3] = 1.0  # an in-place write bumps the version counter
    assert not snap.holds(buf)
    assert not snap.holds(torch.ones(4, 5)) and not snap.holds(None)


def test_source_values():
    m = torch.tensor([True, False])
    fetch = {("arg", 0): m}.__getitem__
    assert source_value(("arg", 0), lambda k, r: fetch((k, r))) is m
    assert source_value(("const", m), None) is m
