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
