"""A field trial's values (its inputs, their cached conversions: GBs at a 7B layer's size)
are freed when the trial ends, by reference counting alone: nothing a trial holds points
back at its ``FieldCtx`` (``field.LazyPair`` keeps the generator and records, not the ctx)."""

from __future__ import annotations

import gc
import weakref

import numpy as np

import eqsat_mirage as em
from eqsat_mirage.semantics.field import FieldCtx
from eqsat_mirage.verifier import memory
from eqsat_mirage.verifier import verify as verify_module


def attention() -> em.Graph:
    """Softmax attention: exp draws the q parts of Q and K (``LazyPair``'s lazy path)."""
    g = em.Graph("att")
    q, k, v = (g.input(n, s) for n, s in (("Q", (2, 8, 4)), ("K", (2, 4, 16)),
                                          ("V", (2, 16, 4))))
    a = em.exp(q @ k)
    g.output((a / a.sum(axis=-1, keepdims=True)) @ v, "O")
    return g


def test_a_field_trial_is_freed_without_the_cycle_collector(monkeypatch):
    made: list[weakref.ref] = []

    class Recorded(FieldCtx):
        def __post_init__(self) -> None:
            super().__post_init__()
            made.append(weakref.ref(self))

    monkeypatch.setattr(verify_module, "FieldCtx", Recorded)
    g = attention()
    gc.collect()
    gc.disable()
    try:
        # without a memo, and with one that draws the inputs again (a 7B layer's weights)
        for memo, limit in ((None, memory.MEMO_INPUTS), ({}, 0)):
            monkeypatch.setattr(memory, "MEMO_INPUTS", limit)
            made.clear()
            for _ in range(2):
                r = em.verify(g, g, trials=3, seed=0, memo=memo, float_check=False)
                assert r.equivalent
            assert made and all(ref() is None for ref in made), (memo, limit)
        # a memo that keeps small inputs keeps their trials, and only while it is kept
        monkeypatch.setattr(memory, "MEMO_INPUTS", 256 * 2**20)
        made.clear()
        memo = {}
        assert em.verify(g, g, trials=3, seed=0, memo=memo, float_check=False).equivalent
        assert any(ref() is not None for ref in made)
        del memo
        assert all(ref() is None for ref in made)
    finally:
        gc.enable()


def test_q_parts_drawn_lazily_are_recorded_in_the_trial():
    """The q part of an input is drawn on first use from the trial's generator and recorded
    in its ``pinned`` set and ``q_order`` (what ``replay`` draws again)."""
    g = attention()
    ctx = FieldCtx(2**31 - 1, 331, np.random.default_rng(0))
    ctx.inputs = ctx.random_inputs(g)
    assert ctx.q_order == [] and len(ctx.pinned) == 3
    qk = ctx.inputs["K"][1]
    assert ctx.q_order == ["K"] and id(qk) in ctx.pinned and ctx.inputs["K"][1] is qk
    assert any(v is ctx.pinned for v in ctx.limb_cache.values())  # what it keeps cached
