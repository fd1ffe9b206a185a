"""Names never become code: hostile names at every path that writes source.

A graph's or MuGraph's name may be any text; input, output, kernel, tensor and size names
are identifiers (any other is refused where it enters). Each generated module must parse,
hold a hostile text only inside string literals (never as code, in a comment or a
docstring), use ASCII identifiers only, and compute the right values.
"""

from __future__ import annotations

import ast
import io
import json
import keyword
import os
import tokenize
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat_mirage as em
from eqsat_mirage.codegen.source import compile_mugraph
from eqsat_mirage.mugraph.kernels import MuGraphError

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs generated Triton modules: TRITON_INTERPRET=1")

MARK = "EQSAT_MIRAGE_PWNED"
EXPLOIT = f'a""" + str(__import__("os").environ.setdefault("{MARK}", "1")) + """'
TEXTS = [EXPLOIT, "a'b", 'a"b', '"""', "'''", "a\nimport os\n", "a\\", "a\\nb", "\r\n#",
         "x = 1\n", "{}", "{seq_len}", "a\x00b", "\u2028import os", "é", "名前", "a" * 10_000,
         "</text><script>alert(1)</script>", "*/ -- ", "$x^2$", "<b>bold</b>", ""]
# identifiers (every name but a graph's must be one): generated names, builtins, unicode
IDENTS = ["torch", "tl", "triton", "run", "pid", "pid_x", "seq_len", "n_iter", "f", "f_end",
          "INPUTS", "OUTPUTS", "_bind", "_check", "device", "args", "kwargs", "entry", "_",
          "__import__", "__builtins__", "float", "len", "range", "tuple", "ValueError", "os",
          "A_ptr", "stride_A_0", "BLOCK_16", "mask_16", "acc_acc", "é", "ﬁ", "fi", "x" * 10_000]
SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def texts():
    return st.one_of(st.sampled_from(TEXTS), st.text(max_size=12))


def _literal_spans(src: str, tree: ast.AST) -> list[tuple[int, int]]:
    """Where ``src``'s string literals lie (offsets; ``tree``: ``src`` parsed), docstrings
    not included."""
    starts = [0]
    for line in src.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    docs = {id(f.body[0].value) for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.Module)) and f.body
            and isinstance(f.body[0], ast.Expr) and isinstance(f.body[0].value, ast.Constant)}
    return [(starts[n.lineno - 1] + n.col_offset, starts[n.end_lineno - 1] + n.end_col_offset)
            for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def _in_code(src: str, text: str, spans: list[tuple[int, int]]) -> list[int]:
    """The offsets where ``text`` occurs in ``src`` outside its string literals."""
    found, at = [], src.find(text)
    while at >= 0:
        if not any(a <= at and at + len(text) <= b for a, b in spans):
            found.append(at)
        at = src.find(text, at + 1)
    return found


def check_source(src: str, hostile, reference: str | None = None) -> None:
    """``src`` parses, its identifiers are ASCII, and each hostile text that is not an
    identifier occurs only inside string literals (not in a comment or a docstring).
    ``reference``: the same program's source with benign names, whose code may hold a
    hostile text by itself ('torch.' in ``torch.float32``): ``src``'s code may hold it as
    often, no more."""
    tree = ast.parse(src)
    for node in ast.walk(tree):
        names = [getattr(node, a, None) for a in ("id", "name", "arg", "attr")]
        assert all(n is None or n.isascii() for n in names if isinstance(n, str)), names
    spans = _literal_spans(src, tree)
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
                if t.type == tokenize.COMMENT]
    for text in hostile:
        if len(text) < 3 or (text.isidentifier() and not keyword.iskeyword(text)):
            continue
        if not any(ch.isalnum() for ch in text):  # punctuation alone ('"""') is the module's
            continue  # own syntax too: it parses and runs right (checked), no code of its own
        if text.isascii() and all(ch.isalnum() or ch == "_" for ch in text):
            continue  # word characters alone ('00A'): shown in comments as <00A>, inert
        assert not any(text in c for c in comments), text[:40]
        code = _in_code(src, text, spans)
        allowed = 0 if reference is None else len(_in_code(
            reference, text, _literal_spans(reference, ast.parse(reference))))
        assert len(code) <= allowed, (text[:40], [src[max(0, at - 40):at + 40] for at in code])
    assert MARK not in os.environ


def small_graph(name: str, x: str, w: str, out: str) -> em.Graph:
    g = em.Graph(name)
    a = g.input(x, (4, 8), dtype="float32")
    b = g.input(w, (8, 8), dtype="float32")
    g.output(em.exp(a @ b) * 2.0, out)
    return g


@SETTINGS
@given(name=texts(), x=st.sampled_from(IDENTS), w=st.sampled_from(IDENTS),
       out=st.sampled_from(IDENTS))
def test_optimized_program_source_and_compile(name, x, w, out):
    if x == w or out in (x, w):
        return
    res = em.optimize(small_graph(name, x, w, out), level="kernel", cache=False)
    benign = em.optimize(small_graph("g", x, w, out), level="kernel", cache=False)
    src = res.triton_source()
    check_source(src, [name, x, w, out], benign.triton_source())
    fn = res.compile()
    check_source(fn.source, [name, x, w, out], benign.compile(check=False).source)
    a, b = torch.randn(4, 8), torch.randn(8, 8)
    want = torch.exp(a @ b) * 2.0
    for got in (fn(a, b), fn(**{x: a, w: b}), fn({x: a, w: b})):
        assert list(got) == [out]
        np.testing.assert_allclose(got[out].numpy(), want.numpy(), rtol=1e-5)
    assert MARK not in os.environ


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(name=texts(), names=st.lists(st.sampled_from(IDENTS), min_size=6, max_size=6,
                                    unique=True))
def test_custom_kernel_source_and_compile(name, names):
    """A hand-built custom kernel (a tiled matmul) whose every name is hostile."""
    a_name, b_name, kname, acc, tensor, out = names

    def built(title: str):
        mg = em.MuGraph(title)
        mg.input(a_name, (32, 48), "float32")
        mg.input(b_name, (48, 24), "float32")
        k = mg.custom_kernel(grid=(2, 2), forloop=3, name=kname)
        a = k.input(a_name, imap={0: 0}, fmap=1)
        b = k.input(b_name, imap={1: 1}, fmap=0)
        k.output(k.accumulate(a @ b, acc), tensor, omap={0: 0, 1: 1})
        mg.output(tensor, out)
        return compile_mugraph(mg)

    fn = built(name)
    check_source(fn.source, [name, *names], built("g").source)
    x, y = torch.randn(32, 48), torch.randn(48, 24)
    np.testing.assert_allclose(fn(x, y)[out].numpy(), (x @ y).numpy(), rtol=1e-4, atol=1e-4)
    assert MARK not in os.environ


@pytest.mark.parametrize("name, dim", [(EXPLOIT, "L"), ("a\nb'\"", "seq_len"), ("x", "é")])
def test_family_module(name, dim):
    size = em.Dim(dim, hint=64, min=1, max=256)
    g = em.Graph(name)
    x = g.input("torch", (4, size), dtype="float32")
    g.output(em.exp(x) * 2.0, "tl")
    res = em.optimize(g, level="kernel", cache=False)
    check_source(res.triton_source(), [name, dim])
    fn = res.compile()
    t = torch.randn(4, 37)
    np.testing.assert_allclose(fn(t)["tl"].numpy(), (torch.exp(t) * 2).numpy(), rtol=1e-5)
    assert MARK not in os.environ


def test_cli_emit(tmp_path, capsys):
    from eqsat_mirage.cli.main import main

    prog = tmp_path / "prog.py"
    prog.write_text("import eqsat_mirage as em\n"
                    f"g = em.Graph({EXPLOIT!r})\n"
                    "x = g.input('run', (4, 8), dtype='float32')\n"
                    "g.output(em.exp(x), 'torch')\n"
                    "program = g\n")
    out = tmp_path / "out.py"
    assert main(["optimize", str(prog), "--emit", str(out), "--no-cache"]) in (0, 1)
    check_source(out.read_text(), [EXPLOIT])


@pytest.mark.parametrize("name", [EXPLOIT, "</text><script>alert(1)</script>", "a\x00&<>'\"",
                                  "$x^2$ \\frac", "é" * 300])
def test_render_svg_is_well_formed(tmp_path, name):
    g = small_graph(name, "x", "w", "y")
    from eqsat_mirage.render.draw import render

    path = render(g, tmp_path / "g.svg", backend="matplotlib")
    root = ET.fromstring(path.read_bytes())  # well-formed XML: every label escaped
    assert not [e for e in root.iter() if e.tag.endswith("script")]


@pytest.mark.parametrize("where, value", [
    ("name", 'k0"""\nimport os'), ("output", "y\n#"), ("graph_output", "y'''")])
def test_cached_or_json_mugraph_with_hostile_names_is_refused(where, value):
    from eqsat_mirage.mugraph.program import from_graph

    data = json.loads(from_graph(small_graph("g", "x", "w", "y")).to_json())
    kernel = data["kernels"][-1]
    if where == "name":
        kernel["name"] = value
    elif where == "output":
        data["outputs"] = {value: data["outputs"]["y"]}
    else:
        kernel["graph"]["outputs"] = {value: 0}
    with pytest.raises(MuGraphError, match="must be a Python identifier"):
        em.MuGraph.from_dict(data).validate()


@pytest.mark.parametrize("name", ["a b", "if", "a\nb", 'o"""', 3])
def test_non_identifier_output_names_are_refused(name):
    g = em.Graph("g")
    x = g.input("x", (4,), dtype="float32")
    with pytest.raises(em.GraphError, match="must be a Python identifier"):
        g.output(em.exp(x), name)


def test_graph_name_must_be_text():
    with pytest.raises(em.GraphError, match="must be a string"):
        em.Graph(3)


# the parameters of every call between the user and the kernels: the generated run(*args,
# **kwargs), its checked, CUDA-graph and shape-family wrappers (self), and _bind/_check's
CALL_NAMES = ["self", "args", "kwargs", "run", "entry", "tensors", "device", "given", "key",
              "names", "check", "cuda_graph"]


@pytest.mark.parametrize("x", CALL_NAMES)
@pytest.mark.parametrize("how", [dict(check=True), dict(check=False), dict(cuda_graph=True),
                                 dict(reuse_outputs=True)], ids=str)
def test_a_call_parameter_is_an_input_name(x, how):
    """Issue 51: an input named ``self`` (or as any parameter of the calls between the user
    and the kernels) is given by name like any other input."""
    res = em.optimize(small_graph("g", x, "w_in", "out"), level="kernel", cache=False,
                      compile_check=False)
    fn = res.compile(**how)
    a, b = torch.randn(4, 8), torch.randn(8, 8)
    want = (torch.exp(a @ b) * 2.0).numpy()
    for got in (fn(a, b), fn(**{x: a, "w_in": b}), fn({x: a, "w_in": b}),
                fn(a, w_in=b), fn(w_in=b, **{x: a})):
        np.testing.assert_allclose(got["out"].numpy(), want, rtol=1e-5)


def test_a_family_input_named_self_is_given_by_name():
    size = em.Dim("L", hint=64, min=1, max=256)
    g = em.Graph("fam")
    x = g.input("self", (4, size), dtype="float32")
    g.output(em.exp(x) * 2.0, "y")
    fn = em.optimize(g, level="kernel", cache=False, compile_check=False).compile()
    t = torch.randn(4, 37)
    for got in (fn(self=t), fn({"self": t}), fn(t)):
        np.testing.assert_allclose(got["y"].numpy(), (torch.exp(t) * 2).numpy(), rtol=1e-5)


@pytest.mark.parametrize("x", ["class", "None", "lambda", "def", "import", "nonlocal", "yield",
                               "await", "True", "if"])
def test_a_python_keyword_is_an_input_name(x):
    """Issue 51: every Python keyword is an input name (a torch module's buffer or argument
    may be called so), end to end: evaluate, verify, optimize, the source, the compiled call
    by position and by name with its first-launch check, and the results cache round trip.
    The keyword reaches generated code only mangled (``v_class``) or as a string literal: a
    keyword used as an identifier would not parse."""
    from eqsat_mirage.pipeline.result import from_data, to_data

    g = small_graph("g", x, "w_in", "out")
    a, b = torch.randn(4, 8), torch.randn(8, 8)
    want = (torch.exp(a @ b) * 2.0).numpy()
    got = em.evaluate(g, {x: a.numpy(), "w_in": b.numpy()})["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert em.verify(g, g).equivalent
    res = em.optimize(g, level="mugraph", cache=False, compile_check=False)
    src = res.triton_source()
    check_source(src, [])
    assert repr(x) in src or f'"{x}"' in src  # the name itself only as a string literal
    again = from_data(json.loads(json.dumps(to_data(res))), g)
    for fn in (res.compile(), res.compile(check=False), again.compile()):
        check_source(fn.source, [])
        for out in (fn(a, b), fn(**{x: a, "w_in": b}), fn({x: a, "w_in": b}),
                    fn(a, w_in=b)):
            np.testing.assert_allclose(out["out"].numpy(), want, rtol=1e-5)
    assert MARK not in os.environ


@pytest.mark.parametrize("name", ["", 3, None, "a b", "1x", "a\nb", "a\x00b", "x\x1b", "é\t"])
def test_a_mugraph_name_must_still_be_an_identifier(name):
    """Issue 51 lets keywords in; any other text that is not an identifier stays out."""
    with pytest.raises(MuGraphError, match="must be a Python identifier"):
        em.MuGraph("m").input(name, (4,), "float32")
