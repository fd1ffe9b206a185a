"""A program saturated as ``em.optimize`` saturates it (every phase, the rule files' facts),
for the tests of the block level (tests/egraph/test_block.py, test_kernels.py)."""

from __future__ import annotations

from eqsat_mirage.egraph.rulefiles import load_rule_files
from eqsat_mirage.egraph.saturate import DEFAULT_PHASES, Limits, Saturator
from eqsat_mirage.pipeline.options import DEFAULT_SPLITS
from eqsat_mirage.pipeline.search import candidate_splits


def saturated(graph, rules=("rules",), guards=True) -> Saturator:
    """``graph`` loaded with ``rules`` (files or folders) and run through every phase."""
    rulesets, rule_list, facts = load_rule_files(rules)
    sat = Saturator(graph, rulesets, rule_list, guards=guards, facts=facts,
                    splits=candidate_splits(graph, DEFAULT_SPLITS))
    for name, rs in DEFAULT_PHASES:
        rs = tuple(r for r in rs if r in rulesets)
        if rs:
            sat.run_phase(name, rs, Limits())
    return sat
