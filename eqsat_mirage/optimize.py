"""``em.optimize``: the pipeline as a list of named passes.

build/check -> load rules (user rules checked for soundness) -> encode +
saturate (phases, guarded) -> extract (k best, DAG-aware) -> verify (the first
candidate that passes wins; the input program itself is always a candidate).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .check import check, check_lax
from .cost import Hardware, graph_cost_us
from .encode import graph_from_outputs
from .errors import LaxError
from .extract import extract
from .rulefiles import Schema, builtin_rules_dir, load_rules, rule_paths
from .saturate import DEFAULT_PHASES, Limits, Saturator
from .verify import VerifyResult, verify

DEFAULT_SPLITS = (4, 16, 64)  # Mirage's loop ranges: candidate inner factors of split-K


@dataclass
class OptimizeResult:
    """What ``em.optimize`` found: the chosen program, its cost and how it was found."""

    program: object
    cost_us: float
    baseline_cost_us: float
    verified: VerifyResult | None
    stats: dict = field(default_factory=dict)
    candidates: list = field(default_factory=list)
    source: object = None

    @property
    def speedup(self) -> float:
        """Baseline cost over chosen cost (cost-model figures)."""
        return self.baseline_cost_us / self.cost_us if self.cost_us else float("inf")

    def __str__(self) -> str:
        st = self.stats
        lines = [f"optimized {getattr(self.source, 'name', 'program')!r} for "
                 f"{st.get('target', '?')}: {self.baseline_cost_us:.2f} us -> "
                 f"{self.cost_us:.2f} us ({self.speedup:.2f}x, cost model)"]
        for ph in st.get("phases", []):
            lines.append(f"  phase {ph['name']:<10} {ph['iterations']:>3} iterations "
                         f"{ph['enodes']:>8} e-nodes {ph['seconds']:7.2f} s  ({ph['stop']})")
        lines.append(f"  extraction: {st.get('candidates', 0)} candidates in "
                     f"{st.get('extract_seconds', 0):.2f} s; verified: {self.verified}")
        lines.append(str(self.program))
        return "\n".join(lines)


def _splits(graph, factors) -> list[tuple[int, int, int]]:
    dims = {d for n in graph.nodes() for d in n.shape}
    return sorted({(n, n // f, f) for n in dims for f in factors if n % f == 0 and n // f > 1
                   and f > 1})


def optimize(graph, target: str | Path = "h100", rules=("rules",), guards: bool = True,
             time_limit_s: float = 30.0, node_limit: int = 200_000, iter_limit: int = 12,
             k: int = 4, trials: int = 3, seed: int = 0, split_factors=DEFAULT_SPLITS,
             progress: Callable[[str], None] | None = None) -> OptimizeResult:
    """Superoptimize ``graph`` for ``target``; returns the best verified program.

    ``rules`` lists rule files and folders ("rules" is the built-in set); user
    files are checked for soundness first and an unsound rule is refused with
    a ``RuleError``. Saturation stops at ``node_limit`` tensor e-nodes,
    ``iter_limit`` iterations or ``time_limit_s`` seconds per phase. Every
    returned program passed ``em.verify`` against ``graph``.
    """
    t0 = time.perf_counter()
    check(graph)
    hw = Hardware.load(target)
    user = [p for p in rule_paths(rules) if p.parent != builtin_rules_dir()]
    if user:
        from .check_rules import assert_sound

        assert_sound([str(p) for p in user])
    rulesets, rule_list = load_rules(rules)
    stats: dict = {"target": hw.name, "guards": guards, "rules": len(rule_list)}
    baseline = graph_cost_us(graph, hw)
    try:
        check_lax(graph)
        lax = True
    except LaxError:
        lax = False
    t1 = time.perf_counter()
    sat = Saturator(graph, rulesets, rule_list, guards=guards,
                    splits=_splits(graph, split_factors))
    limits = Limits(node_limit=node_limit, iter_limit=iter_limit, time_limit_s=time_limit_s)
    phases = [(name, tuple(r for r in rs if r in rulesets)) for name, rs in DEFAULT_PHASES]
    extra = tuple(r for r in rulesets if all(r not in rs for _, rs in DEFAULT_PHASES))
    if extra:
        phases.append(("user", extra))
    for name, rs in phases:
        if rs:
            sat.run_phase(name, rs, limits, progress)
    stats["saturate_seconds"] = time.perf_counter() - t1
    stats["phases"] = [vars(p) for p in sat.stats]
    stats["enodes"] = sat.size()
    data = sat.serialize()
    cands, xstats = extract(data, sat.root_classes(data), graph, Schema.load().constructors,
                            hw, k=k)
    stats.update(xstats)
    stats["candidates"] = len(cands)
    chosen, result = None, None
    tried = 0
    for cand in cands:
        if cand.cost_us > baseline:
            continue
        tried += 1
        if not lax:
            break
        res = verify(graph, cand.program, trials=trials, seed=seed)
        if res.equivalent:
            chosen, result = cand, res
            break
        if progress:
            progress(f"candidate rejected by the verifier: {res.reason}")
    stats["candidates_tried"] = tried
    if chosen is None:  # nothing cheaper verified: the input program is the answer
        program = graph_from_outputs(graph, graph.outputs, f"{graph.name}_opt")
        cost = baseline
        result = verify(graph, program, trials=1, seed=seed) if lax else None
    else:
        program, cost = chosen.program, chosen.cost_us
    stats["seconds"] = time.perf_counter() - t0
    if not lax:
        stats["note"] = "not a Lax program: the verifier cannot check rewrites, input returned"
    return OptimizeResult(program, cost, baseline, result, stats, cands, graph)

