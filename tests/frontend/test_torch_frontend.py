"""em.from_torch: torch functions and nn.Modules traced with torch.fx into em.Graphs."""

import inspect
import subprocess
import sys

import numpy as np
import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")
from torch_models import Attention, GatedMLP, LoRALinear  # noqa: E402

nn = torch.nn
F = torch.nn.functional

from eqsat_mirage.frontend.from_torch import graph_inputs, source_line  # noqa: E402


def _inputs(shapes, positive=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if positive:
        return [torch.rand(s, generator=gen) + 0.5 for s in shapes]
    return [torch.randn(s, generator=gen) for s in shapes]


def _check(fn, *xs, rtol=1e-5, atol=1e-6):
    """from_torch(fn) evaluated by em.evaluate equals fn(*xs); returns the graph."""
    g = em.from_torch(fn, *xs)
    feed = {k: v.detach().double().numpy() for k, v in graph_inputs(g, fn, *xs).items()}
    got = em.evaluate(g, feed)
    with torch.no_grad():
        want = fn(*xs)
    leaves = torch.utils._pytree.tree_leaves(want)  # in the order of the graph's outputs
    assert len(leaves) == len(got) and list(got) == list(g.outputs)
    for k, w in zip(got, leaves):
        np.testing.assert_allclose(got[k], w.double().numpy(), rtol=rtol, atol=atol, err_msg=k)
    return g


S2, S3 = (3, 4), (2, 3, 4)
OPS = {
    "matmul": (lambda a, b: torch.matmul(a, b), [(3, 4), (4, 5)], False),
    "at": (lambda a, b: a @ b, [(2, 3, 4), (4, 5)], False),
    "bmm": (lambda a, b: torch.bmm(a, b), [(2, 3, 4), (2, 4, 5)], False),
    "mm_method": (lambda a, b: a.mm(b), [(3, 4), (4, 2)], False),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(3, 4), (5, 4), (5,)], False),
    "linear_nobias": (lambda x, w: F.linear(x, w), [(2, 3, 4), (5, 4)], False),
    "add": (lambda a, b: a + b, [S2, (4,)], False),
    "add_scalar": (lambda a: a + 2.5, [S2], False),
    "radd_scalar": (lambda a: 2 + a, [S2], False),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=2.0), [S2, S2], False),
    "sub": (lambda a, b: a - b, [S2, S2], False),
    "rsub_scalar": (lambda a: 1.0 - a, [S2], False),
    "sub_method": (lambda a, b: a.sub(b), [S2, S2], False),
    "mul": (lambda a, b: a * b, [S3, S2], False),
    "mul_scalar": (lambda a: torch.mul(a, 3.0), [S2], False),
    "div": (lambda a, b: a / b, [S2, S2], True),
    "div_scalar": (lambda a: a / 4, [S2], False),
    "rdiv_scalar": (lambda a: 1.0 / a, [S2], True),
    "div_method": (lambda a, b: a.div(b), [S2, S2], True),
    "exp": (lambda a: torch.exp(a), [S2], False),
    "exp_method": (lambda a: a.exp(), [S2], False),
    "sum_dim": (lambda a: a.sum(-1), [S3], False),
    "sum_all": (lambda a: torch.sum(a), [S3], False),
    "sum_keepdim": (lambda a: a.sum(dim=(0, 2), keepdim=True), [S3], False),
    "mean": (lambda a: a.mean(dim=-1, keepdim=True), [S3], False),
    "mean_all": (lambda a: torch.mean(a), [S2], False),
    "pow2": (lambda a: a ** 2, [S2], False),
    "pow2_fn": (lambda a: torch.pow(a, 2), [S2], False),
    "pow_half": (lambda a: a.pow(0.5), [S2], True),
    "sqrt": (lambda a: torch.sqrt(a), [S2], True),
    "rsqrt": (lambda a: a.rsqrt(), [S2], True),
    "silu": (lambda a: F.silu(a), [S2], False),
    "relu": (lambda a: F.relu(a), [S2], False),
    "relu_torch": (lambda a: torch.relu(a) + a.relu(), [S2], False),
    "softmax": (lambda a: torch.softmax(a, dim=-1), [S3], False),
    "softmax_F": (lambda a: F.softmax(a, dim=1), [S3], False),
    "softmax_method": (lambda a: a.softmax(0), [S2], False),
    "cat": (lambda a, b: torch.cat([a, b], dim=1), [S2, (3, 2)], False),
    "transpose": (lambda a: a.transpose(0, 2), [S3], False),
    "transpose_fn": (lambda a: torch.transpose(a, -1, -2), [S3], False),
    "permute": (lambda a: a.permute(2, 0, 1), [S3], False),
    "T": (lambda a: a.T, [S2], False),
    "mT": (lambda a: a.mT, [S3], False),
    "t": (lambda a: a.t(), [S2], False),
    "neg": (lambda a: -a, [S2], False),
    "neg_fn": (lambda a: torch.neg(a), [S2], False),
    "reshape": (lambda a: a.reshape(4, -1), [S3], False),
    "view": (lambda a: a.view(6, 4), [S3], False),
    "reshape_fn": (lambda a: torch.reshape(a, (2, 12)), [S3], False),
    "flatten": (lambda a: a.flatten(1), [S3], False),
    "unsqueeze": (lambda a: a.unsqueeze(1) + 1.0, [S2], False),
    "contiguous": (lambda a: a.transpose(0, 1).contiguous() * 2, [S2], False),
    "shape_arith": (lambda a: a * a.shape[-1] ** -0.5, [S3], False),
    "rms_norm": (lambda a, w: F.rms_norm(a, (4,), w, eps=1e-6), [S3, (4,)], False),
    # issue 15: what Hugging Face's LLaMA and GPT-2 layers use
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (4,), w, b, eps=1e-5), [S3, (4,), (4,)],
                   False),
    "gelu_erf": (lambda a: F.gelu(a), [S3], False),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), [S3], False),
    "gelu_new": (lambda a: 0.5 * a * (1.0 + torch.tanh(0.7978845608 * (
        a + 0.044715 * torch.pow(a, 3.0)))), [S3], False),
    "tanh_erf": (lambda a: a.tanh() + torch.erf(a), [S2], False),
    "pow4": (lambda a: a ** 4, [S2], False),
    "to_float": (lambda a: a.to(torch.float32) * 2 + a.float() + a.type(torch.float32), [S2],
                 False),
    "softmax_dtype": (lambda a: F.softmax(a, dim=-1, dtype=torch.float32), [S3], False),
    "addmm": (lambda b, x, w: torch.addmm(b, x, w), [(5,), (3, 4), (4, 5)], False),
    "slice_last": (lambda a: a[..., :2] * a[..., 2:], [S3], False),
    "slice_none": (lambda a: a[:, None, 1:3] + 1.0, [S2], False),
    "rotate_half": (lambda a: torch.cat((-a[..., 2:], a[..., :2]), dim=-1) * a, [S3], False),
    "narrow": (lambda a: a.narrow(1, 1, 2) * 2, [S3], False),
    "chunk": (lambda a: a.chunk(2, dim=-1)[1] - a.chunk(2, dim=-1)[0], [S3], False),
    "split": (lambda a: torch.split(a, [1, 3], dim=-1)[1] * 3, [S3], False),
    "split_size": (lambda a: a.split(2, dim=-1)[0] * a.split(2, dim=-1)[1], [S3], False),
    "repeat_kv": (lambda a: a[:, :, None, :].expand(2, 3, 2, 4).reshape(2, 6, 4), [S3], False),
    "sdpa_gqa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=True),
                 [(1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)], False),
}


@pytest.mark.parametrize("name", list(OPS))
def test_each_supported_op_matches_torch(name):
    fn, shapes, positive = OPS[name]
    _check(fn, *_inputs(shapes, positive))


def test_softmax_is_max_subtracted_and_finite_where_torch_is():
    g = em.from_torch(lambda x: torch.softmax(x, dim=-1), torch.randn(2, 3))
    ops = [n.op for n in g.nodes()]
    assert ops.count(em.Op.MAX) == 1 and em.Op.SUB in ops and em.Op.EXP in ops
    x = torch.tensor([[30.0, 11.5, -4.0], [0.0, 12.0, 11.9]], dtype=torch.float16)
    g16 = em.from_torch(lambda x: torch.softmax(x, dim=-1), x)
    got = em.evaluate(g16, {"x": x.numpy()}, dtype="native")["out"]
    want = torch.softmax(x.float(), dim=-1).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=2e-3)


def test_amax_converts():
    x = torch.randn(3, 5)
    _check(lambda a: torch.amax(a, dim=1, keepdim=True) + a.amax(dim=0), x)


def gqa(Q, K, V):  # noqa: N803 - DESIGN.md's names
    A = torch.exp(Q @ K)  # noqa: N806
    return (A / A.sum(dim=2, keepdim=True)) @ V


def test_gqa_of_design_md():
    q, k, v = (t * 0.3 for t in _inputs([(2, 8, 4), (2, 4, 16), (2, 16, 4)]))
    g = _check(gqa, q, k, v, rtol=1e-4)
    assert g.name == "gqa" and list(g.inputs) == ["Q", "K", "V"]
    assert [n.op for n in g.nodes() if n.op is not em.Op.INPUT] == [
        em.Op.MATMUL, em.Op.EXP, em.Op.SUM, em.Op.DIV, em.Op.MATMUL]
    # same shapes and dtype as DESIGN.md's hand-built graph (small sizes), float16 included
    h = em.from_torch(gqa, q.half(), k.half(), v.half(), name="gqa16")
    assert h.name == "gqa16" and {n.dtype for n in h.inputs.values()} == {"float16"}
    assert h.outputs["out"].shape == (2, 8, 4) and h.outputs["out"].dtype == "float16"




@pytest.mark.parametrize("cls", [Attention, GatedMLP, LoRALinear])
def test_module_blocks(cls):
    torch.manual_seed(0)
    m = cls().eval()
    g = _check(m, torch.randn(2, 4, 8), rtol=1e-4, atol=1e-5)
    assert "x" in g.inputs and g.torch_sources["x"] == ("arg", 0)


def test_parameters_become_named_inputs():
    m = LoRALinear()
    g = em.from_torch(m, torch.randn(3, 8))
    params = {v[1]: k for k, v in g.torch_sources.items() if v[0] == "param"}
    assert params == {"base.weight": "base_weight", "base.bias": "base_bias",
                      "lora_a.weight": "lora_a_weight", "lora_b.weight": "lora_b_weight"}
    assert g.inputs["base_weight"].shape == (12, 8)
    feed = graph_inputs(g, m, torch.ones(3, 8))
    assert feed["lora_b_weight"] is m.lora_b.weight


def test_get_attr_parameter_and_buffer():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.rand(4) + 0.5)
            self.register_buffer("shift", torch.randn(4))

        def forward(self, x):
            return x * self.w + self.shift

    g = _check(Scale(), torch.randn(3, 4))
    assert {g.torch_sources[n] for n in ("w", "shift")} == {("param", "w"), ("param", "shift")}


def test_tuple_and_dict_outputs():
    g = _check(lambda a, b: (a @ b, torch.exp(a)), *_inputs([S2, (4, 2)]))
    assert list(g.outputs) == ["out0", "out1"]
    g = em.from_torch(lambda a: {"y": a * 2, "z": a.sum(-1)}, torch.randn(S2))
    assert list(g.outputs) == ["y", "z"]


def _sorting(x):
    y = x.exp()
    return torch.sort(y, dim=-1).values


def test_unsupported_op_names_op_file_and_line():
    line = inspect.getsourcelines(_sorting)[1] + 2
    with pytest.raises(em.UnsupportedOpError) as err:
        em.from_torch(_sorting, torch.randn(3, 4))
    msg = str(err.value)
    assert "torch.sort" in msg and f"test_torch_frontend.py:{line}" in msg
    assert "torch.sort(y, dim=-1)" in msg and isinstance(err.value, em.MirageError)


def test_layer_norm_and_gelu_modules():
    mod = nn.Sequential(nn.LayerNorm(8), nn.GELU(approximate="tanh"), nn.Linear(8, 4),
                        nn.GELU(), nn.Tanh())
    nn.init.normal_(mod[0].weight)
    nn.init.normal_(mod[0].bias)
    g = _check(mod, torch.randn(3, 8))
    ops = {n.op for n in g.nodes()}
    assert {em.Op.TANH, em.Op.ERF, em.Op.MEAN, em.Op.RSQRT} <= ops


def test_half_casts_round_like_torch():
    """HF's RMSNorm: upcast to fp32, normalize, cast back to the input's dtype."""
    def rms(x, w):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)

    x, w = torch.randn(4, 16, dtype=torch.float16), torch.randn(16, dtype=torch.float16)
    g = em.from_torch(rms, x, w)
    casts = [n for n in g.nodes() if n.op is em.Op.CAST]
    assert [c.arg for c in casts] == ["float32", "float16"]
    assert g.outputs["out"].dtype == "float16"
    got = em.evaluate(g, {"x": x.numpy(), "w": w.numpy()}, dtype="native")["out"]
    np.testing.assert_array_equal(got, rms(x, w).double().numpy())  # the same roundings


class _Mish(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.Mish()

    def forward(self, x):
        return self.act(x) * 2


def test_unsupported_module_and_arguments():
    with pytest.raises(em.UnsupportedOpError, match=r"nn\.Mish \(module 'act'\)") as err:
        em.from_torch(_Mish(), torch.randn(2, 2))
    assert f"test_torch_frontend.py:{inspect.getsourcelines(_Mish.forward)[1] + 1}" in str(
        err.value)
    pow5 = r"operator\.pow at test_torch_frontend\.py:\d+.*exponent 5"
    with pytest.raises(em.UnsupportedOpError, match=pow5):
        em.from_torch(lambda x: x ** 5, torch.randn(2, 2))
    with pytest.raises(em.UnsupportedOpError, match="Tensor.double"):
        em.from_torch(lambda x: x.double() + 1, torch.randn(2, 2))
    with pytest.raises(em.UnsupportedOpError, match="indexing"):
        em.from_torch(lambda x: x[[0, 1], [1, 0]] + 1, torch.randn(2, 2))


def test_size_arithmetic_and_keyword_inputs():
    """math.sqrt(q.size(-1)) and x.shape[-1] // 2 fold in Python; inputs may be keywords."""
    import math

    def att(q, k, scale=None):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        return torch.softmax(s[..., : s.shape[-1] // 2], -1)

    q, k = torch.randn(4, 8), torch.randn(6, 8)
    g = em.from_torch(att, q, k=k)
    assert g.torch_sources == {"q": ("arg", 0), "k": ("kwarg", "k")}
    feed = {n: t.double().numpy() for n, t in graph_inputs(g, att, q, k=k).items()}
    np.testing.assert_allclose(em.evaluate(g, feed)["out"], att(q, k).double().numpy(),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(em.GraphError, match=r"unknown or repeated: v"):
        em.from_torch(att, q, k=k, v=k)


def test_concrete_size_constructor_says_what_to_do():
    def ones(x):
        n = x.shape[0]
        return x * torch.ones(n, n)

    with pytest.raises(em.UnsupportedOpError) as err:
        em.from_torch(ones, torch.randn(4, 4))
    text = str(err.value)
    assert "test_torch_frontend.py" in text and "torch.ones(n, n)" in text
    assert "torch.compile(fn, backend=em.backend)" in text


def test_untraceable_control_flow():
    def branchy(x):
        return x * 2 if x.sum() > 0 else x

    with pytest.raises(em.UnsupportedOpError, match="cannot trace 'branchy'"):
        em.from_torch(branchy, torch.randn(2))


@pytest.mark.parametrize("dtype", ["float64", "int16"])
def test_bad_dtype(dtype):
    x = torch.ones(2, 3, dtype=getattr(torch, dtype))
    with pytest.raises(em.DTypeError, match=rf"input 'Q'.*{dtype}.*float16, bfloat16, float32"):
        em.from_torch(gqa, x, torch.ones(3, 2), torch.ones(2, 2))


def test_int8_weights_in_arithmetic_name_the_op():
    """A uint8 input is an integer value tensor (issue 53): it is cast to a float dtype
    before any arithmetic, and a matmul of it is refused where it is written."""
    x = torch.ones(2, 3, dtype=torch.uint8)
    with pytest.raises(em.DTypeError, match=r"matmul of input 'Q'.*a uint8 tensor .*can only "
                                            r"be cast.*converting operator.matmul"):
        em.from_torch(gqa, x, torch.ones(3, 2), torch.ones(2, 2))


def test_integer_tensor_in_arithmetic_names_the_op():
    """An int32 input is an index tensor (issue 52): a matmul of it is refused where it is
    written, naming the op and its source line."""
    x = torch.ones(2, 3, dtype=torch.int32)
    with pytest.raises(em.DTypeError, match=r"matmul of input 'Q'.*integer index tensor.*"
                                            r"converting operator.matmul"):
        em.from_torch(gqa, x, torch.ones(3, 2), torch.ones(2, 2))


def test_wrong_number_of_inputs():
    with pytest.raises(em.GraphError, match=r"1 positional and 0 keyword example input\(s\) "
                       r"for 3 argument\(s\) \(Q, K, V\)"):
        em.from_torch(gqa, torch.ones(2, 2))


def test_shape_error_names_torch_source():
    with pytest.raises(em.ShapeError, match=r"operator\.matmul at test_torch_frontend\.py"):
        em.from_torch(lambda a, b: a @ b, torch.ones(2, 3), torch.ones(2, 3))


def test_source_line_fallback_without_stack_trace():
    gm = torch.fx.symbolic_trace(_sorting)  # plain fx records no stack traces for functions
    node = next(n for n in gm.graph.nodes if n.target is torch.sort)
    assert not node.meta.get("stack_trace")
    line = inspect.getsourcelines(_sorting)[1] + 2
    assert source_line(node, _sorting).startswith(f"test_torch_frontend.py:{line}")


def test_import_does_not_load_torch():
    """Importing eqsat_mirage leaves torch unloaded; the first use of em.from_torch loads it."""
    code = ("import sys, eqsat_mirage as em; print('torch' in sys.modules); "
            "print('from_torch' in em.__all__ and 'backend' in em.__all__); "
            "em.from_torch; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"], done.stdout + done.stderr


def test_sequential_of_supported_modules():
    torch.manual_seed(0)
    m = nn.Sequential(nn.RMSNorm(4), nn.Linear(4, 6), nn.ReLU(), nn.Softmax(dim=-1),
                      nn.Dropout(0.1), nn.Identity()).eval()
    g = _check(m, torch.randn(2, 3, 4))
    assert {"t_0_weight", "t_1_weight", "t_1_bias"} <= set(g.inputs)  # "0.weight" -> identifier
    with pytest.raises(em.UnsupportedOpError, match=r"training mode \(call \.eval\(\)\)"):
        em.from_torch(m.train(), torch.randn(2, 3, 4))


def test_nested_outputs_and_casts():
    g = _check(lambda x: ((x.sum(1, keepdim=True), x.view(-1)), x.squeeze()),
               torch.randn(2, 1, 4))
    assert list(g.outputs) == ["out0_0", "out0_1", "out1"]
    with pytest.raises(em.UnsupportedOpError, match=r"sum with dtype=torch\.float64"):
        em.from_torch(lambda x: x.sum(dtype=torch.float64), torch.randn(2))


def test_an_empty_slice_flows_into_a_cat_and_is_dropped():
    """A zero-size slice (a full rotary embedding's pass-through half) is legal in torch: it
    flows into torch.cat, which drops it; reading it any other way is refused clearly."""
    def rotary(q):
        rot, rest = q[..., :8], q[..., 8:]
        return torch.cat([rot * 2.0, rest], dim=-1)

    g = _check(rotary, torch.randn(2, 3, 8))
    assert not any(n.op.name == "CONCAT" for n in g.nodes())
    with pytest.raises(em.UnsupportedOpError, match="Empty"):
        em.from_torch(lambda q: q[..., 8:] * 2.0, torch.randn(2, 8))


def test_sdpa_with_a_bool_mask_gives_0_on_a_fully_masked_row_as_eager():
    """Eager SDPA gives 0 where a bool attn_mask keeps no key of a row (softmax over -inf
    alone would be NaN): masked scores take the dtype's lowest value and the output is
    multiplied by whether the row keeps anything."""
    torch.manual_seed(0)
    q, k, v = _inputs([(1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8)])
    mask = torch.rand(1, 2, 4, 6) < 0.6
    mask[..., 0] = True
    mask[0, 1, 2, :] = False  # fully masked rows
    mask[0, 0, 3, :] = False

    def attn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    g = em.from_torch(attn, q, k, v, mask)
    feed = {n: t.double().numpy() if t.dtype != torch.bool else t.numpy()
            for n, t in zip(g.inputs, (q, k, v, mask))}
    want = attn(q.double(), k.double(), v.double(), mask)
    assert (want[0, 1, 2] == 0).all() and torch.isfinite(want).all()
    got = em.evaluate(g, feed)["out"]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
    assert not any(n.op is em.Op.MASK for n in g.nodes())  # a finite fill: no -inf


def test_sdpa_with_a_float_additive_mask():
    """A float attn_mask is added to the scores before the max-subtracted softmax (BERT's
    padding mask through SDPA), a row masked with finfo.min everywhere as torch gives it."""
    mask = torch.zeros(2, 1, 4, 6)
    mask[1, :, :, 3:] = torch.finfo(torch.float32).min
    mask[0, :, 2, :] = torch.finfo(torch.float32).min  # a fully masked row: uniform, as torch

    def attn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    g = _check(attn, *_inputs([(2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8)]), mask, rtol=1e-5,
               atol=1e-5)
    assert any(n.op.name == "ADD" for n in g.nodes())
