"""The schema and rules are loaded into an e-graph once per thread (``saturate.LOADED``):
a search takes the loaded e-graph, adds its program on top and, done, pops it off again.
A second search of a program gives exactly the first one's e-graph, on any thread."""

from __future__ import annotations

import threading

import eqsat_mirage as em
from bench.programs import program
from eqsat_mirage.egraph.rulefiles import load_rules
from eqsat_mirage.egraph.saturate import DEFAULT_PHASES, LOADED, Limits, Saturator
from eqsat_mirage.pipeline.search import candidate_splits

RULESETS, RULES = load_rules(["rules"])


def _serialized(g: em.Graph) -> dict:
    """``g``'s e-graph after the algebraic phase (then the Saturator is released)."""
    sat = Saturator(g, RULESETS, RULES, splits=candidate_splits(g, (4, 16, 64)))
    sat.run_phase("algebraic", DEFAULT_PHASES[0][1], Limits(iter_limit=3))
    data = sat.serialize()
    sat.release()
    return data


def test_a_reused_e_graph_gives_the_same_e_graph_as_a_fresh_one():
    g = program("rmsnorm", 1)
    first = _serialized(g)
    text = Saturator(g, RULESETS, RULES).rules_text  # (takes one idle e-graph, if any)
    while LOADED.take(text) is not None:  # none idle: the next search loads the rules
        pass
    fresh = _serialized(g)
    assert LOADED.idle(text) == 1  # given back
    again = _serialized(g)  # on the e-graph ``fresh`` gave back
    assert first == fresh == again
    other = _serialized(program("lora", 1))  # another program on the same e-graph
    assert other != first and _serialized(g) == first  # nothing of it stays behind


def test_each_thread_loads_its_own():
    g = program("lora", 1)
    want = _serialized(g)
    got: list = []
    worker = threading.Thread(target=lambda: got.append(_serialized(g)))
    worker.start()
    worker.join()
    assert got == [want]  # an e-graph made on this thread is never handed to another


def test_a_release_on_another_thread_does_nothing():
    g = program("lora", 1)
    sat = Saturator(g, RULESETS, RULES)
    before = LOADED.idle(sat.rules_text)
    worker = threading.Thread(target=sat.release)
    worker.start()
    worker.join()  # egglog's e-graphs are bound to their thread: not used, nor dropped there
    assert sat.egraph is not None and LOADED.idle(sat.rules_text) == before
    sat.release()
    assert sat.egraph is None and LOADED.idle(sat.rules_text) == min(before + 1, 2)
    sat.release()  # a second release does nothing
