"""Bad input raises the project's errors (ValueError subclasses) naming the culprit.

Every check asserts on the message: which op or name, the operands' shapes and
where the user wrote it (this file's name and line).
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir import errors

HERE = r"test_errors\.py:\d+"


def _line() -> int:
    """The caller's line number (to check errors point at the exact line)."""
    return inspect.currentframe().f_back.f_lineno


def graph(name: str = "g", **shapes: tuple[int, ...]) -> tuple[em.Graph, list[em.Tensor]]:
    g = em.Graph(name)
    return g, [g.input(k, s, dtype="float32") for k, s in shapes.items()]


def program(name: str, fn, **shapes: tuple[int, ...]) -> em.Graph:
    g, ts = graph(name, **shapes)
    out = fn(*ts)
    for k, t in (out if isinstance(out, dict) else {"O": out}).items():
        g.output(t, k)
    return g


# --- error hierarchy -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [errors.ShapeError, errors.DTypeError, errors.GraphError,
                                 errors.InputError, errors.LaxError, errors.RuleError])
def test_every_error_is_a_mirage_value_error(cls):
    assert issubclass(cls, errors.MirageError)
    assert issubclass(cls, ValueError)
    assert getattr(em, cls.__name__) is cls


# --- shape errors, one per op kind -----------------------------------------------------------


def test_add_broadcast_mismatch_names_op_operands_shapes_and_line():
    g, (a, b) = graph(A=(3, 4), B=(5, 4))
    line = _line() + 2
    with pytest.raises(em.ShapeError) as info:
        a + b
    msg = str(info.value)
    assert msg.startswith("add of input 'A'")
    assert "input 'B'" in msg and "(3, 4)" in msg and "(5, 4)" in msg
    assert "do not broadcast" in msg
    assert f"test_errors.py:{line}" in msg


@pytest.mark.parametrize("op, sym", [("sub", "-"), ("mul", "*"), ("div", "/")])
def test_binary_broadcast_mismatch(op, sym):
    g, (a, b) = graph(A=(2, 3), B=(2, 4))
    fn = {"-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[sym]
    with pytest.raises(em.ShapeError, match=rf"^{op} of input 'A'.*\(2, 3\).*\(2, 4\).*"
                                            rf"shapes do not broadcast.*{HERE}"):
        fn()


def test_matmul_contraction_mismatch():
    g, (a, b) = graph(A=(4, 8), B=(4, 3))
    with pytest.raises(em.ShapeError,
                       match=rf"matmul of input 'A'.*\(4, 8\), input 'B'.*\(4, 3\): "
                             rf"contraction dims differ \(8 vs 4\).*{HERE}"):
        a @ b


def test_matmul_of_scalar_operand():
    g, (a,) = graph(A=(4, 8))
    s = a.sum()
    with pytest.raises(em.ShapeError, match=r"matmul.*at least 1 dimension"):
        s @ a


def test_matmul_batch_dims_mismatch():
    g, (p, r) = graph(P=(2, 4, 8), R=(3, 8, 5))
    with pytest.raises(em.ShapeError, match=rf"matmul of input 'P'.*\(2, 4, 8\), input 'R'.*"
                                            rf"\(3, 8, 5\): batch dims \(2\) and \(3\) do not "
                                            rf"broadcast.*{HERE}"):
        p @ r


def test_concat_mismatch_outside_axis():
    g, (a, b) = graph(A=(3, 4), B=(5, 4))
    with pytest.raises(em.ShapeError, match=rf"concat of input 'A'.*\(3, 4\), input 'B'.*"
                                            rf"\(5, 4\): shapes differ outside axis 1.*{HERE}"):
        em.concat([a, b], axis=1)


def test_concat_rank_mismatch():
    g, (a, b) = graph(A=(3, 4), B=(2, 3, 4))
    with pytest.raises(em.ShapeError, match=r"concat of .*\(3, 4\).*\(2, 3, 4\)"):
        em.concat([a, b], axis=0)


def test_concat_bad_axis_and_empty_list():
    g, (a, b) = graph(A=(3, 4), B=(3, 4))
    with pytest.raises(em.ShapeError, match=rf"concat \(at {HERE}\): axis 2 out of range "
                                            r"\(or not an int\) for 2-d tensors"):
        em.concat([a, b], axis=2)
    with pytest.raises(em.GraphError, match=r"concat .*non-empty list of Tensors"):
        em.concat([], axis=0)
    with pytest.raises(em.GraphError, match=r"concat .*non-empty list of Tensors"):
        em.concat([a, np.ones((3, 4))], axis=0)


@pytest.mark.parametrize("new, shown", [((5, 3), r"\(5, 3\)"), ((5, -1), r"\(5, 2\)"),
                                        ((12, 0), r"\(12, 0\)")])
def test_reshape_size_mismatch(new, shown):
    g, (a,) = graph(A=(3, 4))
    with pytest.raises(em.ShapeError, match=rf"reshape of input 'A'.*: cannot reshape "
                                            rf"\(3, 4\) to {shown}.*{HERE}"):
        a.reshape(*new)


@pytest.mark.parametrize("perm, shown", [((0, 0), r"\(0, 0\)"), ((1, 0), r"\(1, 0\)"),
                                         ((0, 1, 3), r"\(0, 1, 3\)")])
def test_transpose_bad_permutation(perm, shown):
    g, (p,) = graph(P=(2, 4, 8))
    with pytest.raises(em.ShapeError, match=rf"transpose of input 'P'.*\(2, 4, 8\): {shown} is "
                                            rf"not a permutation of 3 axes.*{HERE}"):
        p.transpose(*perm)


def test_transpose_out_of_range_axis_is_not_wrapped():
    g, (a,) = graph(A=(3, 4))
    with pytest.raises(em.ShapeError, match=r"\(1, 2\) is not a permutation of 2 axes"):
        a.transpose(1, 2)
    assert a.transpose(-1, -2).shape == (4, 3)


@pytest.mark.parametrize("method", ["sum", "mean"])
@pytest.mark.parametrize("axis, why", [(2, "axis 2 out of range for a 2-d tensor"),
                                       (-3, "axis -3 out of range for a 2-d tensor"),
                                       ((0, 0), r"repeated axis in \(0, 0\)"),
                                       ("x", "axis 'x' out of range")])
def test_reduce_bad_axis(method, axis, why):
    g, (a,) = graph(A=(3, 4))
    with pytest.raises(em.ShapeError, match=rf"^{method} \(at {HERE}\) of input 'A'.*"
                                            rf"\(3, 4\): {why}"):
        getattr(a, method)(axis=axis)


def test_unsupported_power_and_operand_type():
    g, (a,) = graph(A=(3, 4))
    with pytest.raises(em.GraphError, match=rf"power 3 \(at {HERE}\): only 2, 1, 0.5"):
        a ** 3
    with pytest.raises(em.GraphError, match=r"add .*unsupported operand of type str"):
        a + "1"


# --- declarations: dtypes, names, outputs ----------------------------------------------------


@pytest.mark.parametrize("dtype", ["int16", "float64", "complex", None])
def test_unknown_dtype(dtype):
    g = em.Graph("g")
    with pytest.raises(em.DTypeError, match=rf"unknown dtype {re.escape(repr(dtype))}: "
                                            r"expected one of float16, bfloat16, float32"):
        g.input("X", (2, 2), dtype=dtype)


@pytest.mark.parametrize("alias, canonical", [("fp16", "float16"), ("bf16", "bfloat16"),
                                              ("half", "float16"), ("float", "float32"),
                                              (np.dtype("float16"), "float16")])
def test_dtype_aliases_are_accepted(alias, canonical):
    assert em.Graph("g").input("X", (2,), dtype=alias).dtype == canonical


def test_duplicate_input_name():
    g, _ = graph("gg", X=(2, 2))
    with pytest.raises(em.GraphError, match=rf"duplicate input name 'X' \(at {HERE}\) in "
                                            r"graph 'gg'"):
        g.input("X", (3,), dtype="float32")


# issue 51: a Python keyword ("class") is an input name now (a torch module may name a buffer
# or an argument so: generated code holds names only as string literals or mangled); any
# other non-identifier (empty, not a str, spaces, control characters) is still refused
@pytest.mark.parametrize("name", ["bad name", "1x", "", 3, None, "a\nb", "a\x00b", "x\x1b",
                                  "a-b", "é\t"])
def test_input_name_must_be_identifier(name):
    with pytest.raises(em.GraphError, match=rf"input name {re.escape(repr(name))} \(at {HERE}\) "
                                            r"must be a Python identifier"):
        em.Graph("g").input(name, (2,), dtype="float32")


def test_every_python_keyword_is_an_input_name():
    """Issue 51: ``class``, ``None``, ``lambda`` ... are input names (and MuGraph names)."""
    import keyword

    g, mg = em.Graph("g"), em.MuGraph("m")
    for name in keyword.kwlist + keyword.softkwlist:
        assert g.input(name, (2,), dtype="float32").node.arg == name
        assert mg.input(name, (2,), "float32") == name
    assert list(g.inputs) == keyword.kwlist + keyword.softkwlist


@pytest.mark.parametrize("shape, why", [((2, 0), r"shape \(2, 0\) has a non-positive dim"),
                                        ((-1,), r"shape \(-1\) has a non-positive dim"),
                                        (5, "is not a sequence of ints")])
def test_bad_input_shape(shape, why):
    with pytest.raises(em.ShapeError, match=rf"input 'X' \(at {HERE}\): .*{why}"):
        em.Graph("g").input("X", shape, dtype="float32")


def test_output_tensor_from_another_graph():
    g1, (a,) = graph("first", A=(2, 2))
    g2, _ = graph("second", B=(2, 2))
    with pytest.raises(em.GraphError, match=rf"output 'O' \(at {HERE}\): tensor mul \(at {HERE}\) "
                                            r"belongs to graph 'first', not 'second'"):
        g2.output(a * 2.0, "O")
    with pytest.raises(em.GraphError, match=r"output 'O'.*expected a Tensor.*got ndarray"):
        g2.output(np.ones((2, 2)), "O")


def test_duplicate_output_name_and_output_named_like_input():
    g, (a,) = graph(A=(2, 2))
    g.output(a * 2.0, "O")
    with pytest.raises(em.GraphError, match=rf"duplicate output name 'O' \(at {HERE}\)"):
        g.output(a + 1.0, "O")
    with pytest.raises(em.GraphError, match=r"output name 'A' .* is already an input name"):
        g.output(a + 1.0, "A")


@pytest.mark.parametrize("how", ["add", "radd", "matmul", "concat", "mul-of-result"])
def test_mixing_tensors_of_two_graphs(how):
    g1, (a,) = graph("one", A=(2, 2))
    g2, (b,) = graph("two", B=(2, 2))
    fn = {"add": lambda: a + b, "radd": lambda: b + a, "matmul": lambda: a @ b,
          "concat": lambda: em.concat([a, b], 0), "mul-of-result": lambda: (a + 1.0) * (b @ b)}
    with pytest.raises(em.GraphError, match=rf"\(at {HERE}\): operands come from different "
                                            r"graphs \('(one|two)' and '(one|two)'\)"):
        fn[how]()


def test_graph_without_outputs_is_rejected():
    g, _ = graph("lonely", X=(2,))
    with pytest.raises(em.GraphError, match=r"graph 'lonely' has no outputs"):
        em.evaluate(g, {"X": np.ones(2)})
    with pytest.raises(em.GraphError, match=r"graph 'lonely' has no outputs"):
        em.check(g)


# --- the verifier: Lax fragment and matching interfaces --------------------------------------


def test_exp_of_exp_is_not_lax():
    bad = program("twice", lambda x: em.exp(em.exp(x)), X=(3, 4))
    ok = program("once", lambda x: em.exp(x), X=(3, 4))
    with pytest.raises(em.LaxError, match=rf"first program 'twice' is not a Lax program: "
                                          rf"node %\d+ exp \(at {HERE}\) takes exp of a value "
                                          r"that already went through exp"):
        em.verify(bad, ok)
    with pytest.raises(em.LaxError, match=r"second program 'twice' is not a Lax program"):
        em.verify(ok, bad)
    with pytest.raises(em.LaxError):
        em.check_lax(bad)


def test_exp_of_product_of_exps_is_not_lax():
    def fn(x, y):
        return em.exp(em.exp(x) @ em.exp(y))

    line = inspect.getsourcelines(fn)[1] + 1
    bad = program("attn2", fn, X=(3, 4), Y=(4, 3))
    ok = program("fine", lambda x, y: em.exp(x) @ em.exp(y), X=(3, 4), Y=(4, 3))
    assert em.verify(ok, ok, trials=1, seed=0).equivalent
    with pytest.raises(em.LaxError) as info:
        em.verify(bad, ok)
    msg = str(info.value)
    assert "'attn2' is not a Lax program" in msg
    assert f"exp (at test_errors.py:{line})" in msg
    assert "<-" in msg  # the chain of exps on the offending path


def test_exp_through_opaque_is_not_lax():
    bad = program("silu_sandwich", lambda x: em.exp(em.silu(em.exp(x))), X=(3, 4))
    with pytest.raises(em.LaxError, match=r"'silu_sandwich' is not a Lax program"):
        em.verify(bad, bad)


@pytest.mark.parametrize("kind", ["input-name", "input-shape", "output-name", "output-shape"])
def test_verify_needs_matching_interfaces(kind):
    a = program("a", lambda x: {"O": x * 2.0}, X=(3, 4))
    b = {
        "input-name": lambda: program("b", lambda y: {"O": y * 2.0}, Y=(3, 4)),
        "input-shape": lambda: program("b", lambda x: {"O": (x * 2.0).T}, X=(4, 3)),
        "output-name": lambda: program("b", lambda x: {"P": x * 2.0}, X=(3, 4)),
        "output-shape": lambda: program("b", lambda x: {"O": x.sum(axis=0)}, X=(3, 4)),
    }[kind]()
    expect = {
        "input-name": r"inputs differ \(\['X'\] vs \['Y'\]\)",
        "input-shape": r"input 'X' has shape \(3, 4\) vs \(4, 3\)",
        "output-name": r"outputs differ \(\['O'\] vs \['P'\]\)",
        "output-shape": r"output 'O' has shape \(3, 4\) vs \(4\)",
    }[kind]
    with pytest.raises(em.GraphError, match=rf"cannot compare 'a' and 'b': {expect}"):
        em.verify(a, b)


def test_verify_rejects_zero_trials():
    a = program("a", lambda x: x, X=(2,))
    with pytest.raises(em.MirageError, match=r"trials must be >= 1, got 0"):
        em.verify(a, a, trials=0)


# --- evaluate: inputs must match the program -------------------------------------------------


@pytest.fixture
def prog():
    return program("prog", lambda x, w: x @ w, X=(3, 4), W=(4, 2))


def test_evaluate_missing_input(prog):
    with pytest.raises(em.InputError, match=r"inputs of 'prog': missing \['W'\] "
                                            r"\(expected \['X', 'W'\]\)"):
        em.evaluate(prog, {"X": np.ones((3, 4))})


def test_evaluate_extra_input(prog):
    with pytest.raises(em.InputError, match=r"inputs of 'prog': unknown \['Z'\]"):
        em.evaluate(prog, {"X": np.ones((3, 4)), "W": np.ones((4, 2)), "Z": 1.0})


def test_evaluate_missing_and_extra_input(prog):
    with pytest.raises(em.InputError, match=r"missing \['W'\]; unknown \['V'\]"):
        em.evaluate(prog, {"X": np.ones((3, 4)), "V": np.ones((4, 2))})


def test_evaluate_wrong_shape(prog):
    with pytest.raises(em.InputError, match=r"input 'W' of 'prog': expected shape \(4, 2\), "
                                            r"got \(2, 4\)"):
        em.evaluate(prog, {"X": np.ones((3, 4)), "W": np.ones((2, 4))})


def test_evaluate_non_mapping_and_unconvertible(prog):
    with pytest.raises(em.InputError, match=r"inputs must be a dict of name -> array; got list"):
        em.evaluate(prog, [np.ones((3, 4)), np.ones((4, 2))])
    with pytest.raises(em.InputError, match=r"input 'X': cannot convert str to an array"):
        em.evaluate(prog, {"X": "abc", "W": np.ones((4, 2))})


def test_evaluate_unknown_dtype(prog):
    with pytest.raises(em.DTypeError, match=r"unknown dtype 'int8'"):
        em.evaluate(prog, {"X": np.ones((3, 4)), "W": np.ones((4, 2))}, dtype="int8")


def test_errors_are_catchable_as_value_error(prog):
    with pytest.raises(ValueError):
        em.evaluate(prog, {})
    g, (a, b) = graph(A=(2, 3), B=(4, 5))
    with pytest.raises(ValueError):
        a @ b
