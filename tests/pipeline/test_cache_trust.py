"""The results cache trusts nothing it did not make: an entry without this user's tag is
served only if its figures are its program's and its program passes the full check at
every seed of a fixed thorough plan (issue 51's poisoned-cache attack)."""

from __future__ import annotations

import sqlite3
import warnings

import pytest

import eqsat_mirage as em
from eqsat_mirage.mugraph.program import from_graph
from eqsat_mirage.pipeline.cache import ResultCache, lookup, make_key
from eqsat_mirage.pipeline.options import SearchOptions
from eqsat_mirage.pipeline.result import OptimizeResult
from eqsat_mirage.pipeline.search import price, reverifier

OPTIONS = SearchOptions(time_limit_s=120, compile_check=False)


def difference(dtype: str = "float16") -> tuple[em.Graph, em.Graph]:
    """``exp(A - B)`` and the form that overflows where it does not: ``exp(A) / exp(B)``."""
    g = em.Graph("d")
    a, b = g.input("A", (3, 4), dtype=dtype), g.input("B", (1, 4), dtype=dtype)
    g.output(em.exp(a - b), "O")
    h = em.Graph("d")
    a, b = h.input("A", (3, 4), dtype=dtype), h.input("B", (1, 4), dtype=dtype)
    h.output(em.exp(a) / em.exp(b), "O")
    return g, h


def plant(store: ResultCache, key: str, graph, program, cost=None) -> None:
    """An entry as someone without this user's key writes it: valid data, the figures
    re-priced for the planted program (or ``cost``), a forged tag."""
    cost_us, baseline = price(graph, program, OPTIONS)
    res = OptimizeResult(program=program, cost_us=cost_us if cost is None else cost,
                         baseline_cost_us=baseline, verified=None, stats={"target": "h100"},
                         source=graph)
    store.put(key, res)
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE results SET tag = ? WHERE key = ?", ("0" * 64, key))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_every_plant_of_the_unsafe_form_is_refused(tmp_path, dtype):
    g, h = difference(dtype)
    store = ResultCache(tmp_path / "c.sqlite").check()
    key = make_key(g, OPTIONS)
    check = reverifier(g, OPTIONS)
    for _ in range(100 if dtype == "float16" else 10):
        plant(store, key, g, from_graph(h))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert lookup(store, g, key, reverify=check) is None
        assert any("does not verify" in str(w.message) for w in caught)
        assert store.get(key) is None  # dropped


def test_forged_figures_are_refused_even_for_a_true_program(tmp_path):
    g, _ = difference("float32")
    store = ResultCache(tmp_path / "c.sqlite").check()
    key = make_key(g, OPTIONS)
    plant(store, key, g, from_graph(g), cost=0.001)
    with pytest.warns(RuntimeWarning, match="figures are not its program's"):
        assert lookup(store, g, key, reverify=reverifier(g, OPTIONS)) is None
    plant(store, key, g, from_graph(g))  # the same program with its true figures is served
    res = lookup(store, g, key, reverify=reverifier(g, OPTIONS))
    assert res is not None and res.stats["cache"] == "hit (re-verified)"


def test_a_foreign_entry_s_roofline_kernels_and_timings_are_not_taken_on_trust(tmp_path):
    """An untagged entry's roofline is re-priced like its cost (a forged one is refused, a
    missing one given), its kernel counts are recounted from its program, and its measured
    times (``tuned``, a device's) are dropped, with a note (the audit's forged figures)."""
    g, _ = difference("float32")
    mg = from_graph(g)
    store = ResultCache(tmp_path / "c.sqlite").check()
    key = make_key(g, OPTIONS)
    cost_us, baseline = price(g, mg, OPTIONS)
    forged = {"target": "h100", "custom_kernels": 99, "kernels": 99,
              "tuned": [{"how": "fake", "measured_us": 0.001}]}
    for roofline in (1e-6, None):
        res = OptimizeResult(program=mg, cost_us=cost_us, baseline_cost_us=baseline,
                             verified=None, stats=dict(forged), source=g, roofline_us=roofline)
        store.put(key, res)
        conn = sqlite3.connect(store.path)
        conn.execute("UPDATE results SET tag = ? WHERE key = ?", ("0" * 64, key))
        conn.commit()
        conn.close()
        if roofline is not None:
            with pytest.warns(RuntimeWarning, match="roofline 1e-06 us stated"):
                assert lookup(store, g, key, reverify=reverifier(g, OPTIONS)) is None
            continue
        got = lookup(store, g, key, reverify=reverifier(g, OPTIONS))
        assert got is not None and got.stats["cache"] == "hit (re-verified)"
        assert got.roofline_us is not None and got.roofline_us > 0.01
        assert got.stats["kernels"] == len(mg.kernels) != 99
        assert got.stats["custom_kernels"] == sum(k.kind == "custom" for k in mg.kernels)
        assert "tuned" not in got.stats and "re-verified" in got.stats["cache_note"]
