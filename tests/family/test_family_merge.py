"""A shape family's one launcher (family/launcher.py): integer literals that change with the
padded size become exact polynomials of ``lp``; anything else that changes is refused."""

import pytest

from eqsat_mirage.family.launcher import FamilyLaunchError, _fit, merge, render

HOST = '''\
K = 1.5


def run(x):
    # grid at lp = {lp}
    y = x.new_empty(({parts}, 4, {lp}))
    kernel[(4, {parts})](x, y, {iters}, {square})
    return y
'''


def module(lp: int, **over) -> str:
    values = {"lp": lp, "parts": lp // 64, "iters": lp // 16 + 1, "square": lp * lp} | over
    return HOST.format(**values)


def evaluate(expr: str, lp: int) -> int:
    assert set(expr) <= set("lp0123456789+-*/() "), expr  # only what render writes
    return eval(expr, {"__builtins__": {}}, {"lp": lp})  # noqa: S307 - checked above


FORMULAS = {  # what Scaling's launch literals look like, as functions of the padded size
    "grid parts": lambda lp: lp // 64,
    "loop count with an offset": lambda lp: lp // 16 + 1,
    "an L x L tensor's size": lambda lp: lp * lp,
    "a stride of a (parts, 4, lp) tensor": lambda lp: 4 * lp,
    "a constant": lambda lp: 7,
    "a difference": lambda lp: 100 - lp // 64,
}


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_a_fitted_literal_equals_its_formula_at_every_multiple_of_the_granule(name):
    f = FORMULAS[name]
    a, b, c, div = _fit({lp: f(lp) for lp in (64, 128, 192, 256)}, 64)
    for bare in (True, False):
        expr = render(a, b, c, div, bare)
        for u in range(1, 200):  # far past the sizes it was fitted at
            assert evaluate(expr, 64 * u) == f(64 * u), (expr, u)


def test_a_literal_that_is_no_integer_polynomial_is_refused():
    with pytest.raises(FamilyLaunchError, match="degree <= 2"):
        _fit({64: 2, 128: 2, 192: 2, 256: 4, 320: 4}, 64)  # a step: num_stages at a threshold
    with pytest.raises(FamilyLaunchError, match="not an integer"):
        _fit({64: 1, 128: 2, 192: 3}, 32)  # lp // 64 is not whole at lp = 32


def test_merge_rewrites_only_the_changing_literals_inside_the_launcher():
    texts = {lp: module(lp) for lp in (64, 128, 192, 256, 320)}
    merged = merge(texts, 64, 128)
    assert "K = 1.5" in merged and "# grid at lp = 128" in merged  # comments: the base's
    assert "x.new_empty((lp // 64, 4, lp))" in merged
    assert "kernel[(4, lp // 64)](x, y, (lp + 16) // 16, lp * lp)" in merged
    compile(merged, "<merged>", "exec")


@pytest.mark.parametrize("change, match", [
    ({"square": "1.5"}, "integer literal"),            # a float that changes
    ({"iters": "n"}, "integer literal"),               # a name instead of a number
])
def test_merge_refuses_other_changes(change, match):
    texts = {lp: module(lp) for lp in (64, 128, 192)}
    texts[192] = module(192, **change)
    with pytest.raises(FamilyLaunchError, match=match):
        merge(texts, 64, 64)


def test_merge_refuses_a_literal_outside_the_launcher_or_a_changed_statement():
    texts = {lp: f"K = {lp}\n\n\ndef run(x):\n    return x\n" for lp in (64, 128, 192)}
    with pytest.raises(FamilyLaunchError, match="line 1"):
        merge(texts, 64, 64)
    texts = {lp: module(lp) for lp in (64, 128, 192)}
    texts[128] = texts[128].replace("    return y", "    y = y + 1\n    return y")
    with pytest.raises(FamilyLaunchError, match="statements"):
        merge(texts, 64, 64)


def test_merge_parenthesizes_a_literal_inside_an_expression():
    texts = {lp: f"def run(x):\n    return x - {lp // 64} * 2, x[:{lp}]\n" for lp in (64, 128, 192)}
    merged = merge(texts, 64, 64)
    assert "x - (lp // 64) * 2" in merged and "x[:lp]" in merged  # not x - lp // 64 * 2
    compile(merged, "<merged>", "exec")


def test_merge_refuses_a_module_that_is_not_python():
    texts = {lp: f"def run(x):\n    if x and\n        return {lp}\n" for lp in (64, 128, 192)}
    with pytest.raises(FamilyLaunchError, match="not valid Python"):
        merge(texts, 64, 64)


def test_a_literal_changing_sign_is_refused_not_misfitted():
    texts = {lp: f"def run(x):\n    return x * {128 - lp}\n" for lp in (64, 128, 192)}
    with pytest.raises(FamilyLaunchError):
        merge(texts, 64, 64)  # -64 is two tokens: the statements differ
