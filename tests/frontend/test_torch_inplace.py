"""``em.from_torch`` of functions and modules that update tensors in place (issue 52): an
update of a tensor the function computed is traced as its functional form; one of an
input, a parameter, a buffer or a view of one raises ``UnsupportedOpError`` naming the
write's line. And the places named in errors and IR nodes are the traced op's own line
(``ir.node.located``), the innermost frame outside torch of a node's stack trace."""

import inspect
import os

import numpy as np
import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")

from torch import fx, nn  # noqa: E402

from eqsat_mirage.frontend.from_torch import graph_inputs, source_line  # noqa: E402


def _updates(x, y, m):
    z = torch.exp(x) * 2.0
    z.add_(y, alpha=0.5)
    z.sub_(1.0)
    z.mul_(y)
    z.div_(3.0)
    z.masked_fill_(m, 0.25)
    w = torch.tanh(y)
    w.copy_(z[0])  # broadcast along the first axis
    return z + w


class _Module(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, x):
        h = self.proj(x)
        h.mul_(self.scale)
        h.add_(x)
        return h


def test_updates_of_computed_tensors_are_functional():
    x, y, m = torch.randn(4, 8), torch.randn(4, 8), torch.rand(4, 8) > 0.5
    g = em.from_torch(_updates, x, y, m)
    assert list(g.inputs) == ["x", "y", "m"]
    feed = {k: v.detach().numpy() for k, v in graph_inputs(g, _updates, x, y, m).items()}
    np.testing.assert_allclose(em.evaluate(g, feed)["out"], _updates(x, y, m).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_module_updates_are_functional():
    mod, x = _Module(), torch.randn(2, 8)
    g = em.from_torch(mod, x)
    feed = {k: v.detach().numpy() for k, v in graph_inputs(g, mod, x).items()}
    with torch.no_grad():
        want = mod(x).numpy()
    np.testing.assert_allclose(em.evaluate(g, feed)["out"], want, rtol=1e-5, atol=1e-6)


def _into_input(x):
    y = x * 2.0
    x.mul_(3.0)
    return x + y


class _IntoBufferView(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x):
        self.seen[:4].add_(1.0)
        return x + self.seen


@pytest.mark.parametrize("fn,why", [(_into_input, "the graph input 'x'"),
                                    (_IntoBufferView(), "a view of the parameter or buffer "
                                                        "'seen'")])
def test_writes_into_inputs_and_buffers_are_refused(fn, why):
    src = fn.forward if isinstance(fn, nn.Module) else fn
    line = inspect.getsourcelines(src)[1] + (2 if src is _into_input else 1)
    with pytest.raises(em.UnsupportedOpError) as err:
        em.from_torch(fn, torch.randn(4, 8))
    msg = str(err.value)
    assert f"test_torch_inplace.py:{line}" in msg and "mutates a tensor in place" in msg, msg
    assert why in msg, msg


def test_a_traced_graph_module_is_left_unchanged():
    gm = fx.symbolic_trace(_updates)
    before = str(gm.graph)
    x, y, m = torch.randn(4, 8), torch.randn(4, 8), torch.rand(4, 8) > 0.5
    em.from_torch(gm, x, y, m)
    assert str(gm.graph) == before


def _bad_axis(x):
    e = torch.exp(x)
    return e.sum(dim=5)


def test_errors_and_nodes_name_the_ops_own_line():
    """A conversion error names the line of the op (and of its operand), not the line that
    called from_torch."""
    first = inspect.getsourcelines(_bad_axis)[1]
    with pytest.raises(em.ShapeError) as err:
        em.from_torch(_bad_axis, torch.randn(4, 8))
    msg = str(err.value)
    assert f"sum (at test_torch_inplace.py:{first + 2})" in msg, msg
    assert f"exp (at test_torch_inplace.py:{first + 1})" in msg, msg
    g = em.from_torch(_updates, torch.randn(4, 8), torch.randn(4, 8), torch.rand(4, 8) > 0.5)
    last = inspect.getsourcelines(_updates)[1] + 9  # return z + w
    assert g.outputs["out"].loc == f"test_torch_inplace.py:{last}"


def test_source_line_skips_torch_frames():
    """A node whose stack trace ends inside torch (an op of an inlined nn.Module's forward,
    or torch.fx's partitioner) is placed at the innermost frame outside torch."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(torch.exp, (x,))
    torch_file = os.path.join(os.path.dirname(torch.__file__), "fx", "passes", "infra",
                              "partitioner.py")
    here = inspect.getsourcefile(test_source_line_skips_torch_frames)
    line = inspect.currentframe().f_lineno
    node.meta["stack_trace"] = (f'  File "{here}", line {line}, in test\n    x\n'
                                f'  File "{torch_file}", line 88, in _is_node_supported\n'
                                "    return self.operator_support.is_node_supported(\n")
    assert source_line(node).startswith(f"test_torch_inplace.py:{line} ")
    node.meta["stack_trace"] = f'  File "{torch_file}", line 88, in f\n    x\n'
    assert source_line(node).startswith("partitioner.py:88")  # no frame outside torch
