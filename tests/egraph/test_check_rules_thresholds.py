"""Issue 51 (a regression): ``check_rules`` draws sizes past every number a rule writes, on
either side or in its facts, an integer or a float, small or not, and verifies such an
instance (every dim past it) first; ``mean = sum / min(n, 6)`` was "sound" on 3 of 40
instances, none with a count above 6."""

from __future__ import annotations

import re

import pytest

import eqsat_mirage as em

CAPPED = {  # the mean over a count capped at a constant: true only for counts up to it
    "int": ("(rewrite (Mean ax x) (Div (Sum ax x) (Const (to-f64 (min n 6)))) "
            ":when ((= n (dim x ax))) :ruleset user)", 6),
    "float": ("(rewrite (Mean ax x) (Div (Sum ax x) (Const (min (to-f64 (dim x ax)) 6.0))) "
              ":ruleset user)", 6),
    "small": ("(rewrite (Mean ax x) (Div (Sum ax x) (Const (to-f64 (min n 3)))) "
              ":when ((= n (dim x ax))) :ruleset user)", 3),
    "large": ("(rewrite (Mean ax x) (Div (Sum ax x) (Const (to-f64 (min n 12)))) "
              ":when ((= n (dim x ax))) :ruleset user)", 12),
}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("kind", CAPPED)
def test_a_rule_true_only_below_a_constant_is_unsound(tmp_path, kind, seed):
    rule, cap = CAPPED[kind]
    path = tmp_path / "capped.egg"
    path.write_text(f"(ruleset user)\n; mean is the sum over a capped count\n{rule}\n")
    (r,) = em.check_rules(str(path), seed=seed).results
    assert r.status == "unsound", (r.status, r.message)
    shape = re.search(r"x: \(([\d, ]+)\)", r.message).group(1)
    assert min(int(d) for d in shape.split(",") if d.strip()) > cap, r.message
