"""The peak bisections (``draws.Draws.peak``) share their evaluations: every input's starts
at every input 1, evaluated once; the peaks are the same as computed one by one."""

from __future__ import annotations

import numpy as np

import eqsat_mirage as em
from eqsat_mirage.verifier import draws as draws_mod
from eqsat_mirage.verifier.draws import Draws


def _program(scale: float) -> em.Graph:
    g = em.Graph("p")
    x, y, z = (g.input(n, (4, 8), dtype="float16") for n in ("x", "y", "z"))
    g.output(((x * y) * z) * scale, "out")
    return g


def _counted(work, monkeypatch):
    """``work()``'s result and how many programs it evaluated (``draws.evaluate`` and
    ``draws.evaluate_kept`` calls: a Graph's bisections keep node values between theirs)."""
    calls = []
    real = {name: getattr(draws_mod, name) for name in ("evaluate", "evaluate_kept")}

    def counted(name):
        def call(*args, **kwargs):
            calls.append(1)
            return real[name](*args, **kwargs)
        return call

    for name in real:
        monkeypatch.setattr(draws_mod, name, counted(name))
    try:
        return work(), len(calls)
    finally:
        for name, fn in real.items():
            monkeypatch.setattr(draws_mod, name, fn)


def _peaks(program, memo: dict, monkeypatch) -> tuple[list[float], int]:
    d = Draws(program, np.random.default_rng(0), memo, 65504.0)
    return _counted(lambda: [d.peak(i) for i in range(3)], monkeypatch)


def test_every_bisection_reads_one_evaluation_at_every_input_one(monkeypatch):
    # not finite at every input 1 (70000 > 65504): each peak is 1, one evaluation in all
    peaks, calls = _peaks(_program(70000.0), {}, monkeypatch)
    assert peaks == [1.0, 1.0, 1.0] and calls == 1


def _peak_alone(program, i: int, monkeypatch) -> tuple[float, int]:
    d = Draws(program, np.random.default_rng(0), {}, 65504.0)
    return _counted(lambda: d.peak(i), monkeypatch)


def test_shared_evaluations_give_the_peaks_computed_one_by_one(monkeypatch):
    shared, calls = _peaks(_program(2.0), {}, monkeypatch)
    alone = [_peak_alone(_program(2.0), i, monkeypatch) for i in range(3)]
    # x y z 2 stays below 65504 with one input at 2^14.75 (the others 1): a quarter-step
    # bisection finds the same largest exponent for each, alone or with a shared memo
    assert shared == [p for p, _ in alone] == [2.0 ** 14.75] * 3
    # the second and third bisections reuse "every input 1"; nothing else is shared
    assert calls == sum(n for _, n in alone) - 2
    memo: dict = {}
    _peaks(_program(2.0), memo, monkeypatch)
    assert _peaks(_program(2.0), memo, monkeypatch)[1] == 0  # a search's memo: none again


def test_kept_node_values_give_the_same_peaks():
    """``Draws._finite`` keeps each node's value under the values of the inputs it reads
    (``floating.KeptValues``): the peaks are those of evaluating every node every time."""
    g = em.Graph("q")
    x, y, z = (g.input(n, (4, 8), dtype="float16") for n in ("x", "y", "z"))
    g.output(em.exp(x - y) * z + (y * z).sum(axis=1, keepdims=True), "out")
    kept = Draws(g, np.random.default_rng(0), {}, 65504.0)
    plain = Draws(g, np.random.default_rng(0), {}, 65504.0)
    plain._kept = draws_mod.KeptValues(0)  # nothing kept: every node computed each time
    for d in (kept, plain):
        d.found = [d.peak(i) for i in range(-1, 3)] + [d.peak_set(j) for j in range(3)]
    assert kept.found == plain.found
    assert kept._kept.values and not plain._kept.values
